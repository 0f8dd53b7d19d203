"""The torch attention core, steps 3-6, on a named backend: the twin of `mha.attention.numpy_attention`.

    attention(q, k, v, mask=None, bias=None, *, backend="sdpa", **options) -> (out, weights | None)

q (B, h, T, d_k), k, v (B, h_kv, S, d_k) with h_kv dividing h (grouped-query heads). `mask` is
None (every key), a boolean tensor (True = may attend) broadcastable to (B, h, T, S), or a
`mha.attention.masking.MaskSpec` (positions, causal, window, documents, a user mask), which each backend
lowers its own way. `bias` is added to the scaled scores (ALiBi). The backends (`BACKENDS`):

    manual   steps 3-6 written out (scores, mask, safe softmax, weights @ v); the only one that
             returns the weights (B, h, T, S); the readable reference the others must equal
    sdpa     F.scaled_dot_product_attention: no mask at all or is_causal=True where that is
             exact (`MaskSpec.sdpa_args`), so CUDA keeps its flash kernel; a dense mask otherwise
    flex     FlexAttention: the MaskSpec's BlockMask (mask_mod on positions, block-sparse),
             ALiBi as a score_mod; compiled with torch.compile where it can be (compile=False
             keeps the eager, readable path)
    triton   `mha.attention.triton_flash.flash_forward`, the tiled kernel of 12_flash_attention.ipynb in Triton: plain or
             causal attention (grouped-query heads too), nothing else; interpreted on the CPU

A call that needs what a backend lacks is refused before any work, naming what is lacking
and which backends could serve it (`mha.attention.backends`). The helpers every backend shares live
here too: `repeat_kv`, `compute_dtype`, the manual path's pieces and the logsumexp merge
`merge_partials`. Shape legend: B batch, h heads, h_kv key/value heads, T queries, S keys.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F

from mha.attention import triton_flash
from mha.attention.backends import Backend, Call, Registry
from mha.validate import mask_shape, require_bool, require_int, require_shape, require_tensor

BACKENDS = Registry("torch")
"""The torch core's backends by name: manual, sdpa, flex, triton."""

LOW_PRECISION = (torch.float16, torch.bfloat16)
"""Input dtypes the manual path computes in float32 (`compute_dtype`)."""

FLEX_COMPILED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""Dtypes compiled FlexAttention takes on the CPU (torch 2.13); float64 runs eagerly."""


# ---- shared helpers ---------------------------------------------------------------------------
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype steps 3-6 of the manual path run in: float32 for float16 / bfloat16, else dtype.

    Mixed precision as the fused kernels do it: the scores, the softmax and the weighted sum
    accumulate in float32, and only the results are rounded back to the input's dtype. A
    bfloat16 softmax would round every score to 8 significant bits first (and float16's scores
    overflow past 65504). The numpy twin does the same for float16 (`numpy_attention.compute_dtype`).
    """
    return torch.float32 if dtype in LOW_PRECISION else dtype


def upcast(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Each tensor in the dtype the manual path computes in (None stays None)."""
    return [None if t is None or not t.is_floating_point() else t.to(compute_dtype(t.dtype))
            for t in tensors]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, h_kv, S, d_k) -> (B, h_kv * n_rep, S, d_k), each head n_rep times in a row (numpy twin's order)."""
    n_rep = require_int("n_rep", n_rep)
    require_shape("x", x, (("B", None), ("h_kv", None), ("S", None), ("d_k", None)))
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)  # (B, h_kv * n_rep, S, d_k)


