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
    check_padding(mask, lengths, ...)    the named check: right, or the likely mistake in words
    check_real_tokens(module, x, ...)    padding leaves every real token's output unchanged
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .steps import causal_mask, softmax
from .validate import is_torch, require_int, shape_of, torch  # torch is imported lazily


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
    kv_lengths = lengths if kv_lengths is None else kv_lengths
    keys = key_padding_mask(kv_lengths, S)  # (B, S)
    allowed = keys[:, None, None, :]  # (B, 1, 1, S)
    if queries:
        rows = query_padding_mask(lengths, T, B=keys.shape[0])  # (B, T)
        allowed = allowed & rows[:, None, :, None]  # (B, 1, 1, S) & (B, 1, T, 1) -> (B, 1, T, S)
    else:
        allowed = allowed.repeat(T, 2) if not is_torch(allowed) else allowed.expand(-1, -1, T, -1)
    if causal:
        tril = causal_mask(T, S)  # (T, S)
        allowed = allowed & (torch.from_numpy(tril).to(allowed.device) if is_torch(allowed) else tril)
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


# ---- the named check ------------------------------------------------------------------------------
def _np(a: Any) -> np.ndarray:
    """numpy view of an array or tensor."""
    return a.detach().cpu().numpy() if is_torch(a) else np.asarray(a)


def _as_4d(mask: np.ndarray, B: int, T: int, S: int) -> np.ndarray | str:
    """The mask as (B, H, T, S), or a sentence saying why its shape cannot be a padding mask."""
    got = mask.shape
    if mask.ndim == 2 and got == (T, S):
        return np.broadcast_to(mask, (B, 1, T, S))
    if mask.ndim == 3 and got == (B, T, S):
        return mask[:, None]
    if mask.ndim == 4 and got[0] in (1, B) and got[2] in (1, T) and got[3] == S:
        return np.broadcast_to(mask, (B, got[1], T, S))  # (B|1, 1|h, T|1, S): SDPA broadcasts it
    if mask.ndim == 2 and got == (B, S):
        return (f"a (B, S) = {got} key mask cannot meet (B, h, T, S) scores: broadcasting lines "
                f"B up with T. Reshape it to (B, 1, 1, S) with mask[:, None, None, :]")
    return f"a padding mask must be (T={T}, S={S}), (B={B}, T, S) or (B, 1|h, T|1, S), got {got}"


def _keys(row: np.ndarray) -> str:
    """Key indices where a boolean row is True, as '2, 3, 4'."""
    return ", ".join(str(int(s)) for s in np.flatnonzero(row)) or "none"


def diagnose_padding(mask: Any, lengths: Any, causal: bool = False, queries: bool = True,
                     kv_lengths: Any = None) -> str | None:
    """None if `mask` is the right padding mask for `lengths`; else the likely mistake, with evidence.

    Real queries must see exactly the real keys (and only earlier ones if causal); with
    queries=True the rows of padded queries must be fully masked.
    """
    if not hasattr(mask, "dtype") or str(mask.dtype) not in ("bool", "torch.bool"):
        kind = str(getattr(mask, "dtype", type(mask).__name__)).replace("torch.", "")
        why = ("SDPA refuses an integer attn_mask (bool or float only) and mha's modules refuse "
               "any non-boolean one: use mask == 1 if 1 marks may attend" if "int" in kind else
               "A float mask is ADDED to the scores by SDPA: 0/1 only tilts the weights by e, "
               "and padded keys keep a share of every row")
        return f"the mask must be boolean (True = may attend), got {kind}. {why}"
    m, lengths = _np(mask), _np(lengths)
    kv = lengths if kv_lengths is None else _np(kv_lengths)
    S = int(m.shape[-1]) if m.ndim >= 1 else 0
    # self-attention: T = S, so a (B, S) mask is caught; cross-attention: T from the mask
    T = S if kv_lengths is None or m.ndim < 2 else int(m.shape[-2])
    B = int(np.shape(lengths)[0])
    k_real = key_padding_mask(kv, S, B=B)  # (B, S)
    q_real = query_padding_mask(lengths, T, B=B)  # (B, T)
    m4 = _as_4d(m, B, T, S)
    if isinstance(m4, str):
        return m4
    if m.ndim == 2 and m.shape == (B, S) and np.array_equal(m, k_real):
        return (f"a (B, S) key mask was given where (T, S) is expected (B = T = {B}): it "
                f"broadcasts silently over the wrong axes. Reshape it to (B, 1, 1, S)")
    tril = causal_mask(T, S) if causal else np.ones((T, S), dtype=bool)  # (T, S)
    want = k_real[:, None, :] & tril  # (B, T, S): what a real query row must be
    rows = q_real[:, :, None]  # (B, T, 1): real query rows
    for j in range(m4.shape[1]):
        why = _diagnose_head(m4[:, j], want, rows, k_real, lengths, kv, tril, causal, queries)
        if why is not None:
            return why if m4.shape[1] == 1 else f"head {j}: {why}"
    return None


