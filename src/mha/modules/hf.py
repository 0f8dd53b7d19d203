"""Hugging Face Llama attention -> our composed torch module, with the same weights.

    from mha.modules.hf import from_llama_attention
    ours = from_llama_attention(model.model.layers[0].self_attn, model.config)

`transformers` is a test requirement, not a runtime one: it is imported inside the function.
What maps to what (Shape legend: h heads, h_kv key/value heads, d_k head width):

    LlamaAttention                       mha.modules.torch_mha.MultiHeadAttention
    q_proj (h d_k, d_model)              q_proj, same (out, in) layout
    k_proj, v_proj (h_kv d_k, d_model)   k_proj, v_proj, n_kv_heads = num_key_value_heads
    o_proj (d_model, h d_k)              out_proj
    rotate_half RoPE, rope_theta         rope="half", rope_base = rope_theta
    repeat_kv (head i reads kv i // g)   the core's GQA sharing (the same grouping)

rope="interleaved" gives a module that pairs features (2i, 2i+1) instead: q/k rows are then
reordered per head so that it computes exactly what HF's half split does (tests/test_hf_parity.py).

The comparison harness lives here too (tests/test_hf_parity.py and 17_generation.ipynb import it):

    print(compare_with_llama(lengths=(7, 4, 2), n_heads=4, n_kv_heads=2, d_k=8, n_new=3))

    llama_config, llama_attention, as_impl   a tiny random LlamaAttention (nothing from the Hub)
    inputs, exact_tables                     the prompt and new tokens; float64 cos/sin tables
    run_hf, run_ours                         prefill a left-padded batch, then decode n_new tokens
    max_err                                  max |a - b| over every step, real query rows only
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mha.attention.posenc import PAIRINGS, rope_permutation
from mha.modules.compose import padded_positions
from mha.modules.torch_mha import MultiHeadAttention

if TYPE_CHECKING:  # for the hints only: transformers is imported inside the functions
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

LLAMA3_THETA = 500000.0
"""Llama 3's RoPE base, the harness default: not HF's 10000, so a copy that drops it fails."""

BOUNDS = {torch.float64: 1e-6, torch.float32: 1e-5}
"""compare_with_llama's verdict per dtype: float64 is HF's float32 RoPE angles (about 1e-7 off
float64 here), float32 is PyTorch's default float32 atol (mha.perf.bench.DEFAULT_ATOL)."""


def rope_theta(config: Any) -> float:
    """RoPE's base from a Llama config: rope_parameters["rope_theta"] (transformers 5), else rope_theta."""
    params = getattr(config, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"only plain RoPE maps onto this module, got rope_type={kind!r} "
                         f"(scaled variants change the frequencies: {params})")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the config names no RoPE base (rope_parameters['rope_theta'] or rope_theta)")
    return float(theta)


def rows_per_head(t: torch.Tensor, n_heads: int, order: np.ndarray) -> torch.Tensor:
    """Reorder each head's d_k rows of a weight (n_heads d_k, d_in) or bias (n_heads d_k,) by `order`."""
    idx = torch.as_tensor(order, device=t.device)
    per_head = t.reshape(n_heads, -1, *t.shape[1:])  # (h, d_k, d_in) or (h, d_k)
    return per_head[:, idx].reshape(t.shape)


def _llama_module() -> Any:
    """transformers' Llama modelling module, imported only now, with a clear error if missing."""
    try:
        import transformers.models.llama.modeling_llama as llama
    except ImportError as e:  # pragma: no cover - transformers is in requirements-dev.txt
        raise ImportError("mha.modules.hf needs Hugging Face transformers: pip install -r "
                          "requirements-dev.txt (or pip install transformers)") from e
    return llama


def _check_llama(attn: Any, config: Any, rope: str) -> None:
    """Refuse what this module cannot express: another class, a pairing, head_dim * h != d_model."""
    if not isinstance(attn, _llama_module().LlamaAttention):
        raise TypeError(f"attn must be a transformers LlamaAttention, got {type(attn).__name__}")
    if rope not in PAIRINGS:
        raise ValueError(f"rope must be one of {PAIRINGS}, got {rope!r}")
    h, d = config.num_attention_heads, config.hidden_size
    if attn.head_dim * h != d:
        raise ValueError(f"this module needs head_dim * num_attention_heads == hidden_size, got "
                         f"{attn.head_dim} * {h} != {d}")


