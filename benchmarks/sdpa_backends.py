"""Time the attention core (steps 3-6) across implementations and SDPA backends.

    python benchmarks/sdpa_backends.py --quick          # CPU, a small sweep (about a minute)
    python benchmarks/sdpa_backends.py                  # CPU, and CUDA too when a GPU is present
    python benchmarks/sdpa_backends.py --device cuda --dtypes bfloat16 --T 1024,4096,16384

For every device, dtype and sequence length T it times q, k, v (B, h, T, d_k) -> (B, h, T, d_k) with
  numpy       mha.steps 3-6 (what the numpy module runs), float32 only, CPU only
  manual      the torch module's manual path (forms the (B, h, T, T) weights)
  math/flash/efficient/cudnn   F.scaled_dot_product_attention forced onto one backend
  default     F.scaled_dot_product_attention left to choose
and writes benchmarks/results/<device>.csv, <device>.png and <device>.md (machine, versions,
load average, the table of ratios, min / median / max per call). The implementations take
turns, one call each per round; a forced backend's `sdpa_kernel` is entered and left outside
the timed region (it costs tens of microseconds, a whole small call on a GPU). Ratios inside
one run are the result; absolute times on shared machines swing 2-5x from run to run. On CUDA it also reports TFLOP/s (4*B*h*T^2*d_k, halved when causal)
and the fraction of the GPU's dense bf16 peak where the GPU is in mha.perf.bench's table.
"""

from __future__ import annotations

import argparse
import csv
import math
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from mha.perf import bench  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
METHOD = ("implementations interleaved, one call each per round, after 2 warm-ups; at least "
          "{repeats} timed calls and {min_time} s of calls each; a forced backend's sdpa_kernel "
          "entered and left outside the timing (mha.perf.bench.sdpa_timed); min / median / max kept, "
          "ratios from the min")
STYLE = {"numpy": ("tab:blue", "s"), "manual": ("tab:orange", "^"), "math": ("tab:green", "o"),
         "flash": ("tab:red", "o"), "efficient": ("tab:brown", "o"), "cudnn": ("tab:pink", "o"),
         "default": ("tab:purple", "x")}
FIELDS = ["device", "dtype", "B", "h", "T", "d_k", "causal", "impl", "median_ms", "min_ms",
          "max_ms", "repeats", "x_default", "tflops", "frac_bf16_peak", "peak_mem_mib"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; --quick picks a small CPU sweep."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto = cpu, plus cuda when available")
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    p.add_argument("--T", default=None, help="comma-separated sequence lengths (default per device)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-k", type=int, default=64)
    p.add_argument("--causal", action="store_true", help="is_causal=True (FLOPs halved)")
    p.add_argument("--repeats", type=int, default=10, help="at least this many timed calls")
    p.add_argument("--min-time", type=float, default=0.5, help="and at least this many seconds")
    p.add_argument("--quick", action="store_true", help="CPU: float32+bfloat16, T = 256, 512, 1024")
    p.add_argument("--out-dir", type=pathlib.Path, default=RESULTS)
    return p.parse_args(argv)


def sweep_lengths(args, device: str) -> list[int]:
    """Sequence lengths to time on `device`."""
    if args.T:
        return [int(t) for t in args.T.split(",")]
    if device == "cuda":
        return [1024, 2048, 4096, 8192, 16384]
    return [256, 512, 1024] if args.quick else [256, 512, 1024, 2048]


def impls_for(device: str, dtype: torch.dtype) -> list[str]:
    """Implementations to time: baselines, every backend that runs here, and SDPA's own choice."""
    names = ["numpy"] if device == "cpu" and dtype == torch.float32 else []
    return names + ["manual"] + bench.available_backends(device, dtype) + ["default"]


def make_call(impl: str, q, k, v, causal: bool) -> bench.Timed:
    """What to time for `impl` on q, k, v: the bare call, and the context it needs (untimed)."""
    if impl == "numpy":
        qn, kn, vn = (t.numpy() for t in (q, k, v))
        return bench.Timed(lambda: bench.numpy_core(qn, kn, vn, causal))
    if impl == "manual":
        return bench.Timed(lambda: bench.manual_core(q, k, v, causal))
    return bench.sdpa_timed(q, k, v, causal, None if impl == "default" else impl)