def causal_mask(T: int, S: int | None = None, device=None) -> torch.Tensor:
    """Boolean (T, S) tensor, True where query t may attend to key s <= t (top-left aligned)."""
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril()  # (T, S)


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A and B from each side's normalised (out (..., T, d), lse (..., T)).

    The torch twin of `numpy_attention.merge_partials`: out = share_a * out_a + share_b * out_b
    with share = exp(lse_side - lse), lse = logaddexp(lse_a, lse_b); a side with lse -inf counts 0.
    """
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        require_tensor(name, t, "(..., T, d)" if name.startswith("out") else "(..., T)")
        if not t.is_floating_point():
            raise TypeError(f"{name} must hold floating-point numbers, got dtype {t.dtype}")
    if out_a.shape != out_b.shape or lse_a.shape != out_a.shape[:-1] or lse_b.shape != lse_a.shape:
        raise ValueError(f"expected out_a, out_b of one shape (..., T, d) and lse_a, lse_b of shape "
                         f"(..., T), got {tuple(out_a.shape)}, {tuple(out_b.shape)}, "
                         f"{tuple(lse_a.shape)}, {tuple(lse_b.shape)}")
    lse = torch.logaddexp(lse_a, lse_b)  # (..., T)
    base = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # both empty: shares 0
    share_a = torch.exp(lse_a - base)[..., None]  # (..., T, 1): A's part of the softmax mass
    share_b = torch.exp(lse_b - base)[..., None]  # (..., T, 1)
    return share_a * out_a + share_b * out_b, lse


# ---- the manual path: steps 3-6 written out ---------------------------------------------------
def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis that turns an all -inf row into zeros, like mha.steps.softmax."""
    row_max = scores.amax(dim=-1, keepdim=True)  # (..., 1)
    # A fully masked row has max -inf; subtracting it would give -inf - -inf = NaN.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)  # masked scores give exp(-inf) = exactly 0
    total = e.sum(dim=-1, keepdim=True)  # (..., 1)
    # total is 0 only for a fully masked row, whose e is all zeros: divide by 1 there, so the
    # row stays 0 and no 0/0 appears (torch.where would still back-propagate NaN through it).
    return e / torch.where(total > 0, total, torch.ones_like(total))


def masked_scores(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """Steps 3-4: q (B,h,T,d_k), k (B,h,S,d_k) -> scaled scores (B,h,T,S), plus bias, -inf where masked."""
    d_k = q.shape[-1]
    # 3) scores; math.sqrt keeps the dtype (a tensor sqrt would too, but this matches numpy)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    if bias is not None:
        scores = scores + bias  # ALiBi or any additive bias, after scaling (as SDPA adds attn_mask)
    # 4) mask with -inf before softmax, so masked keys get weight exactly 0
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))  # (B, h, T, S)
    return scores


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     allowed: torch.Tensor | None = None, bias: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 3-6 written out: q (B,h,T,d_k), k, v (B,h,S,d_k) -> (out (B,h,T,d_k), weights (B,h,T,S)).

    float16 / bfloat16 inputs are computed in float32 and both results rounded back once.
    """
    dtype = q.dtype
    q, k, v, bias = upcast(q, k, v, bias)
    weights = safe_softmax(masked_scores(q, k, allowed, bias))  # 5) (B, h, T, S), rows sum to 1 (or 0)
    out = weights @ v  # 6) (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
    return out.to(dtype), weights.to(dtype)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  allowed: torch.Tensor | None = None, bias: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The manual core on one block of keys, with each row's logsumexp: -> (out (B,h,T,d_k), lse (B,h,T)).

    out is normalised over this block only; lse = log sum_s exp(score_s) is what merging blocks
    needs (`merge_partials`). A row with no allowed key gives out 0 and lse -inf.
    Both come in `compute_dtype` (float32 for float16 / bfloat16 inputs): they are partial
    results, to be merged first and rounded once at the end, as FlashAttention keeps its lse.
    """
    q, k, v, bias = upcast(q, k, v, bias)  # float16 / bfloat16: float32, as manual_attention
    scores = masked_scores(q, k, allowed, bias)  # (B, h, T, S)
    out = safe_softmax(scores) @ v  # (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k), as manual_attention
    return out, torch.logsumexp(scores, dim=-1)  # (B, h, T): -inf where every key is masked


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed=None, bias=None,
                   is_causal: bool = False, enable_gqa: bool = False,
                   dropout_p: float = 0.0) -> torch.Tensor:
    """Steps 3-6 in one fused call: q (B, h, T, d_k), k, v (B, h|h_kv, S, d_k) -> (B, h, T, d_k).

    A boolean mask goes in as is (True = may attend); with a bias, one float mask: the bias
    where allowed, -inf elsewhere. is_causal (top-left) lets kernels skip the masked half.
    """
    attn_mask = allowed
    if bias is not None:
        attn_mask = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          dropout_p=dropout_p, enable_gqa=enable_gqa)  # (B, h, T, d_k)


# ---- what a call needs -------------------------------------------------------------------------
def is_spec(mask: Any) -> bool:
    """True when `mask` is a MaskSpec (a description by positions), not a tensor or None."""
    return mask is not None and hasattr(mask, "sdpa_args") and hasattr(mask, "dense")


