"""Position encodings the attention core is given: RoPE rotates q and k, ALiBi biases the scores.

Shape legend: B batch, h heads, T queries, S keys, d_k head width. Positions are whole numbers,
shaped (T,) (shared by the batch) or (B, T) (one row per sequence: a left-padded batch starts
each sentence at 0 where its own tokens start). A negative position marks padding.

    rope(x, positions, base, pairing)   rotate every feature pair of q or k (numpy or torch)
    rope_permutation(d_k)               the feature order that turns interleaved pairs into halves
    alibi_slopes(h)                     one penalty slope per head (Press et al., 2022)
    alibi_bias(h, T, S, offset)         (h, T, S) bias for positions 0..T-1 after `offset`
    position_bias(slopes, q_pos, k_pos) the same from any query / key positions (B|1, h, T, S)

RoPE pairings. "half" (GPT-NeoX, Hugging Face Llama's `rotate_half`) pairs feature i with
i + d_k/2; "interleaved" (RoFormer, GPT-J, Meta's original Llama) pairs 2i with 2i + 1. Both
turn pair i by position * theta_i, so they differ only by where each pair's two features sit:
interleaved features taken in `rope_permutation(d_k)` order are the half-split layout, and a
model's q/k projection columns permuted that way give the same scores (Hugging Face's Llama
conversion script permutes the checkpoint exactly so).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from mha.validate import is_torch, require_float, require_int, shape_of, torch  # torch: lazy

PAIRINGS = ("half", "interleaved")
"""RoPE's two ways of pairing features: (i, i + d_k/2) or (2i, 2i + 1)."""


# ---- RoPE: rotary position embedding -------------------------------------------------------------
def rope_frequencies(d_k: int, base: float = 10000.0) -> np.ndarray:
    """(d_k/2,) angular speeds theta_i = base^(-2i/d_k): pair 0 turns 1 rad per position, the last slowest."""
    d_k = require_int("d_k", d_k)
    if d_k % 2:
        raise ValueError(f"RoPE turns features in pairs, so d_k must be even, got d_k={d_k}")
    if isinstance(base, bool) or not isinstance(base, int | float) or not base > 1:
        raise ValueError(f"base must be a number > 1 (the usual one is 10000.0), got {base!r}")
    return float(base) ** (-np.arange(0, d_k, 2, dtype=np.float64) / d_k)  # (d_k/2,)


def check_positions(positions: Any, T: int, B: int | None = None) -> np.ndarray:
    """Return positions as (T,) or (B, T) int64 numpy; the default is 0..T-1."""
    if positions is None:
        return np.arange(T)
    p = positions.detach().cpu().numpy() if is_torch(positions) else np.asarray(positions)
    if p.ndim not in (1, 2) or p.shape[-1] != T or (p.ndim == 2 and B is not None and p.shape[0] != B):
        raise ValueError(f"positions must be (T={T},) or (B{'' if B is None else f'={B}'}, T={T}), "
                         f"one whole number per token, got shape {p.shape}")
    if not np.issubdtype(p.dtype, np.integer):
        raise TypeError(f"positions must hold whole numbers (an int array), got dtype {p.dtype}")
    return p.astype(np.int64)


def _torch_positions(positions: Any, T: int, x: Any) -> Any:
    """Positions for a torch x: a (T,) or (B, T) int64 tensor on x's device (default 0..T-1)."""
    if positions is None:
        return torch.arange(T, device=x.device)
    if not is_torch(positions):
        return torch.as_tensor(check_positions(positions, T), device=x.device)
    if positions.dim() not in (1, 2) or positions.shape[-1] != T:
        raise ValueError(f"positions must be (T={T},) or (B, T={T}), one whole number per token, "
                         f"got shape {tuple(positions.shape)}")
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise TypeError(f"positions must hold whole numbers (an int array), got dtype {positions.dtype}")
    return positions.to(x.device)


def rope_tables(positions: Any, d_k: int, base: float = 10000.0,
                pairing: str = "half") -> tuple[Any, Any]:
    """cos and sin of every angle for positions (..., T): two (..., T, d_k) float64 tables.

    "half" repeats the d_k/2 angles as [angles, angles]; "interleaved" as a0 a0 a1 a1 ...
    Computed in float64 whatever x's dtype: position * theta reaches thousands of radians, and
    float32 would lose the angle's fractional part that the rotation depends on. Torch
    positions give torch tables on their device (no trip through host memory).
    """
    theta = rope_frequencies(d_k, base)  # (d_k/2,)
    if is_torch(positions):
        theta = torch.as_tensor(theta, device=positions.device)  # float64
        angles = positions.to(torch.float64)[..., None] * theta  # (..., T, d_k/2)
        half = _pairing(pairing) == "half"
        angles = torch.cat([angles, angles], -1) if half else angles.repeat_interleave(2, -1)
        return angles.cos(), angles.sin()  # 2 x (..., T, d_k)
    p = np.asarray(positions, dtype=np.float64)  # (..., T)
    angles = p[..., None] * theta  # (..., T, 1) * (d_k/2,) -> (..., T, d_k/2)
    if _pairing(pairing) == "half":
        angles = np.concatenate([angles, angles], axis=-1)  # (..., T, d_k): pair i in both halves
    else:
        angles = np.repeat(angles, 2, axis=-1)  # (..., T, d_k): pair i at features 2i, 2i+1
    return np.cos(angles), np.sin(angles)