def measure_shape(args, device: str, dtype_name: str, T: int) -> list[dict]:
    """Rows for every implementation at one shape: time (interleaved rounds), peak memory, TFLOP/s."""
    dtype = DTYPES[dtype_name]
    g = torch.Generator(device=device).manual_seed(T)
    B, h, d_k = args.batch, args.heads, args.d_k
    q, k, v = (torch.randn(B, h, T, d_k, generator=g, device=device, dtype=dtype) for _ in range(3))
    calls = {impl: make_call(impl, q, k, v, args.causal) for impl in impls_for(device, dtype)}
    flops = bench.attention_flops(B, h, T, d_k, causal=args.causal)
    peak = bench.gpu_peak_bf16_tflops(torch.cuda.get_device_name()) if device == "cuda" else None
    with torch.inference_mode():
        timings = bench.time_interleaved(calls, repeats=args.repeats, warmup=2, device=device,
                                         min_time_s=args.min_time)
        rows = []
        for impl, call in calls.items():
            mem = bench.numpy_peak_bytes(call) if impl == "numpy" else bench.peak_memory_bytes(call, device)
            t = timings[impl]
            row = dict(device=device, dtype=dtype_name, B=B, h=h, T=T, d_k=d_k, causal=args.causal,
                       impl=impl, median_ms=t.median_s * 1e3, min_ms=t.min_s * 1e3,
                       max_ms=t.max_s * 1e3, repeats=t.repeats, x_default=math.nan,
                       tflops=bench.tflops(flops, t.min_s), frac_bf16_peak=math.nan,
                       peak_mem_mib=mem / 2**20)
            if peak and dtype in (torch.bfloat16, torch.float16):  # fp16 and bf16 share the dense peak
                row["frac_bf16_peak"] = row["tflops"] / peak
            rows.append(row)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """x_default: each row's best time divided by SDPA's default choice's best at the same shape.

    Best-of-N rather than the median: on a shared machine other processes only ever add time.
    """
    default = {(r["device"], r["dtype"], r["T"]): r["min_ms"] for r in rows if r["impl"] == "default"}
    for r in rows:
        r["x_default"] = r["min_ms"] / default[(r["device"], r["dtype"], r["T"])]


def ratio_table(rows: list[dict]) -> str:
    """Markdown table: per dtype and T, each implementation's best time as a multiple of SDPA's default."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = ["| dtype | T | " + " | ".join(impls) + " | default, best (ms) |",
             "|---|---:|" + "---:|" * (len(impls) + 1)]
    for key in dict.fromkeys((r["dtype"], r["T"]) for r in rows):
        sel = {r["impl"]: r for r in rows if (r["dtype"], r["T"]) == key}
        cells = [f"{sel[i]['x_default']:.2f}x" if i in sel else "-" for i in impls]
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) +
                     f" | {sel['default']['min_ms']:.1f} |")
    return "\n".join(lines)


def spread_table(rows: list[dict]) -> str:
    """Markdown table: min / median / max ms per call of every implementation, and the call count."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = ["| dtype | T | " + " | ".join(impls) + " |", "|---|---:|" + "---:|" * len(impls)]
    for key in dict.fromkeys((r["dtype"], r["T"]) for r in rows):
        sel = {r["impl"]: r for r in rows if (r["dtype"], r["T"]) == key}
        cells = [f"{_ms(sel[i]['min_ms'])} / {_ms(sel[i]['median_ms'])} / {_ms(sel[i]['max_ms'])} "
                 f"({sel[i]['repeats']})" if i in sel else "-" for i in impls]
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(x: float) -> str:
    """Milliseconds with three significant digits (0.0123, 1.23, 123)."""
    return f"{x:.3g}"


