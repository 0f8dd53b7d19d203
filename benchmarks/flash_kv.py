"""Tiled numpy attention (mha.attention.flash) and KV-cache decoding (mha.inference.kv_cache), measured in one run.

    python benchmarks/flash_kv.py           # the full sweep (a few minutes on 2 cores)
    python benchmarks/flash_kv.py --quick   # small sizes, for a smoke run
    python benchmarks/flash_kv.py --repeats 9 --min-time 1   # more calls per timing

Everything is a ratio within this run, on this machine (issue 9's goals, never asserted). Each
timing interleaves its implementations (one call each per round), keeps min / median / max over
at least --repeats calls and --min-time seconds, and takes ratios from the min (other programs
only ever add time). The machine line, with its load average, goes into the report.
  1. time: tiled numpy vs naive numpy (steps 3-6) vs torch's default CPU SDPA, B=1, h=8,
     d_k=64, float32, not causal; GFLOP/s against a same-run numpy float32 matmul;
  2. peak memory (tracemalloc) of tiled vs naive numpy at the largest T;
  3. decoding N tokens with the KV cache vs recomputing the prefix for every new token.
Writes benchmarks/results/flash_kv.md, .csv and .png.
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys
import time

import matplotlib
import numpy as np
import torch
from tqdm.auto import tqdm

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mha.attention import flash
from mha.inference import kv_cache
from mha.modules.numpy_mha import MultiHeadAttention  # noqa: E402
from mha.perf import bench  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """The machine's ceiling for this run: numpy float32 (n, n) @ (n, n) GFLOP/s (best call)."""
    a = np.random.default_rng(0).normal(size=(n, n)).astype(np.float32)
    t = bench.time_fn(lambda: a @ a, repeats=repeats).min_s
    return 2 * n**3 / t / 1e9


def time_blocks(T: int, repeats: int, min_time: float,
                candidates=((64, 64), (128, 512), (256, 1024), (512, 1024))) -> dict[str, bench.Timing]:
    """Timing of flash_attention per (block_q, block_k) at one T, and with its defaults."""
    q = np.random.default_rng(1).normal(size=(1, 8, T, 64)).astype(np.float32)  # (B, h, T, d_k)
    fns = {f"{bq}x{bk}": (lambda bq=bq, bk=bk: flash.flash_attention(q, q, q, block_q=bq, block_k=bk))
           for bq, bk in candidates}
    fns["default {}x{}".format(*flash.choose_blocks(T, T, 64, 4))] = lambda: flash.flash_attention(q, q, q)
    return bench.time_interleaved(fns, repeats=repeats, min_time_s=min_time)


def time_cores(Ts: list[int], repeats: int, min_time: float) -> list[dict]:
    """Tiled, naive numpy and default SDPA at each T (interleaved): min / median / max, GFLOP/s."""
    rows = []
    for T in tqdm(Ts, desc="time vs T"):
        rng = np.random.default_rng(T)
        q, k, v = (rng.normal(size=(1, 8, T, 64)).astype(np.float32) for _ in range(3))  # (B,h,T,d_k)
        qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
        fns = {"tiled": lambda q=q, k=k, v=v: flash.flash_attention(q, k, v),  # default blocks
               "naive": lambda q=q, k=k, v=v: bench.numpy_core(q, k, v),
               "sdpa": bench.sdpa_timed(qt, kt, vt)}  # SDPA's default choice
        t = bench.time_interleaved(fns, repeats=repeats, min_time_s=min_time)
        flops = bench.attention_flops(1, 8, T, 64)
        row = {"T": T, "repeats": min(r.repeats for r in t.values())}
        for n, r in t.items():
            row.update({f"{n}_min_ms": 1e3 * r.min_s, f"{n}_median_ms": 1e3 * r.median_s,
                        f"{n}_max_ms": 1e3 * r.max_s})
        row.update(tiled_over_sdpa=t["tiled"].min_s / t["sdpa"].min_s,
                   naive_over_sdpa=t["naive"].min_s / t["sdpa"].min_s,
                   tiled_gflops=flops / t["tiled"].min_s / 1e9)
        rows.append(row)
    return rows