def _pairing(pairing: str) -> str:
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    return pairing


def rotate_half(x: Any) -> Any:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis: a quarter turn of every pair."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (..., d_k/2) each
    if is_torch(x):
        return torch.cat([-x2, x1], dim=-1)  # (..., d_k)
    return np.concatenate([-x2, x1], axis=-1)  # (..., d_k)


def rotate_pairs(x: Any) -> Any:
    """(a0, b0, a1, b1, ...) -> (-b0, a0, -b1, a1, ...): a quarter turn of every adjacent pair."""
    a, b = x[..., 0::2], x[..., 1::2]  # (..., d_k/2) each
    if is_torch(x):
        return torch.stack([-b, a], dim=-1).flatten(-2)  # (..., d_k/2, 2) -> (..., d_k)
    return np.stack([-b, a], axis=-1).reshape(shape_of(x))  # (..., d_k/2, 2) -> (..., d_k)


def _rotate(x: Any, cos: np.ndarray, sin: np.ndarray, pairing: str = "half") -> Any:
    """x * cos + quarter_turn(x) * sin with float64 tables cast to x's dtype (and device)."""
    if is_torch(x):
        cos, sin = (torch.as_tensor(t, device=x.device).to(x.dtype) for t in (cos, sin))
    else:
        cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    turn = rotate_half if pairing == "half" else rotate_pairs
    # pair i: (a, b) -> (a cos - b sin, b cos + a sin), a rotation by the pair's angle
    return x * cos + turn(x) * sin  # (..., T, d_k) * (T, d_k) or (B, 1, T, d_k) -> (..., T, d_k)


def rope(x: Any, positions: Any = None, base: float = 10000.0, pairing: str = "half") -> Any:
    """Rotate every feature pair of x (..., T, d_k) by position * theta_i; numpy or torch, dtype kept.

    positions: (T,) whole numbers, default 0..T-1 (give S - T + arange(T) to a chunk that follows
    S - T cached tokens), or (B, T) for x (B, h, T, d_k), one row per sequence.
    """
    require_float("x", x)
    shape = shape_of(x)
    if len(shape) < 2:
        raise ValueError(f"x must be (..., T, d_k), at least 2-D, got {shape}")
    T, d_k = shape[-2:]
    if d_k % 2:
        raise ValueError(f"RoPE turns features in pairs, so d_k must be even, got d_k={d_k} "
                         f"(x of shape {shape})")
    p = _torch_positions(positions, T, x) if is_torch(x) else check_positions(positions, T)
    batch_ok = p.ndim == 1 or (len(shape) == 4 and shape[0] == p.shape[0])
    if is_torch(x) and T > 0 and batch_ok:  # decoding's path: table rows looked up, not made
        return _cached_rotation(x, p, base, _pairing(pairing))
    if p.ndim == 2:
        if len(shape) != 4 or shape[0] != p.shape[0]:
            raise ValueError(f"positions (B, T) = {tuple(p.shape)} need x (B={p.shape[0]}, h, "
                             f"T={T}, d_k), got {shape}")
        p = p[:, None, :]  # (B, 1, T): the same positions for every head
    cos, sin = rope_tables(p, d_k, base, pairing)  # 2 x (T, d_k) or (B, 1, T, d_k), float64
    return _rotate(x, cos, sin, _pairing(pairing))  # (..., T, d_k)


def _cached_rotation(x: Any, p: Any, base: float, pairing: str) -> Any:
    """rope for torch x from a cached table of positions -m..n-1, pads' negative positions included.

    Decoding rotates one token per step and layer: looking its row up in a table made once (in
    float64, then cast to x's dtype) gives the same numbers as computing it, without a dozen
    small kernel launches per call. A left-padded batch's pads (negative positions) read the
    table's rows below 0, so their numbers are unchanged too.
    """
    lo, hi = (int(v) for v in torch.aminmax(p))
    n = max(64, 1 << hi.bit_length()) if hi >= 0 else 0  # grow by doubling: few sizes are cached
    m = 1 << (-lo - 1).bit_length() if lo < 0 else 0  # rows below 0: m >= -lo, a power of two
    cos, sin = _table(m, n, shape_of(x)[-1], float(base), pairing, str(x.device), x.dtype)
    at = p[:, None, :] if p.ndim == 2 else p  # (B, 1, T) for per-sequence positions, else (T,)
    at = at + m if m else at  # position q sits at row q + m
    turn = rotate_half if pairing == "half" else rotate_pairs
    return x * cos[at] + turn(x) * sin[at]  # (..., T, d_k) * (.., T, d_k) -> (..., T, d_k)


