"""The numpy attention entry point: steps 3-6 on a named backend, the mask lowered for each.

    attention(q, k, v, mask, bias, backend=...)   -> (out, weights | None): the one call every
                                                  numpy module, cache, variant and lesson makes
    BACKENDS                                      the numpy backends (a `backends.Registry`):
        "reference"   steps 3-6 as the lessons write them (`reference_attention`); the weights
        "flash"       the tiled FlashAttention kernel of 12_flash_attention.ipynb (`mha.attention.flash`)
        "split_kv"    flash decoding: the keys split in chunks, merged by `merge_partials`
    call_needs(q, k, mask, bias, ...)             the `Call` a backend must serve, from the inputs
    repeat_kv(x, n_rep)                           grouped-query heads laid out for the core
    compute_dtype(dtype)                          the dtype steps 3-6 run in (float32 for float16)
    merge_partials(out_a, lse_a, out_b, lse_b)    the logsumexp merge of two partial results

`mask` is None, a boolean array (True = may attend) or a `masking.MaskSpec` (what may be
attended, from positions); each backend lowers it its own way: the reference builds the dense
(B|1, h|1, T, S) mask, flash walks the spec's tile schedule (skipped tiles never computed, no mask
work on full ones), split-KV masks each chunk. `bias` is added to the scaled scores (ALiBi).
The torch twin, `mha.attention.torch_attention`, has the same names.

Shape legend: B batch, h query heads, h_kv key/value heads (h_kv divides h), T queries,
S keys, d_k head width (d_v for values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mha import steps
from mha.attention.backends import Backend, Call, Registry
from mha.attention.masking import MaskSpec
from mha.validate import require_float, require_int, require_shape, shape_of


def repeat_kv(x: np.ndarray, n_rep: int) -> np.ndarray:
    """(B, h_kv, S, d_k) -> (B, h_kv * n_rep, S, d_k): each key/value head n_rep times in a row.

    Head j of the result is head j // n_rep, the order of torch's repeat_interleave and of
    SDPA's enable_gqa: query heads 0..g-1 share key/value head 0, and so on.
    """
    n_rep = require_int("n_rep", n_rep)
    require_shape("x", x, (("B", None), ("h_kv", None), ("S", None), ("d_k", None)))
    return x if n_rep == 1 else np.repeat(x, n_rep, axis=1)  # (B, h_kv * n_rep, S, d_k)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype steps 3-6 run in: float32 for float16 inputs, else the inputs' own dtype.

    float16's largest number is 65504: q and k entries of a few hundred already give scores past
    it (inf), and softmax turns inf - inf into NaN. The weights lie in [0, 1] and the outputs are
    averages of value rows, so both fit float16 again once computed. PyTorch's SDPA math path
    (`_scaled_dot_product_attention_math`) upcasts half q, k, v to float32 the same way.
    """
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def merge_partials(out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray,
                   lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Attention over keys A and B from each side's normalised (out (..., T, d_v), lse (..., T)).

    out_a is acc_a / ell_a with lse_a = m_a + log(ell_a), so exp(lse_a - lse) is the share of the
    softmax mass that A holds: out = that share times out_a plus B's, lse = logaddexp(lse_a, lse_b).
    This is the form split-KV decoding and ring attention merge; a side with lse = -inf (no keys)
    counts 0. The one logsumexp merge of the numpy library (`torch_attention.merge_partials` is
    its twin).
    """
    for name, x in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        require_float(name, x)
    require_shape("out_b", out_b, shape_of(out_a))
    require_shape("lse_a", lse_a, shape_of(out_a)[:-1])
    require_shape("lse_b", lse_b, shape_of(out_a)[:-1])
    out_dtype = np.result_type(out_a, out_b)
    work = compute_dtype(np.result_type(out_dtype, lse_a, lse_b))  # float16 parts: merged in float32
    out_a, lse_a, out_b, lse_b = (np.asarray(a, dtype=work) for a in (out_a, lse_a, out_b, lse_b))
    lse = np.logaddexp(lse_a, lse_b)  # (..., T)
    base = np.where(np.isfinite(lse), lse, 0.0)  # both sides empty: weights exp(-inf) = 0
    w_a = np.exp(lse_a - base)[..., None]  # (..., T, 1): A's share of the mass
    w_b = np.exp(lse_b - base)[..., None]  # (..., T, 1)
    return (w_a * out_a + w_b * out_b).astype(out_dtype, copy=False), lse  # out rounded once


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                        bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Steps 3-6 as the lessons write them: q (B,h,T,d_k), k, v (B,h_kv,S,d_k) -> (out, weights).

    out (B, h, T, d_k) and the weights (B, h, T, S). h_kv must divide h (grouped-query heads
    are shared, as `repeat_kv` lays them out). `mask` is boolean, True = may attend, and
    `bias` is added to the scaled scores before the mask (ALiBi, relative positions); both
    broadcast to (B, h, T, S). float16 inputs are computed in float32 and the results cast back
    (see `compute_dtype`). The "reference" backend: every other backend is tested against it.
    """
    require_shape("k", k, (("B", None), ("h_kv", None), ("S", None), ("d_k", None)))
    h, h_kv = shape_of(q)[1], shape_of(k)[1]
    if h_kv != h:
        k, v = (repeat_kv(a, group(h, h_kv)) for a in (k, v))  # (B, h, S, d_k): shared heads
    dtype, work = q.dtype, compute_dtype(q.dtype)
    if work != dtype:  # float16: the scores q.k overflow its 65504 long before the inputs do
        q, k, v = (a.astype(work) for a in (q, k, v))  # (B, h, T|S, d_k) in float32
    scores = steps.scaled_scores(q, k)  # 3) (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    if bias is not None:
        scores = scores + _broadcast("bias", bias, scores).astype(scores.dtype)  # after scaling
    if mask is not None:
        scores = steps.apply_mask(scores, mask)  # 4) -inf where masked, after the bias
    weights = steps.softmax(scores)  # 5) (B, h, T, S): rows sum to 1 (or are 0 if all masked)
    out = steps.weighted_sum(weights, v)  # 6) (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
    return out.astype(dtype, copy=False), weights.astype(dtype, copy=False)  # back to the input's


def group(h: int, h_kv: int) -> int:
    """g = h / h_kv query heads per key/value head; a clear error if h_kv does not divide h."""
    if h_kv < 1 or h % h_kv:
        raise ValueError(f"k and v must have a number of heads h_kv that divides q's h={h} "
                         f"(grouped-query attention), got h_kv={h_kv}")
    return h // h_kv


def _broadcast(name: str, a: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """a, checked to broadcast to the scores (B, h, T, S)."""
    try:
        np.broadcast_shapes(shape_of(a), shape_of(scores))
    except ValueError:
        raise ValueError(f"{name} {shape_of(a)} must broadcast to the scores (B, h, T, S) = "
                         f"{shape_of(scores)}") from None
    return a


def call_needs(q: Any, k: Any, mask: Any = None, bias: Any = None, *, weights: bool = False,
               dropout: bool = False, backward: bool = False) -> Call:
    """The Call a backend must serve for these inputs: device, dtype and the features needed."""
    needs = {"gqa"} if shape_of(k)[1] != shape_of(q)[1] else set()
    needs |= {"bias"} if bias is not None else set()
    if isinstance(mask, MaskSpec):
        needs |= mask.needs()
    elif mask is not None:
        needs.add("mask")  # an arbitrary boolean array
    needs |= {f for f, wanted in (("weights", weights), ("dropout", dropout),
                                  ("backward", backward)) if wanted}
    return Call(device="cpu", dtype=str(np.dtype(q.dtype)), needs=frozenset(needs),
                d_k=int(q.shape[-1]))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any = None,
              bias: np.ndarray | None = None, *, backend: str = "reference",
              **options: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """Steps 3-6 on the named backend: q (B,h,T,d_k), k, v (B,h_kv,S,d_k) -> (out, weights | None).

    `mask`: None, a boolean array broadcasting to (B, h, T, S) (True = may attend) or a
    `MaskSpec`; `bias` broadcasts to (B, h, T, S). The backend is checked against what the call
    needs before any work (a clear error naming what it lacks and who can serve it); `options`
    go to the backend (flash: block_q, block_k, budget, stats; split_kv: n_splits). The weights
    come back from backends that form them ("reference"), else None.
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__} "
                            f"(for tensors use mha.attention.torch_attention.attention)")
        require_float(name, a)
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    require_shape("k", k, (("B", None), ("h_kv", None), ("S", None), ("d_k", None)))
    group(shape_of(q)[1], shape_of(k)[1])  # h_kv divides h, before the backend sees them
    chosen = BACKENDS.check(backend, call_needs(q, k, mask, bias))
    return chosen.run(q, k, v, mask, bias, **options)


def _dense(mask: Any) -> np.ndarray | None:
    """The mask as a boolean array broadcasting to (B, h, T, S), or None when all is allowed."""
    return mask.dense() if isinstance(mask, MaskSpec) else mask


def _reference(q, k, v, mask, bias) -> tuple[np.ndarray, np.ndarray]:
    """The "reference" backend: the spec lowered to its dense mask, then steps 3-6."""
    return reference_attention(q, k, v, _dense(mask), bias)


def _flash(q, k, v, mask, bias, **options) -> tuple[np.ndarray, None]:
    """The "flash" backend: the tiled kernel, walking the spec's tile schedule."""
    from mha.attention import (
        flash,  # flash builds on this module's compute_dtype and merge_partials
    )

    return flash.flash_attention(q, k, v, mask=mask, bias=bias, **options)[0], None


def _split_kv(q, k, v, mask, bias, **options) -> tuple[np.ndarray, None]:
    """The "split_kv" backend: flash decoding, each key chunk masked from the spec."""
    from mha.attention import flash

    return flash.split_kv_attention(q, k, v, mask=mask, bias=bias, **options)[0], None


BACKENDS = Registry("numpy")
"""The numpy attention backends, by name; `BACKENDS.rows()` is the backend-by-feature table."""

BACKENDS.register(Backend(
    "reference", "numpy", _reference,
    supports=frozenset({"gqa", "bias", "mask", "window", "documents", "weights"}),
    note="steps 3-6 as the lessons write them; forms the (B, h, T, S) weights"))
BACKENDS.register(Backend(
    "flash", "numpy", _flash,
    supports=frozenset({"gqa", "bias", "mask", "window", "documents"}),
    note="tiled FlashAttention (12_flash_attention.ipynb): online softmax, tiles outside the mask skipped"))
BACKENDS.register(Backend(
    "split_kv", "numpy", _split_kv,
    supports=frozenset({"gqa", "bias", "mask", "window", "documents"}),
    note="flash decoding: key chunks, each with its (out, lse), merged by merge_partials"))
