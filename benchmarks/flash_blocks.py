"""Blocks chosen from the shapes (mha.attention.flash.choose_blocks) against torch's default CPU SDPA, one run.

    python benchmarks/flash_blocks.py           # T = 2048, 11 rounds (about 2 minutes on 2 cores)
    python benchmarks/flash_blocks.py --quick   # T = 256, 3 rounds, for a smoke run

B=1, h=8, d_k=64, float32, not causal and causal. Every round calls every function once, in an
order rotated from round to round, so a burst of load from another process hits all of them
alike; each ratio is taken against SDPA's time in the same round, and the table gives min /
median / max over the rounds. Rows: SDPA, flash_attention with its default (chosen) blocks, the
old default 64 x 64, and the blocks choose_blocks picks for other budgets (the basis for
TILE_BUDGET_BYTES). Goal (never asserted): the default within 1.2x of SDPA at T = 2048.
Writes benchmarks/results/flash_blocks.md.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from mha.attention import flash
from mha.perf import bench

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
B, H, D_K = 1, 8, 64
BUDGETS_MIB = (0.25, 0.5, 1, 2, 4, 8, 16)  # choose_blocks' budget; the default is TILE_BUDGET_BYTES


def candidates(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> dict[str, tuple]:
    """Name -> (call, blocks, heads per step): SDPA, the default, 64 x 64, other budgets."""
    T, S, size = q.shape[2], k.shape[2], q.dtype.itemsize
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))

    def tiled(budget: int) -> tuple:
        blocks = flash.choose_blocks(T, S, D_K, size, budget)
        g = flash._heads_per_step(H, *blocks, D_K, size, budget)

        def call() -> object:
            return flash.flash_attention(q, k, v, causal=causal, budget=budget)
        return call, blocks, g

    default = flash.TILE_BUDGET_BYTES
    fns = {"SDPA (torch default)": (lambda: torch.nn.functional.scaled_dot_product_attention(
               qt, kt, vt, is_causal=causal), None, None),
           f"tiled, default budget {default / 2**20:g} MiB": tiled(default),
           "tiled, 64 x 64 (the old default)": (lambda: flash.flash_attention(
               q, k, v, causal=causal, block_q=64, block_k=64), (64, 64),
               flash._heads_per_step(H, 64, 64, D_K, size))}
    for mib in BUDGETS_MIB:
        if int(mib * 2**20) != default:
            fns[f"tiled, budget {mib:g} MiB"] = tiled(int(mib * 2**20))
    return fns


def rounds(fns: dict[str, Callable], n: int) -> dict[str, np.ndarray]:
    """Seconds of each function in each of n rounds (one warm-up call each first)."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times = {name: np.zeros(n) for name in names}
    for r in range(n):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
            t0 = time.perf_counter()
            fns[name]()
            times[name][r] = time.perf_counter() - t0
    return times


def measure(T: int, causal: bool, n: int) -> list[dict]:
    """One row per candidate: ms and ratio to SDPA (same round), min / median / max."""
    rng = np.random.default_rng(T)
    q, k, v = (rng.normal(size=(B, H, T, D_K)).astype(np.float32) for _ in range(3))  # (B,h,T,d_k)
    cands = candidates(q, k, v, causal)
    (sdpa_name, (sdpa, *_)), (_, (tiled, *_)) = list(cands.items())[:2]
    err = float(np.abs(tiled()[0] - sdpa().numpy()).max())  # (B, h, T, d_k): the same answer?
    times = rounds({name: c[0] for name, c in cands.items()}, n)
    return [{"name": name, "blocks": blocks, "heads": g, "ms": 1e3 * times[name],
             "ratio": times[name] / times[sdpa_name], "err": err}
            for name, (_, blocks, g) in cands.items()]


def table(rows: list[dict]) -> list[str]:
    """Markdown rows: blocks, heads per step, ms and ratio to SDPA, min / median / max."""
    lines = ["| path | blocks | heads per step | ms min / median / max | "
             "ratio to SDPA min / median / max |", "|---|---|---|---|---|"]
    for r in rows:
        ms, ra = r["ms"], r["ratio"]
        blocks = "-" if r["blocks"] is None else f"{r['blocks'][0]} x {r['blocks'][1]}"
        lines.append(f"| {r['name']} | {blocks} | {'-' if r['heads'] is None else r['heads']} | "
                     f"{ms.min():.1f} / {np.median(ms):.1f} / {ms.max():.1f} | "
                     f"{ra.min():.2f} / {np.median(ra):.2f} / {ra.max():.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure both cases and write the markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="T = 256, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 11, quick 3)")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS, help="where the results go")
    args = ap.parse_args(argv)
    T = 256 if args.quick else 2048
    n = args.rounds or (3 if args.quick else 11)
    lines = ["# flash_attention's chosen blocks against torch's default CPU SDPA, one run", "",
             f"Machine: {bench.machine_line()}.", "",
             f"B={B}, h={H}, T=S={T}, d_k={D_K}, float32; {n} rounds, each function once per round "
             "(order rotated); ratios against SDPA in the same round. Each budget row passes "
             "`budget=` to flash_attention, which picks its blocks and heads per step for it; "
             "the default row is the value flash.py ships with."]
    verdicts = []
    for causal in (False, True):
        rows = measure(T, causal, n)
        med = float(np.median(rows[1]["ratio"]))
        verdicts.append(f"{'causal' if causal else 'not causal'}: median {med:.2f}x, "
                        f"{'met' if med <= 1.2 else 'NOT met'}")
        lines += ["", f"## {'Causal' if causal else 'Not causal'}", "", *table(rows), "",
                  f"Default tiled vs SDPA, max |difference|: {rows[0]['err']:.1e}."]
    lines += ["", f"Goal: default blocks within 1.2x of SDPA at T={T}: " + "; ".join(verdicts) + "."]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flash_blocks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