def call_needs(q: torch.Tensor, k: torch.Tensor, mask: Any = None, bias: Any = None,
               **options: Any) -> Call:
    """The Call this attention call makes: device, dtype and the features it needs (`backends.FEATURES`)."""
    needs = set()
    if k.shape[1] != q.shape[1]:
        needs.add("gqa")
    if bias is not None or options.get("score_mod") is not None:
        needs.add("bias")
    if is_spec(mask):
        needs |= mask.needs()
    elif mask is not None:
        needs.add("mask")
    if options.get("dropout_p", 0.0):
        needs.add("dropout")
    if options.get("need_weights"):
        needs.add("weights")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k)):
        needs.add("backward")
    dtype = str(q.dtype).removeprefix("torch.")
    return Call(device=q.device.type, dtype=dtype, needs=frozenset(needs), d_k=int(q.shape[-1]))


def _check_inputs(q: Any, k: Any, v: Any, mask: Any, bias: Any) -> None:
    """q (B, h, T, d_k), k, v (B, h_kv, S, d_k) of one float dtype and device; mask and bias fit."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, t, "(B, h, T, d_k)" if name == "q" else "(B, h_kv, S, d_k)")
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, T, d_k = q.shape
    require_shape("k", k, (("B", B), ("h_kv", None), ("S", None), ("d_k", d_k)))
    require_shape("v", v, (("B", B), ("h_kv", k.shape[1]), ("S", k.shape[2]), ("d_v", None)))
    if not q.is_floating_point() or not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one floating-point dtype, got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    h_kv, S = k.shape[1], k.shape[2]
    if h % h_kv:
        raise ValueError(f"k and v must have a number of heads h_kv that divides q's h={h} "
                         f"(grouped-query attention), got h_kv={h_kv}")
    if is_spec(mask):
        got = (tuple(mask.q_pos.shape)[-1:], tuple(mask.k_pos.shape)[-1:])
        if got != ((T,), (S,)):
            raise ValueError(f"the MaskSpec must describe T={T} queries and S={S} keys, got "
                             f"positions for {got[0][0]} queries and {got[1][0]} keys")
    elif mask is not None:
        mask_shape(mask, B, h, T, S)  # boolean, (T, S), (B, T, S) or (B|1, h|1, T, S)
    if bias is not None:
        require_tensor("bias", bias, "broadcastable to (B, h, T, S)")
        try:
            torch.broadcast_shapes(tuple(bias.shape), (B, h, T, S))
        except RuntimeError:
            raise ValueError(f"bias must broadcast to (B={B}, h={h}, T={T}, S={S}), got "
                             f"{tuple(bias.shape)}") from None


def _dense(mask: Any, B: int, h: int, T: int, S: int, device: torch.device) -> torch.Tensor | None:
    """The mask as a boolean tensor (B|1, h|1, T, S) on `device`, or None when everything is allowed."""
    if mask is None:
        return None
    if is_spec(mask):
        dense = mask.dense()
        return None if dense is None else torch.as_tensor(dense, device=device)
    mask = torch.as_tensor(mask, device=device)
    return mask.reshape(mask_shape(mask, B, h, T, S))  # (B|1, h|1, T, S)


# ---- the backends ------------------------------------------------------------------------------
def _run_manual(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any, *,
                dropout_p: float = 0.0, need_weights: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """manual: the mask made dense, k and v repeated to h heads, steps 3-6 written out."""
    B, h, T, _ = q.shape
    S, n_rep = k.shape[2], h // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, h, S, d_k): shared heads
    allowed = _dense(mask, B, h, T, S, q.device)  # (B|1, h|1, T, S) or None
    if not dropout_p:
        return manual_attention(q, k, v, allowed, bias)
    dtype = q.dtype
    q, k, v, bias = upcast(q, k, v, bias)
    weights = safe_softmax(masked_scores(q, k, allowed, bias))  # (B, h, T, S)
    out = F.dropout(weights, dropout_p) @ v  # (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
    return out.to(dtype), weights.to(dtype)


def _run_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any, *,
              enable_gqa: bool = True, dropout_p: float = 0.0) -> tuple[torch.Tensor, None]:
    """sdpa: no mask or is_causal=True where exact (`MaskSpec.sdpa_args`), else a dense mask."""
    B, h, T, _ = q.shape
    S = k.shape[2]
    if k.shape[1] != h and not require_bool("enable_gqa", enable_gqa):
        k, v = repeat_kv(k, h // k.shape[1]), repeat_kv(v, h // k.shape[1])  # (B, h, S, d_k)
    if is_spec(mask):
        allowed, is_causal = mask.sdpa_args()
        allowed = None if allowed is None else torch.as_tensor(allowed, device=q.device)
    else:
        allowed, is_causal = _dense(mask, B, h, T, S, q.device), False
    if is_causal and bias is not None:  # the bias rides in attn_mask, which is_causal excludes
        allowed, is_causal = causal_mask(T, S, device=q.device), False
    gqa = k.shape[1] != h
    return sdpa_attention(q, k, v, allowed, bias, is_causal, gqa, dropout_p), None


@functools.cache
def _compiled_flex():
    """flex_attention under torch.compile, built once (the first call compiles: tens of seconds on CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.cache
def _compiled_create_block_mask():
    """create_block_mask under torch.compile (the first call compiles; then tens of ms at T = 2048)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def flex_compiles(q: torch.Tensor) -> bool:
    """True when compiled FlexAttention takes q's dtype on its device (CPU: no float64)."""
    return q.device.type == "cuda" or q.dtype in FLEX_COMPILED_DTYPES


def alibi_score_mod(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
    """score_mod: score - slope[h] * |q_pos - k_pos|, ALiBi from positions (T,)|(B, T), (S,)|(B, S).

    Looks up per-position tensors only, as `MaskSpec.mask_mod` does, never a (T, S) table.
    """
    def mod(score, b, hh, q_idx, kv_idx):
        qp = q_pos[b, q_idx] if q_pos.ndim == 2 else q_pos[q_idx]
        kp = k_pos[b, kv_idx] if k_pos.ndim == 2 else k_pos[kv_idx]
        return score - slopes[hh] * (qp - kp).abs().to(score.dtype)

    return mod


def _lookup_mask_mod(allowed: torch.Tensor):
    """mask_mod of a user's dense boolean mask (B|1, h|1, T, S): the one case that looks a table up."""
    Bm, Hm = allowed.shape[:2]

    def mod(b, hh, q_idx, kv_idx):
        return allowed[b if Bm > 1 else 0, hh if Hm > 1 else 0, q_idx, kv_idx]

    return mod


def _bias_score_mod(bias: torch.Tensor, B: int, h: int, T: int, S: int):
    """score_mod adding a bias tensor broadcast to (B, h, T, S) (a lookup: prefer alibi_score_mod)."""
    full = bias.expand(B, h, T, S)  # (B, h, T, S) view

    def mod(score, b, hh, q_idx, kv_idx):
        return score + full[b, hh, q_idx, kv_idx]

    return mod


def flex_block_mask(mask: Any, B: int, h: int, T: int, S: int, device: torch.device,
                    compile: bool = False):
    """The BlockMask of a MaskSpec (its mask_mod; built compiled when `compile`) or of a dense
    boolean mask (a lookup); None for no mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    if mask is None:
        return None
    if is_spec(mask) and not compile:
        return mask.block_mask(B, h, T, S, device)  # eager: forms the (T, S) mask once
    if is_spec(mask):  # the spec's own mask_mod and batch / head broadcast, built compiled
        if mask.all_allowed():
            return None
        return _compiled_create_block_mask()(mask.mask_mod(device), mask.B if mask.B > 1 else None,
                                             mask.H if mask.H > 1 else None, T, S,
                                             device=str(device))
    allowed = _dense(mask, B, h, T, S, device)  # (B|1, h|1, T, S)
    Bm, Hm = allowed.shape[:2]
    return create_block_mask(_lookup_mask_mod(allowed), B if Bm > 1 else None,
                             h if Hm > 1 else None, T, S, device=str(device))


def _run_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any, *,
              compile: bool | None = None, score_mod=None, enable_gqa: bool = True
              ) -> tuple[torch.Tensor, None]:
    """flex: the mask as a BlockMask, ALiBi as a score_mod; compiled unless compile=False (or float64 on CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    B, h, T, _ = q.shape
    S = k.shape[2]
    if compile is None:
        compile = flex_compiles(q)
    elif require_bool("compile", compile) and not flex_compiles(q):
        raise ValueError(f"compiled FlexAttention takes {', '.join(map(str, FLEX_COMPILED_DTYPES))} "
                         f"on the CPU, got {q.dtype}: pass compile=False (eager) or convert")
    if k.shape[1] != h and not require_bool("enable_gqa", enable_gqa):
        k, v = repeat_kv(k, h // k.shape[1]), repeat_kv(v, h // k.shape[1])  # (B, h, S, d_k)
    if score_mod is not None and bias is not None:
        raise ValueError("give flex either bias= (a tensor) or score_mod=, not both")
    if bias is not None:
        score_mod = _bias_score_mod(bias, B, h, T, S)
    block_mask = flex_block_mask(mask, B, h, T, S, q.device, compile)
    run = _compiled_flex() if compile else flex_attention
    out = run(q, k, v, score_mod=score_mod, block_mask=block_mask,
              enable_gqa=k.shape[1] != h)  # (B, h, T, d_k)
    return out, None


def _run_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any, *,
                block_q: int = 64, block_k: int = 64) -> tuple[torch.Tensor, None]:
    """triton: the tiled kernel, causal as the staircase with an offset (the only mask it takes)."""
    causal, offset = False, 0
    if is_spec(mask) and mask.causal:
        causal, offset = True, mask.causal_offset()
    out, _ = triton_flash.flash_forward(q, k, v, causal=causal, offset=offset,
                                        block_q=block_q, block_k=block_k)  # (B, h, T, d_k)
    return out, None


def _flex_available() -> bool:
    """True when this torch has FlexAttention (torch >= 2.5)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


ALL_DTYPES = ("float16", "bfloat16", "float32", "float64")
BACKENDS.register(Backend(
    "manual", "torch", _run_manual,
    supports=frozenset({"gqa", "bias", "mask", "window", "documents", "dropout", "backward",
                        "weights"}),
    devices=("cpu", "cuda"), dtypes=ALL_DTYPES,
    note="steps 3-6 written out; keeps the weights; the reference"))
BACKENDS.register(Backend(
    "sdpa", "torch", _run_sdpa,
    supports=frozenset({"gqa", "bias", "mask", "window", "documents", "dropout", "backward"}),
    devices=("cpu", "cuda"), dtypes=ALL_DTYPES,
    note="F.scaled_dot_product_attention; no mask or is_causal where exact, else a dense mask"))
BACKENDS.register(Backend(
    "flex", "torch", _run_flex,
    supports=frozenset({"gqa", "bias", "mask", "window", "documents"}),
    devices=("cpu", "cuda"), dtypes=ALL_DTYPES, available=_flex_available,
    note="FlexAttention with a BlockMask, ALiBi as score_mod; compiled (float64 on CPU: eager); "
         "no CPU backward"))
BACKENDS.register(Backend(
    "triton", "torch", _run_triton,
    supports=frozenset({"gqa"}),
    devices=("cpu", "cuda"), dtypes=ALL_DTYPES, available=triton_flash.available,
    head_dims=(lambda d: d >= 16 and d & (d - 1) == 0, "powers of two from 16"),
    note="the tiled kernel of 12_flash_attention.ipynb in Triton; plain or causal only; interpreted on CPU"))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any = None,
              bias: torch.Tensor | None = None, *, backend: str = "sdpa", **options: Any
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps 3-6 on a named backend: q (B,h,T,d_k), k, v (B,h_kv,S,d_k) -> (out (B,h,T,d_k), weights | None).

    `mask`: None, a boolean tensor (True = may attend) broadcastable to (B, h, T, S) or a
    MaskSpec; `bias` broadcast to (B, h, T, S) is added to the scaled scores. Only "manual"
    returns the weights (B, h, T, S). `options` go to the backend: dropout_p (manual, sdpa),
    enable_gqa (sdpa, flex), compile and score_mod (flex), block_q / block_k (triton),
    need_weights (asks for a backend that returns them). The backend is checked against what
    the call needs first (`BACKENDS.check`): a ValueError names what it lacks and who can serve.
    """
    _check_inputs(q, k, v, mask, bias)
    chosen = BACKENDS.check(backend, call_needs(q, k, mask, bias, **options))
    options.pop("need_weights", None)
    takes = backend_options(chosen)
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise TypeError(f"the torch backend {backend!r} takes the options {takes or 'none'}, got "
                        f"{', '.join(unknown)}")
    return chosen.run(q, k, v, mask, bias, **options)


def backend_options(backend: Backend) -> tuple[str, ...]:
    """The keyword options a backend's run takes (its keyword-only parameters)."""
    params = inspect.signature(backend.run).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