def from_llama_attention(attn: Any, config: Any, rope: str = "half") -> MultiHeadAttention:
    """Our MultiHeadAttention (sdpa backend) with a LlamaAttention's weights, heads, RoPE base and dtype."""
    _check_llama(attn, config, rope)
    h, h_kv = config.num_attention_heads, config.num_key_value_heads
    w = attn.q_proj.weight
    ours = MultiHeadAttention(config.hidden_size, h, dtype=w.dtype, device=w.device,
                              n_kv_heads=h_kv, rope=rope, rope_base=rope_theta(config))
    lins = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    Wq, Wk, Wv, Wo = (lin.weight.detach() for lin in lins)  # (out, in), as nn.Linear keeps them
    bq, bk, bv, bo = (torch.zeros(lin.out_features, dtype=w.dtype, device=w.device)
                      if lin.bias is None else lin.bias.detach() for lin in lins)
    if rope == "interleaved":  # HF's half layout is interleaved row perm[j] at row j: undo it
        inverse = np.argsort(rope_permutation(attn.head_dim))  # (d_k,)
        Wq, bq = rows_per_head(Wq, h, inverse), rows_per_head(bq, h, inverse)
        Wk, bk = rows_per_head(Wk, h_kv, inverse), rows_per_head(bk, h_kv, inverse)
    return ours.load_weights_(Wq, bq, Wk, bk, Wv, bv, Wo, bo)


# ---- the comparison harness: a tiny random Llama layer, HF's generate loop, ours, the error ------
def llama_config(impl: str = "sdpa", n_heads: int = 4, n_kv_heads: int = 2, d_k: int = 8,
                 theta: float = LLAMA3_THETA, bias: bool = False) -> LlamaConfig:
    """A tiny random LlamaConfig (d_model = n_heads d_k); attn_implementation picks HF's kernel."""
    _llama_module()
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=n_heads * d_k, num_attention_heads=n_heads,
                       num_key_value_heads=n_kv_heads, head_dim=d_k, max_position_embeddings=64,
                       attention_bias=bias,
                       rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
                       attn_implementation=impl)


def llama_attention(config: LlamaConfig, seed: int = 0) -> LlamaAttention:
    """LlamaAttention in float64 with N(0, 1/d_model) weights (scores of order 1, far from uniform)."""
    llama = _llama_module()
    torch.manual_seed(seed)
    attn = llama.LlamaAttention(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0.0, config.hidden_size**-0.5)
    return attn


def as_impl(attn: LlamaAttention, impl: str, dtype: torch.dtype
            ) -> tuple[LlamaAttention, LlamaConfig]:
    """The same weights (rounded to dtype) under another attn_implementation, with its config."""
    c = attn.config
    cfg = llama_config(impl, c.num_attention_heads, c.num_key_value_heads, attn.head_dim,
                       rope_theta(c), attn.q_proj.bias is not None)
    twin = _llama_module().LlamaAttention(cfg, layer_idx=0).to(dtype).eval()
    twin.load_state_dict({k: v.to(dtype) for k, v in attn.state_dict().items()})
    return twin, cfg


def inputs(B: int, T: int, n_new: int, d_model: int, dtype: torch.dtype,
           round_to: torch.dtype | None = None, seed: int = 1
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt (B, T, d_model) and new tokens (B, n_new, d_model): float64 draws rounded to round_to."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T + n_new, d_model, generator=g, dtype=torch.float64)  # (B, T + n_new, d)
    x = x.to(round_to or dtype).to(dtype)
    return x[:, :T], x[:, T:]


def exact_tables(pos: torch.Tensor, d_k: int, theta: float, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, T, d_k) in float64 for HF's half split: angles pos * theta^(-2i/d_k), twice."""
    inv_freq = theta ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)  # (d_k/2,)
    angles = pos[..., None].double() * inv_freq  # (B, T, d_k/2)
    emb = torch.cat([angles, angles], dim=-1)  # (B, T, d_k): pair i at features i and i + d_k/2
    return emb.cos().to(dtype), emb.sin().to(dtype)


@torch.no_grad()
def run_hf(attn: LlamaAttention, config: LlamaConfig, lengths: Sequence[int], *,
           T: int | None = None, n_new: int = 3, tables: str = "hf",
           round_to: torch.dtype | None = None, seed: int = 1) -> list[torch.Tensor]:
    """Prefill the left-padded prompts, then decode n_new tokens, as HF's generate feeds a layer.

    Returns [prefill (B, T, d_model)] + n_new steps (B, 1, d_model). tables="hf" uses HF's own
    LlamaRotaryEmbedding (float32 angles), "exact" the float64 `exact_tables`.
    """
    if tables not in ("hf", "exact"):
        raise ValueError(f"tables must be 'hf' or 'exact', got {tables!r}")
    llama = _llama_module()
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_causal_mask

    dtype = attn.q_proj.weight.dtype
    T = max(lengths) if T is None else T
    prompt, new = inputs(len(lengths), T, n_new, config.hidden_size, dtype, round_to, seed)
    real = padded_positions(torch.tensor(lengths), T) >= 0  # (B, T): True on real tokens
    mask2d = real.long()  # (B, T): HF's attention_mask, 1 on real tokens
    cache, rotary = DynamicCache(config=config), llama.LlamaRotaryEmbedding(config)
    outs = []
    for x in [prompt] + [new[:, i:i + 1] for i in range(n_new)]:
        if outs:
            mask2d = torch.cat([mask2d, torch.ones_like(mask2d[:, :1])], dim=-1)  # (B, S + 1)
        # generation/utils.py _prepare_position_ids_for_generation: cumsum - 1, pads set to 0
        pos = (mask2d.cumsum(-1) - 1).masked_fill(mask2d == 0, 0)[:, -x.shape[1]:]  # (B, T_x)
        mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=mask2d,
                                  cache=cache, position_ids=pos)  # before the layer grows the cache
        emb = (rotary(x, pos) if tables == "hf"
               else exact_tables(pos, attn.head_dim, rope_theta(config), dtype))
        out, _ = attn(x, position_embeddings=emb, attention_mask=mask, cache=cache)
        outs.append(out)  # (B, T_x, d_model)
    return outs