def _diagnose_head(m, want, rows, k_real, lengths, kv, tril, causal, queries) -> str | None:
    """The diagnosis for one (B, T, S) head of the mask (see diagnose_padding)."""
    extra = m & ~want & rows  # allowed but must not be, on real query rows
    missing = ~m & want & rows  # must be allowed but is not
    pad_seen = extra & ~k_real[:, None, :]  # real queries that may see padded keys
    open_rows = m & ~rows  # padded query rows that still see something

    def at(a):  # the first (b, t) where a holds, and how sequence b is padded
        b, t = (int(i) for i in np.argwhere(a.any(-1))[0])
        return b, t, f"sequence {b} (length {int(lengths[b])}, {int(kv[b])} real keys)"

    at_padding = m & ~k_real[:, None, :]  # any row (with causal, only padded rows reach padding)
    if at_padding.any() and missing.sum() * 2 >= (want & rows).sum():
        b, t, seq = at(missing)
        return (f"polarity flipped: True must mean 'may attend' (SDPA and mha), but this mask is "
                f"True at padding and False at real keys. In {seq}, query {t} may not attend its "
                f"real keys {_keys(missing[b, t])}; a sequence without padding has no "
                f"key left (zeros from SDPA, NaN from nn.MultiheadAttention). True = ignore is "
                f"nn.MultiheadAttention's key_padding_mask convention (masks.to_torch_key_padding_mask); "
                f"for SDPA use masks.padding_mask")
    if pad_seen.any():
        b, t, seq = at(pad_seen)
        S = m.shape[-1]
        one_more = (np.arange(S)[None, :] <= kv[:, None])[:, None, :] & tril  # s <= length
        if np.array_equal(m & rows, one_more & rows):
            return (f"off by one: in {seq}, query {t} may attend key {int(kv[b])}, the first "
                    f"padded one. Key s is real when s < lengths[b] (strict)")
        if not open_rows.any() and np.array_equal(m & rows, tril & rows):  # rows only, no keys
            return (f"padding applied to queries only: the rows of padded queries are masked, but "
                    f"real queries still see padded keys (in {seq}, query {t} sees padded keys "
                    f"{_keys(pad_seen[b, t])}). Mask the key axis too: "
                    f"keys[:, None, None, :] & rows[:, None, :, None]")
        return (f"padded keys still attended: in {seq}, query {t} may attend keys "
                f"{_keys(pad_seen[b, t])}, which are padding; the key side of the mask is missing "
                f"or built from the wrong lengths (key s is real only when s < lengths[b]), "
                f"e.g. masks.key_padding_mask")
    if missing.any():
        b, t, seq = at(missing)
        if causal and np.array_equal(m.swapaxes(-1, -2) & rows, want & rows):
            return ("query and key axes swapped: mask[b, t, s] must say whether query t may see "
                    "key s; this mask holds the upper triangle (the future) instead")
        if not causal and np.array_equal(m & rows, want & causal_mask(*want.shape[1:]) & rows):
            return ("a causal mask although causal=False: every query lost its later real keys "
                    f"(in {seq}, query {t} cannot see keys {_keys(missing[b, t])})")
        return (f"real keys masked out: in {seq}, query {t} cannot attend real keys "
                f"{_keys(missing[b, t])}; check the comparison s < lengths[b] and the lengths given")
    if causal and extra.any():
        b, t, seq = at(extra)
        return (f"causal part missing: in {seq}, query {t} may attend later keys "
                f"{_keys(extra[b, t])}; use masks.padding_mask(..., causal=True) or masks.combine")
    if queries and open_rows.any():
        b, t = (int(i) for i in np.argwhere(open_rows.any(-1))[0])
        T = m.shape[-2]
        first_pad = np.arange(T)[None, :] == lengths[:, None]  # (B, T): query t == lengths[b]
        if np.array_equal(open_rows.any(-1), first_pad):  # exactly one padded row open per sequence
            return (f"off by one on the query side: in sequence {b} (length {int(lengths[b])}), "
                    f"query {t}, the first padded one, is treated as real and may attend keys "
                    f"{_keys(open_rows[b, t])}, while the later padded queries see nothing. Query t "
                    f"is real when t < lengths[b] (strict)")
        return (f"padded query rows are not masked: query {t} of sequence {b} (length "
                f"{int(lengths[b])}) is padding but may attend keys {_keys(open_rows[b, t])}. Its "
                f"output is then garbage rather than zeros; pass queries=False if that is intended "
                f"and the loss masks those rows (masks.masked_mean)")
    return None


