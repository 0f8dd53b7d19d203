"""The seven steps of multi-head attention, each a small pure numpy function.

Shape legend, used in every comment of the package:
    B batch, T query length, S key length, d_model model width,
    h heads, d_k = d_model // h (width of one head).

The steps are numbered 1-7 to match the notebooks:
    1) linear projection      x @ W + b                       (B, T, d_model)
    2) split heads            (B, T, d_model) -> (B, h, T, d_k)
    3) scaled scores          q k^T / sqrt(d_k)               (B, h, T, S)
    4) mask                   disallowed scores -> -inf        (B, h, T, S)
    5) softmax                rows become probabilities        (B, h, T, S)
    6) weighted sum           weights @ v                      (B, h, T, d_k)
    7) merge heads            (B, h, T, d_k) -> (B, T, d_model), then project again with step 1

Every step keeps the dtype it is given: float32 in, float32 out.
"""

from __future__ import annotations

import math

import numpy as np

from mha.validate import require_float, require_int, require_shape, shape_of


# 1) Linear projection -------------------------------------------------------------
def linear(x: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Project the last axis: x @ W + b, (..., d_in) -> (..., d_out)."""
    require_float("x", x)
    if W.ndim != 2 or x.shape[-1] != W.shape[0]:
        raise ValueError(
            f"W must be (d_in={x.shape[-1]}, d_out) to multiply x of shape {shape_of(x)}, "
            f"got {shape_of(W)}"
        )
    require_shape("b", b, (("d_out", W.shape[1]),))
    return x @ W + b  # (..., d_in) @ (d_in, d_out) -> (..., d_out)


# 2) Split heads -------------------------------------------------------------------
def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """Give each head its own slice of the features: (B, T, d_model) -> (B, h, T, d_k)."""
    require_shape("x", x, (("B", None), ("T", None), ("d_model", None)))
    n_heads = require_int("n_heads", n_heads)
    B, T, d_model = x.shape
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
    d_k = d_model // n_heads
    x = x.reshape(B, T, n_heads, d_k)  # (B, T, h, d_k): head j owns columns j*d_k:(j+1)*d_k
    return x.transpose(0, 2, 1, 3)  # (B, h, T, d_k): heads become a batch axis


# 3) Scaled scores -----------------------------------------------------------------
def scaled_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Similarity of every query with every key, scaled: q k^T / sqrt(d_k) -> (B, h, T, S)."""
    require_float("q", q)
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, _, d_k = q.shape
    require_shape("k", k, (("B", B), ("h", h), ("S", None), ("d_k", d_k)))
    # Why scale: with unit-variance q and k, q.k has variance d_k; dividing by sqrt(d_k)
    # brings it back to ~1 so softmax does not saturate. math.sqrt keeps float32 as float32
    # (NumPy 2 would promote `f32 / np.sqrt(d_k)` to float64).
    return (q @ k.swapaxes(-1, -2)) / math.sqrt(d_k)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)


# 4) Mask --------------------------------------------------------------------------
def causal_mask(T: int, S: int | None = None, offset: int = 0) -> np.ndarray:
    """Boolean (T, S) matrix, True where query t may attend to key s <= t + offset.

    offset=0: with S != T the diagonal starts at the top-left corner, as in torch's
    `scaled_dot_product_attention(is_causal=True)`. offset=S-T aligns it bottom-right,
    as a chunk of T new queries after S-T cached keys needs (a KV cache's prefill).
    """
    T = require_int("T", T)
    S = T if S is None else require_int("S", S)
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer):
        raise TypeError(f"offset must be an int, got {type(offset).__name__} {offset!r}")
    return np.tril(np.ones((T, S), dtype=bool), k=int(offset))  # (T, S): the staircase


def apply_mask(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Set scores where `allowed` is False to -inf, so softmax gives them exactly zero weight."""
    require_float("scores", scores)
    if allowed.dtype != np.bool_:
        raise TypeError(f"allowed must be a boolean array, got dtype {allowed.dtype}")
    try:
        np.broadcast_shapes(allowed.shape, scores.shape)
    except ValueError:
        raise ValueError(
            f"allowed {shape_of(allowed)} must broadcast to scores {shape_of(scores)}"
        ) from None
    # Masked keys must get weight exactly 0.0, so outputs before t stay bit-identical when
    # inputs after t change. In a row with an allowed key, -1e9 or finfo.min would do that too
    # (exp underflows to exactly 0 in float32/64). -inf is chosen for the edge cases: a fully
    # masked row stays recognisable (softmax returns zeros, where a finite fill would spread
    # the weight uniformly over keys that were all forbidden), and -inf cannot overflow in
    # float16, where finite fills do (-1e9 already is -inf there; finfo.min - max overflows).
    return np.where(allowed, scores, np.array(-np.inf, dtype=scores.dtype))  # (B, h, T, S)


# 5) Softmax -----------------------------------------------------------------------
def softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along `axis`; a row that is all -inf becomes all zeros."""
    require_float("scores", scores)
    row_max = scores.max(axis=axis, keepdims=True)
    # Subtracting the row max changes nothing mathematically (it cancels in the ratio)
    # but keeps exp() <= 1, so large logits cannot overflow to inf. A fully masked row
    # has max -inf; use 0 there so we compute exp(-inf) = 0 instead of -inf - -inf = NaN.
    row_max = np.where(np.isfinite(row_max), row_max, np.zeros_like(row_max))
    e = np.exp(scores - row_max)
    total = e.sum(axis=axis, keepdims=True)
    # A row with nothing allowed has total 0: return zeros for it rather than NaN.
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def masked_softmax(scores: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """Steps 4 then 5: mask the scores with -inf, then softmax (the order matters)."""
    return softmax(scores if allowed is None else apply_mask(scores, allowed))


# 6) Weighted sum ------------------------------------------------------------------
def weighted_sum(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Mix value rows by attention weights: (B, h, T, S) @ (B, h, S, d_k) -> (B, h, T, d_k)."""
    require_float("weights", weights)
    require_shape("weights", weights, (("B", None), ("h", None), ("T", None), ("S", None)))
    B, h, _, S = weights.shape
    require_shape("v", v, (("B", B), ("h", h), ("S", S), ("d_k", None)))
    return weights @ v  # (B, h, T, S) @ (B, h, S, d_k) -> (B, h, T, d_k)


# 7) Merge heads -------------------------------------------------------------------
def merge_heads(x: np.ndarray) -> np.ndarray:
    """Undo split_heads: (B, h, T, d_k) -> (B, T, d_model) with d_model = h * d_k."""
    require_shape("x", x, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, T, d_k = x.shape
    # Transpose back first: reshaping (B, h, T, d_k) directly would interleave tokens of
    # different heads into one row - right shape, silently wrong values.
    x = x.transpose(0, 2, 1, 3)  # (B, T, h, d_k)
    return x.reshape(B, T, h * d_k)  # (B, T, d_model)