@torch.no_grad()
def run_ours(module: MultiHeadAttention, lengths: Sequence[int], *, T: int | None = None,
             n_new: int = 3, seed: int = 1) -> list[torch.Tensor]:
    """The same prefill and decoding with our module: padded positions, then positions continue."""
    T = max(lengths) if T is None else T
    prompt, new = inputs(len(lengths), T, n_new, module.d_model, module.dtype, seed=seed)
    cache = module.new_cache(len(lengths), T + n_new)
    pos = padded_positions(torch.tensor(lengths), T)  # (B, T): 0..L-1 on real tokens, -1 on pads
    outs = [module(prompt, causal=True, positions=pos, cache=cache)]  # (B, T, d_model)
    outs += [module(new[:, i:i + 1], causal=True, cache=cache) for i in range(n_new)]  # (B, 1, d)
    return outs


def max_err(a: list[torch.Tensor], b: list[torch.Tensor], lengths: Sequence[int]) -> float:
    """Max |a - b| over every step, on real query rows only (pad rows attend to nothing)."""
    real = padded_positions(torch.tensor(lengths), a[0].shape[1]) >= 0  # (B, T)
    diffs = [(a[0] - b[0]).double().abs()[real]]  # prefill: (n_real, d_model)
    diffs += [(x - y).double().abs() for x, y in zip(a[1:], b[1:], strict=True)]  # (B, 1, d)
    return max(float(d.max()) for d in diffs)


def _sci(x: float) -> str:
    """1e-06 -> '1e-6': a bound as people write it."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def compare_with_llama(lengths: Sequence[int] = (7, 4, 2), *, T: int | None = None,
                       n_new: int = 3, n_heads: int = 4, n_kv_heads: int = 2, d_k: int = 8,
                       theta: float = LLAMA3_THETA, dtype: torch.dtype = torch.float64,
                       impls: Sequence[str] = ("eager", "sdpa"), bound: float | None = None,
                       seed: int = 0) -> str:
    """Ours vs LlamaAttention (same weights), prefill + decode, as stable lines; AssertionError if off.

    Each line states a verdict against `bound` (BOUNDS[dtype] by default), never the raw error,
    so the text is the same on every machine. In float64 with "sdpa" in impls, one more line:
    fed the same float64 cos/sin tables, HF and ours agree to 1e-12 (float64 rounding only).
    """
    if bound is None:
        if dtype not in BOUNDS:
            raise ValueError(f"no default bound for {dtype}: pass bound= (defaults: {BOUNDS})")
        bound = BOUNDS[dtype]
    T = max(lengths) if T is None else T
    name = str(dtype).removeprefix("torch.")
    why = "HF computes RoPE in float32" if dtype == torch.float64 else f"{name} arithmetic"
    steps = "prefill only" if n_new == 0 else \
        f"prefill and {n_new} decoded token{'s' if n_new != 1 else ''}"
    lines = [f"LlamaAttention vs mha MultiHeadAttention, same weights: lengths {tuple(lengths)} "
             f"left-padded to T={T}, h={n_heads}, h_kv={n_kv_heads}, d_k={d_k}, "
             f"rope_theta={theta:g}, {name}"]
    run = {"T": T, "n_new": n_new}
    for impl in impls:
        attn = llama_attention(llama_config(impl, n_heads, n_kv_heads, d_k, theta), seed)
        twin, cfg = as_impl(attn, impl, dtype)
        ours = run_ours(from_llama_attention(twin, cfg), lengths, **run)
        err = max_err(ours, run_hf(twin, cfg, lengths, **run), lengths)
        if not err < bound:
            raise AssertionError(f"{impl} {name}: max |ours - HF| = {err:.3e} on real rows, "
                                 f"not below {_sci(bound)}")
        lines.append(f"{impl}: {steps}, real rows, max |ours - HF| below {_sci(bound)} ({why})")
        if impl == "sdpa" and dtype == torch.float64:
            exact = run_hf(twin, cfg, lengths, tables="exact", **run)
            err = max_err(ours, exact, lengths)
            if not err < 1e-12:
                raise AssertionError(f"sdpa float64, same float64 cos/sin: max |ours - HF| = "
                                     f"{err:.3e}, not below 1e-12")
            lines.append("sdpa fed float64 cos/sin tables: max |ours - HF| below 1e-12 "
                         "(float64 rounding only)")
    return "\n".join(lines)
