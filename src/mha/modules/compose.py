"""How the features beyond the toy hook into the seven steps, for the numpy and torch modules alike.

The attention entry points (`numpy_attention.attention`, `torch_attention.attention`) take q, k, v, a
mask and an additive bias, and nothing else. Every production feature becomes one of those
inputs, computed here from token POSITIONS (the mask as one `masking.MaskSpec`, `mask_spec`,
which each backend lowers: no mask or is_causal for SDPA, a BlockMask for Flex, tiles for flash):

    n_kv_heads   k and v are projected to h_kv heads; the core shares each among h / h_kv queries
    rope         q and k are rotated by their positions after step 2 (mha.attention.posenc.rope)
    alibi        bias = -slope_head * |q_pos - k_pos|, added to the scaled scores
    causal       mask: k_pos <= q_pos (so a chunk after a cache is aligned bottom-right for free)
    window       mask: q_pos - k_pos < window (a causal band; the cache then keeps `window` keys)
    padding      a NEGATIVE position marks a pad token: mask k_pos >= 0, so no query reads it
    documents    a MaskSpec given as `mask` (packed sequences) keeps each query in its document
    cache        k, v (and their positions) are appended, and the queries read all of them

Positions are (T,) for the whole batch or (B, T) per sequence (`padded_positions` makes them
for a left-padded batch). Shape legend: B batch, T queries, S keys, h heads, d_k head width.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha.attention.masking import MaskSpec, as_numpy
from mha.attention.posenc import PAIRINGS, alibi_slopes, position_bias, rope
from mha.validate import (  # torch: lazy
    is_torch,
    mask_shape,
    require_bool,
    require_int,
    shape_of,
    torch,
)


@dataclass(frozen=True)
class Options:
    """The features a module composes around its core; fixed when the module is built."""

    n_kv_heads: int  # key/value heads (h for MHA, 1 for MQA)
    rope: str | None = None  # None, "half" or "interleaved"
    rope_base: float = 10000.0
    alibi: bool = False
    window: int | None = None  # keys a query may read, its own included

    def kwargs(self) -> dict:
        """The options as keyword arguments of a module's constructor."""
        return {"n_kv_heads": self.n_kv_heads, "rope": self.rope, "rope_base": self.rope_base,
                "alibi": self.alibi, "window": self.window}

    def describe(self, n_heads: int) -> str:
        """The options that differ from plain multi-head attention, as `name=value` text."""
        parts = [f"n_kv_heads={self.n_kv_heads}"] if self.n_kv_heads != n_heads else []
        parts += [f"rope={self.rope!r}"] if self.rope else []
        parts += ["alibi=True"] if self.alibi else []
        parts += [f"window={self.window}"] if self.window is not None else []
        return ", ".join(parts)


def require_causal(causal: Any, window: int | None) -> bool:
    """causal as a bool, checked against the module's window before anything (a cache) changes."""
    causal = require_bool("causal", causal)
    if window is not None and not causal:
        raise ValueError(f"window={window} is a causal band (a query reads its last {window} keys): "
                         f"call with causal=True")
    return causal


def require_rope_base(rope_base: Any) -> float:
    """RoPE's base as a float: a finite real number > 1 (theta_i = base^(-2i/d_k) must fall)."""
    if isinstance(rope_base, bool | np.bool_) or not isinstance(rope_base, numbers.Real):
        raise TypeError(f"rope_base must be a real number > 1 (the usual one is 10000.0), got "
                        f"{type(rope_base).__name__} {rope_base!r}")
    if not (math.isfinite(rope_base) and rope_base > 1):
        raise ValueError(f"rope_base must be a finite number > 1 (the usual one is 10000.0; at "
                         f"<= 1 the pairs no longer turn slower one after another), got {rope_base!r}")
    return float(rope_base)


def check_options(n_heads: int, d_k: int, n_kv_heads: int | None = None, rope: str | None = None,
                  rope_base: float = 10000.0, alibi: bool = False,
                  window: int | None = None) -> Options:
    """Validate a module's options against its n_heads and d_k; return them as Options.

    Every option is checked, used or not (a NaN rope_base without rope is still a mistake).
    """
    n_kv = n_heads if n_kv_heads is None else require_int("n_kv_heads", n_kv_heads)
    if n_heads % n_kv:
        valid = ", ".join(str(d) for d in range(1, n_heads + 1) if n_heads % d == 0)
        raise ValueError(f"n_kv_heads={n_kv} must divide n_heads={n_heads} (each key/value head "
                         f"serves n_heads / n_kv_heads query heads); n_kv_heads could be one of {valid}")
    if rope is not None and not isinstance(rope, str):
        raise TypeError(f"rope must be None or one of {PAIRINGS}, got {type(rope).__name__} {rope!r}")
    if rope is not None:
        if rope not in PAIRINGS:
            raise ValueError(f"rope must be None or one of {PAIRINGS}, got {rope!r}")
        if d_k % 2:
            raise ValueError(f"RoPE turns features in pairs, so d_k = d_model / n_heads must be "
                             f"even, got d_k={d_k}")
    rope_base = require_rope_base(rope_base)
    alibi = require_bool("alibi", alibi)
    window = None if window is None else require_int("window", window)
    return Options(n_kv, rope, rope_base, alibi, window)


