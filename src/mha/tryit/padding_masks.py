"""Self-check for the Try-it of 14_padding_masks.ipynb: a decoder's padding mask, (B, 1, T, S)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import first_match, not_tried, not_yet, right

LENGTHS = (5, 3, 1)
T = 5


def _parts(lengths: tuple[int, ...], T: int):
    """The three pieces of the mask: real (B, T), one-too-many (B, T), the lower triangle (T, S)."""
    pos = np.arange(T)
    lens = np.asarray(lengths)[:, None]  # (B, 1)
    return pos[None, :] < lens, pos[None, :] <= lens, pos[None, :] <= pos[:, None]


def _mistakes(lengths: tuple[int, ...], T: int) -> list[tuple[np.ndarray, str]]:
    """Typical wrong (B, 1, T, S) masks, each with the sentence that names it."""
    real, one_more, tri = _parts(lengths, T)
    keys, rows = real[:, None, None, :], real[:, None, :, None]  # (B, 1, 1, S), (B, 1, T, 1)
    b = int(np.argmin(lengths))
    n = int(lengths[b])
    return [
        (keys & tri, f"the query term is missing: padded queries still attend (sequence {b}, length "
                     f"{n}: its padded query {n} sees key 0). The real rows are right, since with "
                     f"causal masking a real query's earlier keys are all real, but a padded row must "
                     f"see nothing: & real[:, None, :, None]"),
        (one_more[:, None, None, :] & one_more[:, None, :, None] & tri,
         f"off by one: pos <= lengths counts position lengths[b] as real, so query {n} of sequence "
         f"{b}, the first padded one, attends keys 0..{n}. Position p is real when p < lengths[b]"),
        (keys & one_more[:, None, :, None] & tri,
         f"off by one on the query term: pos <= lengths lets query {n} of sequence {b}, the first "
         f"padded one, attend. Position p is real when p < lengths[b]"),
        (keys & rows, "the causal triangle is missing: real queries also see later real keys. "
                      "& pos[None, :] <= pos[:, None] (key s at or before query t)"),
        (keys & rows & tri.T, "the triangle is the upper one: query t sees keys s >= t, the future. "
                              "Key s is allowed when s <= t"),
        (~(keys & rows & tri), "inverted: True must mean 'may attend' (SDPA and mha), yours is True "
                               "on padding and on the future. nn.MultiheadAttention's masks use the "
                               "opposite polarity; here drop the ~ (or the >=)"),
        (~keys & tri, "True on padded keys: the key term is inverted (pos >= lengths marks padding) "
                      "and the query term is missing; True must mean 'may attend'"),
        (np.broadcast_to(tri, keys.shape[:2] + tri.shape),
         "no padding in it: that is the causal triangle alone, the lengths never enter. Its real "
         "rows happen to be right (a real query's earlier keys are all real), but every padded "
         "query's row is open, and it sees padded keys too"),
    ]


def _where(got: np.ndarray, want: np.ndarray, lengths: tuple[int, ...]) -> str:
    """Where the answer first differs from the mask, in words, without printing the mask."""
    b, _, t, s = (int(i) for i in np.argwhere(got != want)[0])
    q = "real" if t < lengths[b] else "padded"
    k = "padding" if s >= lengths[b] else ("in the future" if s > t else "real, at or before it")
    return (f"first difference at [{b}, 0, {t}, {s}]: sequence {b} (length {lengths[b]}), query {t} "
            f"({q}), key {s} ({k}): yours {bool(got[b, 0, t, s])}. A real query may attend the real "
            f"keys at or before it; a padded query attends nothing")


def check_decoder_mask(answer: Any, lengths: tuple[int, ...] = LENGTHS, T: int = T) -> str:
    """Say right, or name the mistake in a decoder padding mask (B, 1, T, S), True = may attend."""
    B = len(lengths)
    if answer is None:
        return not_tried(f"build the mask for lengths {list(lengths)} at T = {T} with np.arange "
                         f"and comparisons, and write it as `answer`, shape ({B}, 1, {T}, {T})")
    try:
        got = np.asarray(answer)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        not_yet(f"the mask must be an array, got {type(answer).__name__} that numpy cannot read")
    want_shape = (B, 1, T, T)
    if got.dtype == object or not (got.dtype == np.bool_ or np.issubdtype(got.dtype, np.number)):
        not_yet(f"the mask must be an array of booleans, got {type(answer).__name__} of dtype "
                f"{got.dtype}")
    if got.shape != want_shape:
        not_yet(_shape_says(got.shape, B, T))
    real, _, tri = _parts(lengths, T)
    want = real[:, None, None, :] & real[:, None, :, None] & tri  # (B, 1, T, S)
    if got.dtype != np.bool_:
        same = np.array_equal(got != 0, want)
        kind = "integers" if np.issubdtype(got.dtype, np.integer) else "floats"
        effect = ("SDPA refuses an integer attn_mask" if kind == "integers" else
                  "SDPA adds a float mask to the scores, so 1/0 only tilts the weights")
        not_yet(f"the mask holds {kind} ({got.dtype}), not booleans{' (the pattern is right)' if same else ''}: "
                f"{effect}, and mha's modules refuse it. Build it with comparisons and &, or "
                f".astype(bool)")
    if np.array_equal(got, want):
        return right(f"({B}, 1, {T}, {T}) boolean: each real query sees the real keys at or before "
                     f"it, each padded query sees nothing; the length-1 sequence keeps one True")
    why = first_match(got, _mistakes(lengths, T))
    not_yet(why if why is not None else _where(got, want, lengths))


def _shape_says(shape: tuple[int, ...], B: int, T: int) -> str:
    """The sentence for a mask of the wrong shape."""
    if shape == (B, T, T):
        return (f"shape (B, T, S) = {shape}: the head axis is missing. Against scores (B, h, T, S) "
                f"SDPA lines a 3-D mask's B up with the heads: an error when h != B, silently the "
                f"wrong sequences when h == B. Insert it: [:, None, :, :] -> ({B}, 1, {T}, {T})")
    if shape == (B, 1, 1, T):
        return (f"shape (B, 1, 1, S) = {shape}: that is the key side alone; it broadcasts over the "
                f"queries, so neither the padded query rows nor the causal triangle are in it")
    if shape == (T, T):
        return (f"shape (T, S) = {shape}: one mask for every sequence cannot follow their lengths; "
                f"it needs the batch axis and a head axis of 1: ({B}, 1, {T}, {T})")
    return f"the mask must have shape (B, 1, T, S) = ({B}, 1, {T}, {T}), got {shape}"
