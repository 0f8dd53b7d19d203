"""The torch attention entry point (mha.attention.torch_attention) measured: what it hands SDPA, what it costs.

    python benchmarks/attention_api.py           # the figures of issue 29 (a few minutes on 2 cores)
    python benchmarks/attention_api.py --quick   # small sizes, for a smoke run

Nothing here is asserted (CPU timings on shared machines swing); ratios come from the minimum of
interleaved calls (other programs only ever add time). B=1, h=8, d_k=64, float32, CPU.
  1. the SDPA call MultiHeadAttention makes for a plain causal prefill and for a cached one-token
     decode step (attn_mask / is_causal), read with a spy wrapped round F.scaled_dot_product_attention;
  2. the core through the entry point, `attention(q, k, v, MaskSpec, backend="sdpa")`, against a
     bare `F.scaled_dot_product_attention(q, k, v, is_causal=True)` at T = 2048 (goal: within 5%),
     and the whole module forward against the same module with a bare SDPA call patched in;
  3. FlexAttention compiled vs eager vs SDPA with the dense window mask, T = 2048, window = 256:
     time per call (the BlockMask or dense mask built inside each call, as the module does) and
     peak memory: the profiler's replay of torch's allocations (`bench.peak_memory_bytes`) and
     the process's peak RSS during one call (`VmHWM`, reset via /proc/self/clear_refs), each
     variant in its own process after a warm-up (compiling) call.
Writes benchmarks/results/attention_api.json and .md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import unittest.mock

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mha.attention import torch_attention
from mha.attention.masking import MaskSpec
from mha.modules import compose
from mha.modules.torch_mha import MultiHeadAttention
from mha.perf import bench

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
B, H, D_K = 1, 8, 64


def qkv(T: int, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v (B, h, T, d_k) float32."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D_K, generator=g) for _ in range(3)]


def _args(kwargs: dict) -> dict:
    """What one SDPA call got: the mask's shape (or None) and is_causal."""
    mask = kwargs.get("attn_mask")
    return {"attn_mask": None if mask is None else list(mask.shape),
            "is_causal": bool(kwargs.get("is_causal", False))}


def sdpa_args_of_the_module(T: int = 16) -> dict:
    """The SDPA arguments the module passes for a causal prefill, a prompt into a cache and a decode step."""
    m = MultiHeadAttention(H * D_K // 8, H // 2, seed=0)
    x = torch.randn(2, T, m.d_model)
    out = {}
    with torch.no_grad(), unittest.mock.patch.object(
            F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention) as spy:
        m(x, causal=True)
        out["plain causal prefill"] = _args(spy.call_args.kwargs)
        cache = m.new_cache(2, T + 1)
        m(x, causal=True, cache=cache)
        out["prompt into a KV cache"] = _args(spy.call_args.kwargs)
        m(x[:, :1], causal=True, cache=cache)
        out["cached one-token decode step"] = _args(spy.call_args.kwargs)
        MultiHeadAttention(m.d_model, m.n_heads, window=4)(x, causal=True)
        out["sliding window (4)"] = _args(spy.call_args.kwargs)
    return out


def _row(t: dict[str, bench.Timing]) -> dict:
    """min / median / max in ms per variant."""
    return {n: {"min_ms": 1e3 * r.min_s, "median_ms": 1e3 * r.median_s, "max_ms": 1e3 * r.max_s,
                "calls": r.repeats} for n, r in t.items()}


def core_overhead(T: int, repeats: int, min_time: float) -> dict:
    """The entry point's SDPA path vs a bare SDPA call, and the module vs the module on a bare call."""
    q, k, v = qkv(T)
    spec = MaskSpec.plain(T, T, causal=True, like=q)
    with torch.no_grad():
        core = bench.time_interleaved({
            "entry point (MaskSpec, backend='sdpa')":
                lambda: torch_attention.attention(q, k, v, spec, backend="sdpa"),
            "entry point (builds the MaskSpec too)":
                lambda: torch_attention.attention(q, k, v, MaskSpec.plain(T, T, causal=True, like=q),
                                                  backend="sdpa"),
            "bare F.scaled_dot_product_attention(is_causal=True)":
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        }, repeats=repeats, min_time_s=min_time)
        m = MultiHeadAttention(H * D_K, H, seed=0)
        x = torch.randn(B, T, H * D_K)

        def bare_module():
            """The same forward with steps 3-6 a bare SDPA call and no mask description built."""
            def bare(q, k, v, mask, bias, **_):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True), None
            with unittest.mock.patch.object(torch_attention, "attention", bare), \
                    unittest.mock.patch.object(compose, "mask_spec", lambda *a: None):
                return m(x, causal=True)

        module = bench.time_interleaved({"module forward": lambda: m(x, causal=True),
                                         "module forward, bare SDPA patched in": bare_module},
                                        repeats=repeats, min_time_s=min_time)
        stub = lambda q, k, v, **_: q  # noqa: E731  (the kernel taken out: what is left is overhead)
        with unittest.mock.patch.object(F, "scaled_dot_product_attention", stub):
            alone = bench.time_interleaved({
                "entry point, kernel stubbed": lambda: torch_attention.attention(q, k, v, spec,
                                                                                 backend="sdpa"),
                "bare call, kernel stubbed": lambda: F.scaled_dot_product_attention(q, k, v,
                                                                                   is_causal=True),
            }, repeats=200, min_time_s=min_time)
    names = list(core)
    overhead_s = alone["entry point, kernel stubbed"].min_s - alone["bare call, kernel stubbed"].min_s
    ratio = core[names[0]].min_s / core[names[2]].min_s
    ratio_spec = core[names[1]].min_s / core[names[2]].min_s
    m_names = list(module)
    return {"T": T, "core": _row(core), "core_ratio": ratio, "core_ratio_with_spec": ratio_spec,
            "overhead": _row(alone), "overhead_us": 1e6 * overhead_s,
            "overhead_fraction": overhead_s / core[names[2]].min_s,
            "module": _row(module), "module_ratio": module[m_names[0]].min_s / module[m_names[1]].min_s}


