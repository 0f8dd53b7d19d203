"""Attention masks built from sequence lengths and windows (True = may attend).

Every builder returns a boolean mask that `MultiHeadAttention.forward(..., mask=...)`
accepts in numpy and in torch. Give `lengths` as a numpy array (or list) to get numpy
masks, or as a torch tensor to get torch masks on the same device: the two backends
share every name here.

    key_padding_mask(lengths, S)         (B, S)        key s is a real token
    query_padding_mask(lengths, T)       (B, T)        query t is a real token
    padding_mask(lengths, T, ...)        (B, 1, T, S)  real query -> real key (optionally causal)
    sliding_window_mask(T, window, ...)  (T, S)        causal, and at most `window` keys back
    combine(a, b, ...)                   broadcast AND of masks
    additive_mask(allowed, dtype, fill)  0 where allowed, `fill` elsewhere (a float attn_mask)
    to_torch_key_padding_mask(...)       the flipped polarity nn.MultiheadAttention wants
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .steps import causal_mask
from .validate import require_int, shape_of

try:  # torch is optional for the numpy half of the package
    import torch
except ImportError:  # pragma: no cover - torch is in requirements.txt
    torch = None


def _is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def check_lengths(lengths: Any, max_len: int, name: str = "lengths", B: int | None = None):
    """Validate (B,) whole-number lengths in [0, max_len]; return them as numpy or torch ints."""
    max_len = require_int("max_len", max_len)
    arr = lengths.detach().cpu().numpy() if _is_torch(lengths) else np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (B,), one length per sequence, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold whole numbers, got dtype {arr.dtype}")
    if B is not None and arr.shape[0] != B:
        raise ValueError(f"{name} must have one entry per batch item (B={B}), got {arr.shape[0]}")
    bad = (arr < 0) | (arr > max_len)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{name} must lie in [0, {max_len}] (the padded length), "
            f"got {name}[{i}] = {int(arr[i])}"
        )
    return lengths if _is_torch(lengths) else arr.astype(np.int64)


def _positions(lengths: Any, n: int):
    """0..n-1 as numpy or torch, matching `lengths` (device included)."""
    if _is_torch(lengths):
        return torch.arange(n, device=lengths.device)
    return np.arange(n)


def key_padding_mask(lengths: Any, S: int, B: int | None = None):
    """(B, S) boolean, True where key s < lengths[b] is a real token (not padding)."""
    lengths = check_lengths(lengths, S, B=B)
    return _positions(lengths, S)[None, :] < lengths[:, None]  # (1, S) < (B, 1) -> (B, S)


def query_padding_mask(lengths: Any, T: int, B: int | None = None):
    """(B, T) boolean, True where query t < lengths[b] is a real token; the rest are flagged."""
    lengths = check_lengths(lengths, T, B=B)
    return _positions(lengths, T)[None, :] < lengths[:, None]  # (1, T) < (B, 1) -> (B, T)


def padding_mask(lengths: Any, T: int, S: int | None = None, kv_lengths: Any = None,
                 causal: bool = False, queries: bool = True):
    """(B, 1, T, S) boolean: real queries attend to real keys (and only earlier ones if causal).

    Self-attention: `lengths` serves queries and keys. Cross-attention: give the keys'
    own `kv_lengths`. `queries=False` leaves padded query rows unmasked (they then
    attend to the real keys and produce garbage that a loss must ignore anyway).
    A padded query row is fully masked, so attention gives it zeros, not NaN.
    """
    T = require_int("T", T)
    S = T if S is None else require_int("S", S)
    kv_lengths = lengths if kv_lengths is None else kv_lengths
    keys = key_padding_mask(kv_lengths, S)  # (B, S)
    allowed = keys[:, None, None, :]  # (B, 1, 1, S)
    if queries:
        rows = query_padding_mask(lengths, T, B=keys.shape[0])  # (B, T)
        allowed = allowed & rows[:, None, :, None]  # (B, 1, 1, S) & (B, 1, T, 1) -> (B, 1, T, S)
    else:
        allowed = allowed.repeat(T, 2) if not _is_torch(allowed) else allowed.expand(-1, -1, T, -1)
    if causal:
        tril = causal_mask(T, S)  # (T, S)
        allowed = allowed & (torch.from_numpy(tril).to(allowed.device) if _is_torch(allowed) else tril)
    return allowed  # (B, 1, T, S)


def sliding_window_mask(T: int, window: int, S: int | None = None, offset: int = 0) -> np.ndarray:
    """(T, S) boolean: query t sees keys s with t + offset - window < s <= t + offset.

    A causal band `window` keys wide (the query's own key included): window=1 sees only
    itself, window >= S is plain causal. offset as in `mha.steps.causal_mask`.
    """
    T = require_int("T", T)
    window = require_int("window", window, minimum=1)
    S = T if S is None else require_int("S", S)
    causal = causal_mask(T, S, offset)  # (T, S): s <= t + offset
    too_old = causal_mask(T, S, offset - window)  # (T, S): s <= t + offset - window
    return causal & ~too_old  # (T, S): the band


def combine(*masks: Any):
    """Logical AND of boolean masks that broadcast together (None entries are skipped)."""
    present = [m for m in masks if m is not None]
    if not present:
        raise ValueError("combine needs at least one mask, got none")
    for m in present:
        if str(m.dtype) not in ("bool", "torch.bool"):
            raise TypeError(f"every mask must be boolean (True = may attend), got dtype {m.dtype}")
    out = present[0]
    for m in present[1:]:
        try:
            out = out & m
        except (ValueError, RuntimeError):
            raise ValueError(
                f"masks must broadcast together, got {shape_of(out)} and {shape_of(m)}"
            ) from None
    return out


def additive_mask(allowed: Any, dtype: Any = np.float32, fill: float = float("-inf")):
    """Float mask: 0 where allowed, `fill` where not; added to the scores (SDPA's float attn_mask)."""
    if str(allowed.dtype) not in ("bool", "torch.bool"):
        raise TypeError(f"allowed must be boolean (True = may attend), got dtype {allowed.dtype}")
    if _is_torch(allowed):
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.full((), fill, dtype=dtype, device=allowed.device))
    dtype = np.dtype(dtype)
    with np.errstate(over="ignore"):  # float16 cannot hold -1e9: it becomes -inf, shown in 12
        return np.where(allowed, dtype.type(0), dtype.type(fill))


def to_torch_key_padding_mask(lengths: Any, S: int):
    """(B, S) boolean for nn.MultiheadAttention's key_padding_mask: True = IGNORE this key.

    The opposite polarity of every mask in this module (and of SDPA's boolean attn_mask).
    """
    return ~key_padding_mask(lengths, S)  # (B, S): True where the key is padding