def _panel(ax, rows: list[dict], dtype: str, key: str, title: str, ylabel: str) -> None:
    """One log-log panel: `key` against T, one line per implementation, fixed colours."""
    for impl in dict.fromkeys(r["impl"] for r in rows if r["dtype"] == dtype):
        sel = [r for r in rows if r["dtype"] == dtype and r["impl"] == impl]
        color, marker = STYLE.get(impl, ("black", "o"))
        ax.loglog([r["T"] for r in sel], [max(r[key], 1e-3) for r in sel], marker=marker,
                  color=color, label=impl)
    Ts = sorted({r["T"] for r in rows})
    ax.set_xticks(Ts, [str(t) for t in Ts])
    ax.minorticks_off()
    ax.set(title=title, xlabel="sequence length T", ylabel=ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)


def plot(rows: list[dict], device: str, title: str, path: pathlib.Path) -> None:
    """Time vs T per implementation (one panel per dtype) and peak memory vs T (first dtype)."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    n = len(dtypes) + 1
    ncols = 2 if n > 2 else n
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.0 * nrows + 0.5), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    axes = axes[:n]
    for ax, dt in zip(axes, dtypes, strict=False):
        _panel(ax, rows, dt, "min_ms", f"{device} {dt}: time per call", "ms (best of repeats)")
    _panel(axes[-1], rows, dtypes[0], "peak_mem_mib", f"{device} {dtypes[0]}: peak extra memory", "MiB")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_device(args, device: str) -> list[dict]:
    """Sweep every dtype, length and implementation on one device; write CSV, PNG and Markdown."""
    dtypes = ["float32", "bfloat16"] if args.quick and not args.T else args.dtypes.split(",")
    jobs = [(dt, T) for dt in dtypes for T in sweep_lengths(args, device)]
    rows = []
    for dt, T in tqdm(jobs, desc=f"{device} sweep", unit="shape", file=sys.stderr):
        rows.extend(measure_shape(args, device, dt, T))
    add_ratios(rows)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / f"{device}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()})
    info = bench.machine_info()
    shape = f"B={args.batch}, h={args.heads}, d_k={args.d_k}, causal={args.causal}"
    plot(rows, device, f"{bench.machine_line(info)}\n{shape}", args.out_dir / f"{device}.png")
    table = ratio_table(rows)
    extra = ""
    if device == "cuda":
        extra = "\n\nTFLOP/s (fraction of dense bf16 peak):\n\n" + "\n".join(
            f"- {r['dtype']} T={r['T']} {r['impl']}: {r['tflops']:.1f}"
            + ("" if math.isnan(r["frac_bf16_peak"]) else f" ({r['frac_bf16_peak']:.0%})")
            for r in rows)
        if bench.gpu_peak_bf16_tflops(info["gpu"]) is None:
            extra += f"\n\nPeak for {info['gpu']}: unknown (not in the table mha.perf.hardware.GPUS)."
    md = (f"# SDPA benchmark, {device}\n\n"
          + "".join(f"- {k}: {v}\n" for k, v in info.items())
          + f"- shape: {shape}\n\n"
          f"- method: {METHOD.format(repeats=args.repeats, min_time=args.min_time)}\n\n"
          "Best time per call as a multiple of `F.scaled_dot_product_attention`'s default choice at the "
          "same shape, measured in this one run (lower is faster):\n\n" + table +
          "\n\nms per call, min / median / max (timed calls):\n\n" + spread_table(rows) + extra + "\n")
    (args.out_dir / f"{device}.md").write_text(md)
    print(f"\n{device}: {bench.machine_line(info)}\n{shape}\n{table}\n\n{spread_table(rows)}{extra}")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the sweep on the chosen devices."""
    args = parse_args(argv)
    devices = ["cpu"] if args.device == "cpu" else ["cuda"] if args.device == "cuda" else (
        ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    if "cuda" in devices and not torch.cuda.is_available():
        print("no CUDA device: nothing to do for --device cuda", file=sys.stderr)
        return 1
    for device in devices:
        run_device(args, device)
    print(f"\nwrote {', '.join(f'{d}.csv/.png/.md' for d in devices)} under {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
