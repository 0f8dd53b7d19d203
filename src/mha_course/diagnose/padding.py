"""The named check of a padding mask: right, or the likely mistake in words (14_padding_masks.ipynb).

    diagnose_padding(mask, lengths, ...)   None when right, else the likely mistake with evidence
    check_padding(mask, lengths, ...)      assert it: a sentence when right, AssertionError naming why
    check_real_tokens(module, x, ...)      padding leaves every real token's output unchanged

The masks themselves are `mha.attention.masks` (lowerings of `mha.attention.masking.MaskSpec`); this module only
judges masks and modules, so the library never carries the course's diagnoses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mha.attention.masks import check_lengths, key_padding_mask, query_padding_mask
from mha.steps import causal_mask
from mha.validate import is_torch, shape_of, torch  # torch is imported lazily


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