def _spread(r: dict, name: str) -> str:
    """'min / median / max' ms of one implementation in one row."""
    return " / ".join(f"{r[f'{name}_{s}_ms']:.1f}" for s in ("min", "median", "max"))


def peak_memory(T: int) -> tuple[int, int]:
    """tracemalloc peak bytes of naive numpy steps 3-6 and of the tiled path at one T."""
    q = np.random.default_rng(2).normal(size=(1, 8, T, 64)).astype(np.float32)  # (B, h, T, d_k)
    naive = bench.numpy_peak_bytes(lambda: bench.numpy_core(q, q, q))
    tiled = bench.numpy_peak_bytes(lambda: flash.flash_attention(q, q, q))  # default blocks
    return naive, tiled


def decoding(n_tokens: int, d_model: int = 512, n_heads: int = 8, samples: int = 12) -> dict:
    """Seconds to decode n_tokens with the cache, and (estimated) by recomputing every prefix.

    The cached run is measured whole. Recomputing is the causal forward on the first t tokens
    for every t = 1..n_tokens; it is timed at `samples` prefix lengths and integrated
    (trapezoid), since running all of it would take far longer than the cache does.
    """
    m = MultiHeadAttention(d_model, n_heads, seed=0, dtype=np.float32)
    x = np.random.default_rng(3).normal(size=(1, n_tokens, d_model)).astype(np.float32)
    cache = kv_cache.KVCache.for_module(m, 1, n_tokens)
    steps_s = []  # seconds of each cached step: the new token attends to t + 1 keys
    for t in tqdm(range(n_tokens), desc="decode with cache", leave=False):
        t0 = time.perf_counter()
        kv_cache.decode_step(m, cache, x[:, t:t + 1])
        steps_s.append(time.perf_counter() - t0)
    cached = float(sum(steps_s))
    lengths = np.unique(np.linspace(1, n_tokens, samples).astype(int))
    per = [bench.time_fn(lambda t=t: m(x[:, :t], causal=True), repeats=2).median_s
           for t in tqdm(lengths, desc="recompute prefixes", leave=False)]
    every = np.interp(np.arange(1, n_tokens + 1), lengths, per)  # seconds for each prefix length
    return {"tokens": n_tokens, "cached_s": cached, "recompute_s": float(every.sum()),
            "lengths": lengths.tolist(), "recompute_per_s": per, "cached_per_s": steps_s,
            "speedup": float(every.sum()) / cached, "per_token_cached_ms": 1e3 * cached / n_tokens,
            "per_token_recompute_at_end_ms": 1e3 * per[-1]}


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements and write the results files."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS, help="where the results go")
    ap.add_argument("--repeats", type=int, default=7, help="at least this many timed calls")
    ap.add_argument("--min-time", type=float, default=0.5, help="and at least this many seconds")
    args = ap.parse_args(argv)
    out = args.out
    Ts = [128, 256] if args.quick else [256, 512, 1024, 2048]
    T_mem = 512 if args.quick else 4096
    n_dec = 64 if args.quick else 1024
    ceiling = matmul_gflops(512 if args.quick else 2048)
    repeats = 3 if args.quick else args.repeats
    min_time = 0.0 if args.quick else args.min_time
    machine = bench.machine_info()  # before the runs: the load average says how quiet it was
    blocks = time_blocks(Ts[-1], repeats, min_time)
    rows = time_cores(Ts, repeats, min_time)
    naive_b, tiled_b = peak_memory(T_mem)
    dec = decoding(n_dec)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "flash_kv.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    last = rows[-1]
    lines = [
        "# Tiled numpy attention and KV-cache decoding, one run", "",
        f"Machine: {bench.machine_line(machine)}; load average {machine['load_1min']} "
        f"(1 min) at the start.", "",
        f"numpy float32 matmul ceiling this run: {ceiling:.0f} GFLOP/s.", "",
        f"## Time, B=1, h=8, d_k=64, float32, not causal (at least {repeats} calls, interleaved)", "",
        "ms per call, min / median / max; the ratios and GFLOP/s use the min (the best call: "
        "other programs only ever add time).", "",
        "| T | tiled ms | naive ms | SDPA ms | tiled / SDPA | naive / SDPA | tiled GFLOP/s |",
        "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['T']} | {_spread(r, 'tiled')} | {_spread(r, 'naive')} | {_spread(r, 'sdpa')} | "
              f"{r['tiled_over_sdpa']:.2f}x | {r['naive_over_sdpa']:.2f}x | {r['tiled_gflops']:.0f} |"
              for r in rows]
    lines += ["", "Blocks: flash_attention's defaults (flash.choose_blocks: "
              + ", ".join(f"T={T} {bq}x{bk}" for T in Ts for bq, bk in [flash.choose_blocks(T, T, 64, 4)])
              + f"). Measured at T={Ts[-1]} this run (ms, min / median / max): "
              + ", ".join(f"{n} {1e3 * t.min_s:.0f} / {1e3 * t.median_s:.0f} / {1e3 * t.max_s:.0f}"
                          for n, t in blocks.items()) + ". Small "
              "blocks pay numpy's per-call overhead many times; large ones spill the (bq, bk) tile "
              "out of cache. benchmarks/flash_blocks.py sweeps the budget behind the defaults.",
              "", f"Goal: tiled within 2x of SDPA at T={last['T']}: "
              f"{last['tiled_over_sdpa']:.2f}x, {'met' if last['tiled_over_sdpa'] <= 2 else 'NOT met'}.",
              "", f"## Peak memory at T={T_mem} (tracemalloc)", "",
              f"naive steps 3-6: {naive_b / 2**20:.1f} MiB; tiled: {tiled_b / 2**20:.1f} MiB; "
              f"ratio {naive_b / tiled_b:.1f}x (goal: tiled at most 1/20 of naive: "
              f"{'met' if tiled_b * 20 <= naive_b else 'NOT met'}).",
              "", f"## Decoding {dec['tokens']} tokens, d_model=512, h=8, float32", "",
              f"with the KV cache: {dec['cached_s']:.2f} s ({dec['per_token_cached_ms']:.2f} ms per token); "
              f"recomputing every prefix: {dec['recompute_s']:.1f} s (estimated from 12 prefix "
              f"lengths; the last prefix alone takes {dec['per_token_recompute_at_end_ms']:.0f} ms); "
              f"speed-up {dec['speedup']:.0f}x (goal: at least 50x: "
              f"{'met' if dec['speedup'] >= 50 else 'NOT met'})."]
    (out / "flash_kv.md").write_text("\n".join(lines) + "\n")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for name in ("tiled", "naive", "sdpa"):
        ax.plot([r["T"] for r in rows], [r[f"{name}_min_ms"] for r in rows], marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="T", ylabel="ms (best call)",
           title="steps 3-6, B=1, h=8, d_k=64, float32")
    ax.legend()
    S = np.arange(1, dec["tokens"] + 1)
    ax2.plot(S, 1e3 * np.asarray(dec["cached_per_s"]), lw=0.8, label="with the KV cache")
    ax2.plot(dec["lengths"], 1e3 * np.asarray(dec["recompute_per_s"]), marker="o",
             label="recomputing the prefix")
    ax2.set(yscale="log", xlabel="tokens so far S", ylabel="ms per new token",
            title="decoding, d_model=512, h=8, float32")
    ax2.legend()
    fig.savefig(out / "flash_kv.png", dpi=100)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
