"""Attention masks built from sequence lengths and windows (True = may attend).

Every builder returns a boolean mask that `MultiHeadAttention.forward(..., mask=...)`
accepts in numpy and in torch. Give `lengths` as a numpy array (or list) to get numpy
masks, or as a torch tensor to get torch masks on the same device: the two backends
share every name here. Padding is on the right: sequence b holds real tokens at
positions 0..lengths[b]-1 and padding after them.

    pad_batch(seqs, value)               (B, T, ...), lengths   ragged sequences, padded on the right
    key_padding_mask(lengths, S)         (B, S)        key s is a real token
    query_padding_mask(lengths, T)       (B, T)        query t is a real token
    padding_mask(lengths, T, ...)        (B, 1, T, S)  real query -> real key (optionally causal)
    sliding_window_mask(T, window, ...)  (T, S)        causal, and at most `window` keys back
    combine(a, b, ...)                   broadcast AND of masks
    additive_mask(allowed, dtype, fill)  0 where allowed, `fill` elsewhere (a float attn_mask)
    to_torch_key_padding_mask(...)       the flipped polarity nn.MultiheadAttention wants
    masked_mean(values, valid)           a mean (a loss) over real positions only
    fill_value_effects(fill, dtype)      what -inf, -1e9 or finfo.min does in one dtype, measured

padding_mask and sliding_window_mask are lowerings of the one description of what may be
attended, `mha.attention.masking.MaskSpec` (its `dense`): the modules, SDPA, FlexAttention and the tiled
kernels read the same rules. The named check of a padding mask (`check_padding`,
`check_real_tokens`) lives in `mha_course.diagnose.padding`.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from mha.attention.masking import MaskSpec
from mha.steps import softmax
from mha.validate import is_torch, require_int, shape_of, torch  # torch is imported lazily


def check_lengths(lengths: Any, max_len: int, name: str = "lengths", B: int | None = None):
    """Validate (B,) whole-number lengths in [0, max_len]; return them as numpy or torch ints."""
    max_len = require_int("max_len", max_len)
    arr = lengths.detach().cpu().numpy() if is_torch(lengths) else np.asarray(lengths)
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
    return lengths if is_torch(lengths) else arr.astype(np.int64)


def _positions(lengths: Any, n: int):
    """0..n-1 as numpy or torch, matching `lengths` (device included)."""
    if is_torch(lengths):
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
    spec = MaskSpec.padded(lengths, T, S, kv_lengths, causal=causal, queries=queries)
    return spec.dense(full=True)  # (B, 1, T, S)


def sliding_window_mask(T: int, window: int, S: int | None = None, offset: int = 0) -> np.ndarray:
    """(T, S) boolean: query t sees keys s with t + offset - window < s <= t + offset.

    A causal band `window` keys wide (the query's own key included): window=1 sees only
    itself, window >= S is plain causal. offset as in `mha.steps.causal_mask`.
    """
    T = require_int("T", T)
    window = require_int("window", window, minimum=1)
    S = T if S is None else require_int("S", S)
    offset = require_int("offset", offset, minimum=-sys.maxsize - 1)
    spec = MaskSpec(offset + np.arange(T), np.arange(S), causal=True, window=window)
    return spec.dense(full=True)[0, 0]  # (T, S): the band


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
    if is_torch(allowed):
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.full((), fill, dtype=dtype, device=allowed.device))
    dtype = np.dtype(dtype)
    with np.errstate(over="ignore"):  # float16 cannot hold -1e9: it becomes -inf (14_padding_masks.ipynb)
        return np.where(allowed, dtype.type(0), dtype.type(fill))


def to_torch_key_padding_mask(lengths: Any, S: int):
    """(B, S) boolean for nn.MultiheadAttention's key_padding_mask: True = IGNORE this key.

    The opposite polarity of every mask in this module (and of SDPA's boolean attn_mask).
    """
    return ~key_padding_mask(lengths, S)  # (B, S): True where the key is padding


# ---- ragged batches -----------------------------------------------------------------------------
def pad_batch(seqs: Any, value: float = 0.0):
    """Stack sequences (L_b, ...) of different lengths into (B, T, ...), T = max L_b, padded on the right.

    Returns (batch, lengths): numpy in, numpy out; torch in, torch out (lengths int64 on the
    same device), like `torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)` plus lengths.
    """
    seqs = list(seqs)
    if not seqs:
        raise ValueError("pad_batch needs at least one sequence, got none")
    kinds = {is_torch(s) for s in seqs}
    if len(kinds) > 1:
        raise TypeError("pad_batch needs all numpy arrays or all torch tensors, got a mix")
    first = seqs[0]
    for i, s in enumerate(seqs):
        if s.ndim == 0 or shape_of(s)[1:] != shape_of(first)[1:]:
            raise ValueError(f"every sequence must be (L, {', '.join(map(str, shape_of(first)[1:]))}) "
                             f"like sequence 0 {shape_of(first)}, got sequence {i} {shape_of(s)}")
    lens = [int(s.shape[0]) for s in seqs]
    shape = (len(seqs), max(lens), *shape_of(first)[1:])  # (B, T, ...)
    if is_torch(first):
        batch = torch.full(shape, value, dtype=first.dtype, device=first.device)
        lengths = torch.tensor(lens, dtype=torch.int64, device=first.device)
    else:
        batch = np.full(shape, value, dtype=np.result_type(*seqs))
        lengths = np.array(lens, dtype=np.int64)
    for b, s in enumerate(seqs):
        batch[b, : lens[b]] = s  # (L_b, ...) into the first L_b rows; the rest keep `value`
    return batch, lengths


# ---- losses over real tokens ----------------------------------------------------------------------
def masked_mean(values: Any, valid: Any):
    """Mean of values (B, T, ...) over the positions where valid (B, T) is True: padding never counts.

    Every element of a real position counts once, so the result does not change when more
    padding is added. Uses where, not values * valid: padded rows may hold NaN (nn.MultiheadAttention
    gives NaN for a fully masked row) and NaN * 0 is NaN.
    """
    if str(valid.dtype) not in ("bool", "torch.bool"):
        raise TypeError(f"valid must be boolean (True = a real position), got dtype {valid.dtype}")
    if shape_of(values)[: valid.ndim] != shape_of(valid):
        raise ValueError(f"valid {shape_of(valid)} must match the leading axes of values "
                         f"{shape_of(values)}, e.g. valid (B, T) for values (B, T, d_model)")
    n_real = int(valid.sum())
    if n_real == 0:
        raise ValueError("valid has no True entry: a mean over zero real positions is undefined")
    per_position = int(np.prod(shape_of(values)[valid.ndim:], dtype=np.int64))  # 1 for (B, T)
    keep = valid.reshape(shape_of(valid) + (1,) * (values.ndim - valid.ndim))  # (B, T, 1, ...)
    if is_torch(values):
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        return torch.where(keep, values, zero).sum() / (n_real * per_position)
    return np.where(keep, values, values.dtype.type(0)).sum() / (n_real * per_position)


# ---- the fill value, measured -----------------------------------------------------------------------
FILLS = ("-inf", "-1e9", "finfo.min")
"""The fill values 14_padding_masks.ipynb compares, by name (`fill_value` turns a name into a number)."""

FILL_SCORES = np.array([18.0, 2.5, 24.0, -3.0])
"""One row of scores for `fill_value_effects`: keys 2 and 3 are masked, the highest score among them."""
FILL_ALLOWED = np.array([True, True, False, False])


def fill_value(name: str, dtype: Any = np.float32):
    """The fill called `name` ("-inf", "-1e9" or "finfo.min") as a numpy scalar of `dtype`.

    float16 cannot hold -1e9 (its largest finite number is 65504): the cast gives -inf.
    """
    dtype = np.dtype(dtype)
    values = {"-inf": -np.inf, "-1e9": -1e9, "finfo.min": None}
    if name not in values:
        raise ValueError(f"fill must be one of {', '.join(FILLS)}, got {name!r}")
    with np.errstate(over="ignore"):  # -1e9 -> float16 overflows to -inf: that is the point
        return np.finfo(dtype).min if values[name] is None else dtype.type(values[name])


def plain_softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis as most code writes it: subtract the row max, exp, divide; no guard."""
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # an all -inf row gives -inf - -inf = NaN
    return e / e.sum(axis=-1, keepdims=True)


def describe_row(weights: np.ndarray) -> str:
    """One word for a row of attention weights: 'NaN', 'zeros', 'uniform', or the numbers."""
    w = np.asarray(weights, dtype=np.float64)
    if np.isnan(w).any():
        return "NaN"
    if (w == 0).all():
        return "zeros"
    if np.allclose(w, 1.0 / w.size, rtol=0, atol=1e-3):
        return f"uniform 1/{w.size}"
    return np.array2string(w, precision=3, suppress_small=True)


def fill_value_effects(name: str, dtype: Any) -> dict:
    """Measure one fill in one dtype on the 4-key row FILL_SCORES (keys 2, 3 masked, then all 4).

    Returns what the dtype stores, the largest weight a masked key gets, masked score minus
    the row max (-inf where that subtraction overflowed), and what a fully masked row gives
    with the plain softmax and with the guarded `mha.steps.softmax`.
    """
    dtype = np.dtype(dtype)
    fill = fill_value(name, dtype)
    scores = FILL_SCORES.astype(dtype)  # (4,)
    with np.errstate(over="ignore", invalid="ignore"):  # the overflow and the NaN are the findings
        row = np.where(FILL_ALLOWED, scores, fill)  # (4,): masked keys replaced by the fill
        shifted = row - row.max()  # what the stable softmax exponentiates
        weights = plain_softmax(row)  # (4,)
        full = np.full(4, fill, dtype=dtype)  # a padded query: every key masked
        return {
            "dtype": dtype.name, "fill": name, "stored": float(fill),
            "masked_weight": float(weights[~FILL_ALLOWED].max()),
            "fill_minus_max": float(shifted[~FILL_ALLOWED].min()),
            "full_row_plain": describe_row(plain_softmax(full)),
            "full_row_guarded": describe_row(softmax(full)),  # steps.softmax: all -inf -> zeros
        }
