"""The Triton kernel (mha.attention.triton_flash) against SDPA's flash backend on a GPU: bf16, causal, d_k = 128.

    python benchmarks/triton_flash.py            # writes benchmarks/results/triton_flash.md

The goal set in issue 20: our kernel at no less than 60% of SDPA flash's throughput at T = 8192.
Throughput is the causal core's FLOPs (`bench.attention_flops`) over the best time, both kernels
timed in the same rounds (`bench.time_interleaved`). A last line compares the kernel's float32
error with SDPA's math path (its dots are IEEE float32, not TF32). Without a CUDA device nothing
is timed and the file says so: Triton's CPU interpreter measures numpy, not the kernel.
"""

from __future__ import annotations

import pathlib
import sys

import torch

from mha.attention import triton_flash
from mha.perf import bench

OUT = pathlib.Path(__file__).resolve().parent / "results" / "triton_flash.md"
SHAPES = [(1, 16, T, 128) for T in (1024, 2048, 4096, 8192)]  # (B, h, T, d_k)


def _row(B: int, h: int, T: int, d: int) -> str:
    """One measured table row: times, TFLOP/s and the ratio ours / SDPA flash."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, h, T, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    assert not triton_flash.interpreted(q, k, v), "CUDA tensors must take the compiled kernel"
    ours, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=128, block_k=64)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    err = float((ours.float() - want.float()).abs().max())
    times = bench.time_interleaved(
        {"ours": lambda: triton_flash.flash_forward(q, k, v, causal=True, block_q=128, block_k=64),
         "sdpa": bench.sdpa_timed(q, k, v, causal=True, backend="flash")},
        repeats=20, warmup=3, device="cuda")
    flops = bench.attention_flops(B, h, T, d, causal=True)
    tf = {n: flops / t.min_s / 1e12 for n, t in times.items()}
    return (f"| {T} | {times['ours'].min_s * 1e3:.3f} / {times['ours'].median_s * 1e3:.3f} / "
            f"{times['ours'].max_s * 1e3:.3f} | {times['sdpa'].min_s * 1e3:.3f} / "
            f"{times['sdpa'].median_s * 1e3:.3f} / {times['sdpa'].max_s * 1e3:.3f} | "
            f"{tf['ours']:.0f} | {tf['sdpa']:.0f} | {tf['ours'] / tf['sdpa']:.2f} | {err:.1e} |")


def _float32_line(T: int = 1024, d: int = 128) -> str:
    """float32 accuracy against float64, ours next to SDPA's math path: TF32 dots would show here."""
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, 4, T, d, device="cuda", dtype=torch.float32, generator=g) for _ in range(3))
    golden = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    ours, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=32, block_k=32)
    sdpa = bench.sdpa_core(q, k, v, causal=True, backend="math")  # float32 matmuls (TF32 off by default)
    err_ours = float((ours.double() - golden).abs().max())
    err_sdpa = float((sdpa.double() - golden).abs().max())
    return (f"float32 (T = {T}, h = 4, causal): max |ours - float64| = {err_ours:.1e}, SDPA math "
            f"float32 {err_sdpa:.1e} (the kernel's dots use input_precision='ieee', not TF32)")


def main() -> int:
    header = ["# Triton kernel vs SDPA flash (bf16, causal, B = 1, h = 16, d_k = 128)", ""]
    if not torch.cuda.is_available() or not triton_flash.available():
        why = "no CUDA device" if not torch.cuda.is_available() else "triton is not installed"
        lines = header + [f"**Not run: {why}.** Every row below is waiting for a GPU run "
                          "(`python benchmarks/triton_flash.py` on one).", "",
                          f"- torch: {torch.__version__}", "",
                          "| T | ours ms (min / median / max) | SDPA flash ms | ours TFLOP/s | SDPA TFLOP/s | ours / SDPA | max abs diff |",
                          "|---:|---|---|---:|---:|---:|---:|"]
        lines += [f"| {T} | not run | not run | - | - | - | - |" for _, _, T, _ in SHAPES]
        OUT.write_text("\n".join(lines) + "\n")
        print(f"not run ({why}); wrote {OUT}")
        return 0
    import triton

    info = bench.machine_info()
    lines = header + [f"- {key}: {value}" for key, value in info.items()]
    lines += [f"- triton: {triton.__version__}", "",
              "Best time is the min over 20 interleaved calls; TFLOP/s from the min. Goal: ours / SDPA >= 0.60 at T = 8192.",
              "", "| T | ours ms (min / median / max) | SDPA flash ms | ours TFLOP/s | SDPA TFLOP/s | ours / SDPA | max abs diff |",
              "|---:|---|---|---:|---:|---:|---:|"]
    lines += [_row(*shape) for shape in SHAPES]
    lines += ["", _float32_line()]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