def _arange(n: int, like: Any) -> Any:
    """0..n-1 as int64, numpy or torch (on like's device) to match `like`."""
    return torch.arange(n, device=like.device) if is_torch(like) else np.arange(n)


def as_positions(positions: Any) -> Any:
    """An array or tensor as it is; a (nested) list or tuple of ints as an int64 numpy array.

    Lists give the same answer as the array they spell; anything that is not whole numbers
    (floats, bools, text, ragged rows) is refused with what arrived.
    """
    if hasattr(positions, "shape") and hasattr(positions, "dtype"):
        return positions
    if not isinstance(positions, list | tuple):
        raise TypeError(f"positions must be an int array (T,) or (B, T), or a list of ints, got "
                        f"{type(positions).__name__} {positions!r}")
    flat = list(_leaves(positions))
    bad = next((v for v in flat if isinstance(v, bool | np.bool_)
                or not isinstance(v, int | np.integer)), None)
    if bad is not None or not flat:
        what = "nothing" if not flat else f"{type(bad).__name__} {bad!r}"
        raise TypeError(f"positions must be whole numbers, one per token, got a list holding {what}")
    try:
        return np.array(positions, dtype=np.int64)
    except ValueError:  # ragged rows
        raise ValueError(f"positions must be (T,) or (B, T): rows of one length, got rows of "
                         f"lengths {[len(r) if isinstance(r, list | tuple) else 1 for r in positions]}"
                         ) from None


def _leaves(x: Any) -> Any:
    """The non-list items of a nested list or tuple, in order."""
    for v in x:
        if isinstance(v, list | tuple):
            yield from _leaves(v)
        else:
            yield v


def query_positions(positions: Any, B: int, T: int, cache: Any, like: Any) -> Any:
    """Positions of the T new tokens: (T,) or (B, T) ints, numpy or torch to match `like`.

    Given positions are checked; otherwise 0..T-1, or, after a cache, each sequence's next
    positions (one past the largest it holds, so a left-padded batch goes on where it stood).
    """
    if positions is None:
        if cache is None or len(cache) == 0:
            return _arange(T, like)  # (T,)
        return cache.next_positions()[:, None] + _arange(T, like)  # (B, 1) + (T,) -> (B, T)
    positions = as_positions(positions)
    got = shape_of(positions)
    if len(got) not in (1, 2) or got[-1] != T or (len(got) == 2 and got[0] != B):
        raise ValueError(f"positions must be (T={T},) or (B={B}, T={T}), one whole number per "
                         f"token, got shape {got}")
    if "int" not in str(positions.dtype):  # numpy int8..uint64, torch.int32/int64
        raise TypeError(f"positions must hold whole numbers (an int array), got dtype {positions.dtype}")
    if is_torch(like):
        return torch.as_tensor(positions, dtype=torch.int64, device=like.device)
    if is_torch(positions):
        raise TypeError("positions must be a numpy array for the numpy module, got a torch.Tensor")
    return positions.astype(np.int64)


def rotate(x: Any, pos: Any, opts: Options) -> Any:
    """RoPE on q or k (B, heads, T, d_k) at positions (T,) or (B, T), if the module uses it."""
    if opts.rope is None:
        return x
    return rope(x, pos, opts.rope_base, opts.rope)  # (B, heads, T, d_k)


