"""Our composed torch module (sdpa backend) vs Hugging Face's LlamaAttention, one run.

    python benchmarks/llama_attention.py           # B=4, T=256 and 1024 (about a minute on 2 cores)
    python benchmarks/llama_attention.py --quick   # T=128 only, a smoke run

Same weights (mha.modules.hf.from_llama_attention), B=4, d_model=256, h=8, h_kv=2 (d_k=32), RoPE,
float32, causal, forward under torch.no_grad(), random tiny config (nothing from the Hub).
Timed per call, in rounds (one call of each per round, so load bursts hit all alike):
  ours            module(x, causal=True): RoPE tables (numpy float64) made inside every call
  hf_eager        LlamaAttention, attn_implementation="eager": (B, h, T, T) float mask and weights
  hf_sdpa         LlamaAttention, "sdpa": no mask tensor, is_causal
  hf_sdpa+rotary  hf_sdpa plus LlamaRotaryEmbedding and create_causal_mask in the call
The first three HF rows get cos/sin and the mask precomputed, as LlamaModel shares them across
its layers; the last one pays for them per call, as ours does. The result is each one's time
over ours in the same round, min / median / max over rounds: ratios within this run, never
absolute times (shared CPUs swing 2-5x between runs). Writes benchmarks/results/llama_attention.md.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch
import transformers
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

from mha.modules.hf import from_llama_attention
from mha.perf import bench

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
B, D_MODEL, H, H_KV = 4, 256, 8, 2


def setup(impl: str, T: int, per_call: bool) -> tuple[Callable[[], object], LlamaAttention, torch.Tensor]:
    """A no-argument LlamaAttention call with `impl` at (B, T), its module and its input x.

    per_call: make cos/sin and the mask inside the call (else once, as LlamaModel does).
    """
    config = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=H, num_key_value_heads=H_KV,
                         max_position_embeddings=max(T, 2048), attn_implementation=impl)
    torch.manual_seed(0)
    attn = LlamaAttention(config, layer_idx=0).eval()  # same seed: the same weights for every impl
    x = torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(1))  # (B, T, d_model)
    pos, rotary = torch.arange(T)[None].expand(B, T), LlamaRotaryEmbedding(config)  # (B, T)

    def extras() -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=None, cache=None,
                                  position_ids=pos)  # eager: (B, 1, T, T) float; sdpa: None
        return rotary(x, pos), mask  # cos, sin (B, T, d_k) each

    if per_call:
        return (lambda: attn(x, *extras())[0]), attn, x
    emb, mask = extras()
    return (lambda: attn(x, emb, mask)[0]), attn, x


def calls(T: int) -> dict[str, Callable[[], object]]:
    """The four no-argument calls at length T, after checking that they agree."""
    fns = {}
    for name, impl, per_call in (("hf_eager", "eager", False), ("hf_sdpa", "sdpa", False),
                                 ("hf_sdpa+rotary", "sdpa", True)):
        fns[name], attn, x = setup(impl, T, per_call)
    ours = from_llama_attention(attn, attn.config)  # sdpa backend, rope="half"
    fns = {"ours": lambda: ours(x, causal=True), **fns}
    with torch.no_grad():
        ref = fns["hf_eager"]()
        for name, fn in fns.items():
            err = float((fn() - ref).abs().max())
            if err > 1e-4:  # float32, O(0.1) outputs: a few 1e-7 is agreement, 1e-1 a bug
                raise AssertionError(f"T={T}: {name} differs from hf_eager by {err:.2e}")
    return fns


def rounds(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function, one call of each per round, after one warm-up round."""
    times: dict[str, list[float]] = {n: [] for n in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return times


def table_rows(T: int, times: dict[str, list[float]]) -> list[str]:
    """Markdown rows: median ms, and time over ours in the same round (min / median / max)."""
    rows = []
    for name, ts in times.items():
        r = [t / o for t, o in zip(ts, times["ours"], strict=True)]
        rows.append(f"| {T} | {name} | {1e3 * statistics.median(ts):.2f} | {min(r):.2f} | "
                    f"{statistics.median(r):.2f} | {max(r):.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Time the four calls at each T and write the results table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="T=128 only, a smoke run")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS, help="where the results go")
    args = ap.parse_args(argv)
    sweep = {128: 5} if args.quick else {256: 30, 1024: 10}  # T: rounds
    lines = ["# Our module vs Hugging Face LlamaAttention, one run", "",
             f"Machine: {bench.machine_line()}; transformers {transformers.__version__}.", "",
             f"B={B}, d_model={D_MODEL}, h={H}, h_kv={H_KV} (d_k={D_MODEL // H}), RoPE, float32, "
             "causal, forward under no_grad. Ratio = its time / ours in the same round "
             "(< 1: faster than ours), min / median / max over the rounds.", "",
             "| T | impl | median ms | ratio min | ratio median | ratio max |",
             "|---|---|---|---|---|---|"]
    for T, repeats in sweep.items():
        lines += table_rows(T, rounds(calls(T), repeats))
    lines += ["", f"Rounds: {', '.join(f'T={T}: {n}' for T, n in sweep.items())}. hf_eager and "
              "hf_sdpa get cos/sin and the mask precomputed (LlamaModel shares them across "
              "layers); hf_sdpa+rotary and ours make them in the call."]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llama_attention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