def check_padding(mask: Any, lengths: Any, causal: bool = False, queries: bool = True,
                  kv_lengths: Any = None) -> str:
    """Assert `mask` is the padding mask for `lengths`; else AssertionError naming the likely mistake."""
    __tracebackhide__ = True  # IPython and pytest show the caller's line, not ours
    why = diagnose_padding(mask, lengths, causal, queries, kv_lengths)
    if why is not None:
        raise AssertionError(f"padding mask wrong: {why}")
    lens = ", ".join(str(int(n)) for n in _np(lengths))
    rows = "padded queries see nothing" if queries else "padded query rows left free"
    said = (f"padding mask right for lengths [{lens}]: real queries see only real keys"
            f"{' at or before them' if causal else ''}; {rows}")
    if len(shape_of(mask)) == 3:  # (B, T, S): our modules insert the head axis, SDPA does not
        said += (f". As (B, T, S) = {shape_of(mask)} it suits mha's modules, which insert the head "
                 f"axis; F.scaled_dot_product_attention lines a 3-D mask's B up with the heads, so "
                 f"give it (B, 1, T, S): mask[:, None]")
    return said


def check_real_tokens(module: Any, x: Any, lengths: Any, mask: Any, causal: bool = False,
                      atol: float | None = None, seed: int = 0) -> str:
    """Assert padding changes no real token's output: equal to each sequence run alone, unpadded.

    Runs `module(x, causal=causal, mask=mask)` on the padded batch x (B, T, d_model) and
    `module(x[b:b+1, :L_b], causal=causal)` on each sequence alone; real rows must agree
    within atol (default: 1e-12 float64, 1e-5 float32, 1e-2 float16: the two runs only add
    in a different order). Then the padded inputs are replaced by noise: real outputs must
    stay bit-identical, since padded keys get weight exactly 0. On failure the mask is
    diagnosed (`diagnose_padding`) to name the likely cause.
    """
    __tracebackhide__ = True
    T = int(x.shape[1])
    lens = check_lengths(_np(lengths), T, B=int(x.shape[0]))
    out = module(x, causal=causal, mask=mask)  # (B, T, d_model)
    dtype = str(out.dtype).replace("torch.", "")
    atol = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2}.get(dtype, 1e-2) if atol is None else atol
    real = query_padding_mask(lens, T)  # (B, T)

    def cause() -> str:
        full = mask  # what the scores meet: the mask, and the causal staircase the module adds
        if causal and str(getattr(mask, "dtype", "")) in ("bool", "torch.bool"):
            full = _np(mask) & causal_mask(T)  # broadcasts: (T, S), (B, T, S) or (B, h, T, S)
        why = diagnose_padding(full, lens, causal=causal, queries=False)
        return (f"likely cause: {why}" if why else
                "the mask itself is right, so the module ignores it or applies it wrongly")

    worst, where = 0.0, None
    for b, n in enumerate(lens):
        if n == 0:
            continue
        alone = _np(module(x[b : b + 1, :n], causal=causal))[0]  # (L_b, d_model), no padding
        gap = float(np.abs(_np(out)[b, :n].astype(np.float64) - alone).max())
        if not gap <= worst:
            worst, where = gap, b
    if not worst <= atol:
        raise AssertionError(
            f"real tokens changed by padding: sequence {where} (length {int(lens[where])}) differs "
            f"from running it alone by {worst:.3g} (allowed {atol:g}); {cause()}")

    noisy = _with_noisy_padding(x, real, seed)
    moved = np.abs(_np(module(noisy, causal=causal, mask=mask)) - _np(out))[real]
    if (moved != 0).any():
        raise AssertionError(
            f"padded inputs leak into real outputs: replacing the padding by noise moved real "
            f"outputs by up to {float(moved.max()):.3g} (they must stay bit-identical); {cause()}")
    b = int(np.argmax(lens))  # control: a real token's own change must reach its output
    bumped = _np(module(_bump(x, b), causal=causal, mask=mask))[b, 0]
    if np.array_equal(bumped, _np(out)[b, 0]):
        raise AssertionError(f"control case failed: changing token 0 of sequence {b} left its "
                             f"output unchanged, so the checks above prove nothing")
    return (f"real tokens: equal to each sequence alone (max gap {worst:.1e}, atol {atol:g}); "
            f"bit-identical when the padding is replaced by noise")


def _bump(x: Any, b: int):
    """A copy of x (B, T, d_model) with token 0 of sequence b shifted by 1."""
    y = x.clone() if is_torch(x) else x.copy()
    y[b, 0] += 1.0
    return y


def _with_noisy_padding(x: Any, real: np.ndarray, seed: int):
    """x with every padded position (where real (B, T) is False) replaced by seeded noise * 10."""
    noise = np.random.default_rng(seed).normal(0.0, 10.0, shape_of(x))  # (B, T, d_model)
    pad = ~real[:, :, None]  # (B, T, 1)
    if is_torch(x):
        pad_t = torch.from_numpy(pad).to(x.device)
        return torch.where(pad_t, torch.from_numpy(noise).to(x.device, x.dtype), x)
    return np.where(pad, noise.astype(x.dtype), x)