def mask_spec(q_pos: Any, k_pos: Any, causal: bool, window: int | None, mask: Any, B: int,
              h: int) -> MaskSpec:
    """The description of what this call may attend (`masking.MaskSpec`), from the module's
    positions, causal flag, window and the caller's `mask`.

    q_pos (T,)|(B, T), k_pos (S,)|(B, S) (the cache's keys included). `mask` is None, a boolean
    array (True = may attend; (T, S), (B, T, S) or (B|1, h|1, T, S)) or a MaskSpec, whose
    documents, user mask, pad keys and causal / window join the module's positions.
    """
    if window is not None and not causal:
        raise ValueError(f"window={window} is a causal band (a query reads its last {window} keys): "
                         f"call with causal=True")
    T, S = shape_of(q_pos)[-1], shape_of(k_pos)[-1]
    q_doc = k_doc = user = None
    if isinstance(mask, MaskSpec):
        if (mask.T, mask.S) != (T, S):
            raise ValueError(f"the MaskSpec describes T={mask.T} queries and S={mask.S} keys, but "
                             f"this call has T={T} and S={S} (keys from a cache included)")
        move = (lambda a: a) if is_torch(q_pos) else (lambda a: None if a is None else as_numpy(a))
        q_doc, k_doc, user = move(mask.q_doc), move(mask.k_doc), move(mask.user)
        if user is not None:
            mask_shape(user, B, h, T, S)  # its batch and heads must fit this call
        if bool((mask.k_pos < 0).any()):  # the spec's pad keys stay pads
            pads = move(mask.k_pos) < 0  # (S,)|(B, S)
            k_pos = torch.where(pads, -1, k_pos) if is_torch(k_pos) else np.where(pads, -1, k_pos)
        causal, window = causal or mask.causal, mask.window if window is None else window
    elif mask is not None:
        user = mask.reshape(mask_shape(mask, B, h, T, S))  # (B|1, h|1, T, S)
        user = torch.as_tensor(user, device=q_pos.device) if is_torch(q_pos) else user
    return MaskSpec(q_pos, k_pos, causal, window, q_doc, k_doc, user)


def allowed(q_pos: Any, k_pos: Any, causal: bool, window: int | None, mask: Any, B: int,
            h: int) -> Any:
    """The boolean mask (B|1, h|1, T, S) the core gets (True = may attend), or None if all may.

    `mask_spec(...).dense()`: for callers that need the tensor (a ring's block rule).
    """
    return mask_spec(q_pos, k_pos, causal, window, mask, B, h).dense()


def check_cache(module: Any, cache: Any, cache_type: type | tuple[type, ...], B: int, T: int,
                context: Any, mask: Any) -> None:
    """Check that `cache` (or None) fits this module and call, before anything is written to it.

    `cache_type`: the cache class, or a tuple of them (a dense KVCache or a PagedKVCache).
    """
    if cache is None:
        return
    if not isinstance(cache, cache_type):
        types = cache_type if isinstance(cache_type, tuple) else (cache_type,)
        also = "".join(f"; a {t.__name__} serves too" for t in types[1:])
        raise TypeError(f"cache must be a {types[0].__name__} for this module, got "
                        f"{type(cache).__name__}{also}")
    if context is not None:
        raise ValueError("a KV cache serves self-attention (keys from the tokens themselves); "
                         "call without context")
    want = (B, module.n_kv_heads, module.d_k, module.dtype, module.options.window)
    got = (cache.B, cache.n_heads, cache.d_k, cache.dtype, cache.window)
    if got != want:
        raise ValueError(f"cache must be built for (B={B}, n_kv_heads={want[1]}, d_k={want[2]}, "
                         f"dtype={want[3]}, window={want[4]}) to serve this module and x, got "
                         f"(B={got[0]}, n_kv_heads={got[1]}, d_k={got[2]}, dtype={got[3]}, "
                         f"window={got[4]}); module.new_cache(B, max_len) builds one that fits")
    paged = getattr(cache, "paged", False)
    if mask is not None and (cache.window is not None or paged):
        kind = "a paged" if paged else "a rolling (window)"
        raise ValueError(f"{kind} cache takes no mask: mark pad tokens with negative "
                         f"positions instead")
    if not paged:  # a paged cache reserves exactly what the real tokens need in update (pads take
        cache.check_room(T)  # no room), all or nothing before it writes


def alibi(opts: Options, h: int, q_pos: Any, k_pos: Any, dtype: Any = None) -> Any:
    """ALiBi's bias (B|1, h, T, S) for these positions, or None if the module does not use it."""
    if not opts.alibi:
        return None
    slopes = alibi_slopes(h)  # (h,) float64
    if is_torch(q_pos):
        slopes = torch.as_tensor(slopes, dtype=dtype, device=q_pos.device)
    return position_bias(slopes, q_pos, k_pos)  # (B|1, h, T, S)


def padded_positions(lengths: Any, T: int, side: str = "left") -> Any:
    """(B, T) positions for a padded batch: 0..L-1 on each sequence's L real tokens, -1 on pads.

    side="left" puts the pads first (what generation needs: every prompt ends at the last
    column, so the next token goes in the same place for all). numpy or torch, like `lengths`.
    """
    from mha.attention.masks import (
        check_lengths,  # masks imports this package's steps; keep imports light
    )

    T = require_int("T", T)
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    lengths = check_lengths(lengths, T)
    col = _arange(T, lengths)[None, :]  # (1, T)
    pos = col - (T - lengths[:, None]) if side == "left" else col + 0 * lengths[:, None]  # (B, T)
    real = (pos >= 0) & (pos < lengths[:, None])  # (B, T)
    return torch.where(real, pos, -1) if is_torch(pos) else np.where(real, pos, -1)