@functools.lru_cache(maxsize=64)
def _table(m: int, n: int, d_k: int, base: float, pairing: str, device: str,
           dtype: Any) -> tuple[Any, Any]:
    """cos, sin (m + n, d_k) of positions -m..n-1 (row q + m is position q): float64, cast once."""
    cos, sin = rope_tables(torch.arange(-m, n, device=device), d_k, base, pairing)  # float64
    return cos.to(dtype), sin.to(dtype)


def rope_permutation(d_k: int) -> np.ndarray:
    """(d_k,) feature order: interleaved features x[..., perm] are laid out as the half split.

    perm = [0, 2, 4, ..., 1, 3, 5, ...]: pair i's two features (2i, 2i+1) move to (i, i + d_k/2).
    So rope(x[..., perm], pairing="half") == rope(x, pairing="interleaved")[..., perm].
    """
    d_k = require_int("d_k", d_k)
    if d_k % 2:
        raise ValueError(f"RoPE pairs need an even d_k, got d_k={d_k}")
    return np.concatenate([np.arange(0, d_k, 2), np.arange(1, d_k, 2)])  # (d_k,)


# ---- ALiBi: a linear penalty on distance, one slope per head ---------------------------------------
def _geometric(p: int) -> np.ndarray:
    """(p,) slopes for p heads (p a power of two): 2^(-8/p), 2^(-16/p), ..., 2^(-8)."""
    return 2.0 ** (-8.0 * np.arange(1, p + 1) / p)


def alibi_slopes(n_heads: int) -> np.ndarray:
    """(h,) float64 ALiBi slopes: geometric for a power of two; otherwise the paper's rule.

    For h not a power of two, take the 2^floor(log2 h) slopes, then every other slope of the
    next power of two's sequence until there are h (Press et al., 2022, and their code).
    """
    n = require_int("n_heads", n_heads)
    p = 2 ** int(math.floor(math.log2(n)))  # the largest power of two <= n
    extra = _geometric(2 * p)[0::2][: n - p]  # (n - p,): slopes in between p's, the steep ones first
    return np.concatenate([_geometric(p), extra])  # (h,)


def alibi_bias(n_heads: int, T: int, S: int | None = None, offset: int = 0) -> np.ndarray:
    """(h, T, S) float64: -slope_head * |distance|, 0 where query t + offset and key s coincide.

    Query t sits at position t + offset (offset = S - T for a chunk after a cache). Keys behind
    the query get -slope * (t + offset - s); keys AHEAD get -slope * (s - t - offset) as well (a
    symmetric penalty): a causal mask removes them anyway, and without one this is the natural
    bidirectional choice. Add it to the scores after scaling, like SDPA's float attn_mask.
    """
    T = require_int("T", T)
    S = T if S is None else require_int("S", S)
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer):
        raise TypeError(f"offset must be an int, got {type(offset).__name__} {offset!r}")
    return position_bias(alibi_slopes(n_heads), np.arange(T) + offset, np.arange(S))[0]  # (h, T, S)


def position_bias(slopes: Any, q_pos: Any, k_pos: Any) -> Any:
    """ALiBi from positions: slopes (h,), q_pos (T,)|(B, T), k_pos (S,)|(B, S) -> (B|1, h, T, S).

    numpy in, float64 numpy out; torch in (slopes a tensor), a tensor of the slopes' dtype out.
    """
    distance = abs(q_pos[..., :, None] - k_pos[..., None, :])  # (B|., T, S) whole numbers
    if distance.ndim == 2:
        distance = distance[None]  # (1, T, S)
    if is_torch(slopes):
        distance = distance.to(slopes.dtype)
    # slope * -distance (not -(slope * distance)): the diagonal stays +0.0, not -0.0
    return slopes[None, :, None, None] * -distance[:, None]  # (1, h, 1, 1) * (B|1, 1, T, S)


def torch_alibi_bias(n_heads: int, T: int, S: int | None = None, offset: int = 0,
                     dtype: Any = None, device: Any = None) -> Any:
    """alibi_bias as a torch tensor (h, T, S) of `dtype` (default float32) on `device`."""
    dtype = torch.float32 if dtype is None else dtype
    return torch.as_tensor(alibi_bias(n_heads, T, S, offset), dtype=dtype, device=device)