def _variant(name: str, T: int, window: int):
    """The call of one Flex / SDPA variant at T with a causal window (built per call, as the module does)."""
    q, k, v = qkv(T)
    spec = MaskSpec.plain(T, T, causal=True, like=q, window=window)
    if name == "flex compiled":
        return lambda: torch_attention.attention(q, k, v, spec, backend="flex", compile=True)
    if name == "flex eager":
        return lambda: torch_attention.attention(q, k, v, spec, backend="flex", compile=False)
    return lambda: torch_attention.attention(q, k, v, spec, backend="sdpa")  # dense window mask


VARIANTS = ("flex compiled", "flex eager", "sdpa (dense mask)")


def peak_rss_delta(name: str, T: int, window: int) -> int:
    """Bytes the process's peak RSS rises during one call (after a warm-up call), in this process."""
    fn = _variant(name, T, window)
    with torch.no_grad():
        fn()  # warm-up: compiles for "flex compiled"
        pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _status_kb("VmRSS")
        fn()
        return 1024 * (_status_kb("VmHWM") - before)


def _status_kb(key: str) -> int:
    """A field of /proc/self/status in kB."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def flex_vs_sdpa(T: int, window: int, repeats: int, min_time: float) -> dict:
    """Times (interleaved, one process) and peak memory (a process per variant) of the three variants."""
    fns = {n: _variant(n, T, window) for n in VARIANTS}
    with torch.no_grad():
        timing = bench.time_interleaved(fns, repeats=repeats, min_time_s=min_time)
        profiled = {n: bench.peak_memory_bytes(fn) for n, fn in fns.items()}
    rss = {}
    for n in tqdm(VARIANTS, desc="peak RSS, a process each"):
        code = (f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r}); "
                f"import attention_api as a; print(a.peak_rss_delta({n!r}, {T}, {window}))")
        done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                              text=True, check=True)
        rss[n] = int(done.stdout.split()[-1])
    spec = MaskSpec.plain(T, T, causal=True, like=qkv(1)[0], window=window)
    build = bench.time_interleaved({"BlockMask (eager create_block_mask)":
                                    lambda: spec.block_mask(B, H, T, T, "cpu"),
                                    "dense mask": spec.dense}, repeats=repeats)
    return {"T": T, "window": window, "time": _row(timing), "mask build": _row(build),
            "profiler_peak_bytes": profiled, "peak_rss_delta_bytes": rss,
            "scores_bytes_one_matrix": B * H * T * T * 4}


def markdown(r: dict) -> str:
    """The results as the Markdown report."""
    lines = ["# The torch attention entry point: SDPA arguments, overhead, Flex on the CPU", "",
             f"Machine: {r['machine']}", "", "## 1. The SDPA call the module makes", "",
             "| call | attn_mask | is_causal |", "|---|---|---|"]
    lines += [f"| {n} | {a['attn_mask']} | {a['is_causal']} |" for n, a in r["sdpa_args"].items()]
    c = r["overhead"]
    lines += ["", f"## 2. Core and module time vs a bare SDPA call (T = {c['T']}, B=1, h=8, d_k=64, "
              "float32, causal)", "", "| variant | min ms | median ms | max ms | calls |",
              "|---|---|---|---|---|"]
    for part in ("core", "overhead", "module"):
        lines += [f"| {n} | {t['min_ms']:.2f} | {t['median_ms']:.2f} | {t['max_ms']:.2f} | "
                  f"{t['calls']} |" for n, t in c[part].items()]
    lines += ["", f"Entry point / bare SDPA (min): **{c['core_ratio']:.3f}** (with the MaskSpec "
              f"built in the call: {c['core_ratio_with_spec']:.3f}); module / module on a bare "
              f"SDPA call: **{c['module_ratio']:.3f}** (goal: within 5%). With the kernel stubbed "
              f"out, the entry point's own work (checks, the MaskSpec's lowering) is "
              f"**{c['overhead_us']:.0f} us** a call, {100 * c['overhead_fraction']:.2f}% of the "
              f"bare SDPA call: the min-time ratios above move with the machine's load more "
              f"than that.", ""]
    f = r["flex"]
    lines += [f"## 3. Flex compiled vs Flex eager vs SDPA with a dense mask (T = {f['T']}, "
              f"causal window {f['window']})", "",
              "| variant | min ms | median ms | max ms | calls | profiler peak MB | peak RSS rise MB |",
              "|---|---|---|---|---|---|---|"]
    for n, t in f["time"].items():
        lines.append(f"| {n} | {t['min_ms']:.1f} | {t['median_ms']:.1f} | {t['max_ms']:.1f} | "
                     f"{t['calls']} | {f['profiler_peak_bytes'][n] / 2**20:.1f} | "
                     f"{f['peak_rss_delta_bytes'][n] / 2**20:.1f} |")
    lines += ["", "Building the mask alone, per call:", ""]
    lines += [f"- {n}: {t['min_ms']:.2f} ms (min)" for n, t in f["mask build"].items()]
    lines += ["", f"One (B, h, T, T) float32 score matrix is {f['scores_bytes_one_matrix'] / 2**20:.0f} MB.",
              ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--part", type=int, choices=(2,), help="only part 2, merged into the last results")
    a = p.parse_args()
    T, window = (256, 32) if a.quick else (2048, 256)
    torch.manual_seed(0)
    stem = "attention_api_quick" if a.quick else "attention_api"
    if a.part == 2:  # re-measure the overhead only (a noisy machine), keep the rest
        r = json.loads((RESULTS / f"{stem}.json").read_text())
        r["machine"], r["overhead"] = bench.machine_line(), core_overhead(T, a.repeats, a.min_time)
        _write(r, stem)
        return
    steps = tqdm(total=3, desc="attention_api")
    r = {"machine": bench.machine_line(), "sdpa_args": sdpa_args_of_the_module()}
    steps.update()
    r["overhead"] = core_overhead(T, a.repeats, a.min_time)
    steps.update()
    r["flex"] = flex_vs_sdpa(T, window, max(3, a.repeats // 3), a.min_time)
    steps.update()
    steps.close()
    _write(r, stem)


def _write(r: dict, stem: str) -> None:
    """Write the results as JSON and Markdown and print the Markdown."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(r, indent=1) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
