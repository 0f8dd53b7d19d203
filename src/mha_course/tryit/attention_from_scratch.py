"""Self-check for the Try-it of 01_attention_from_scratch.ipynb: the mask of a moving average."""

from __future__ import annotations

from typing import Any

import numpy as np

from mha.attention import masks
from mha.modules import compose
from mha_course.i18n import _
from mha_course.tryit import (
    first_match,
    inverted_match,
    joined,
    mask_verdict,
    not_tried,
    not_yet,
    read_mask,
    refuse_if_reached,
    relate,
    right,
    self_check,
    transposed_match,
)


def _band(T: int, back: int, ahead: int) -> np.ndarray:
    """(T, T) boolean: query t sees keys t - back .. t + ahead (clipped to 0 .. T-1)."""
    t = np.arange(T)[:, None]  # (T, 1): the query's position
    s = np.arange(T)[None, :]  # (1, T): the key's position
    return (s >= t - back) & (s <= t + ahead)  # (T, T)


def _wrapped(T: int, back: int) -> np.ndarray:
    """(T, T): the window of a loop whose index t - back wraps round to the end of the row."""
    t = np.arange(T)[:, None]  # (T, 1)
    s = np.arange(T)[None, :]  # (1, T)
    return ((t - s) % T) <= back  # (T, T): keys t - back .. t, modulo T


def _mistakes(T: int, window: int) -> list[tuple[np.ndarray, str]]:
    """The typical wrong masks for a moving average over the last `window` tokens."""
    back = window - 1  # keys t-2, t-1, t for window 3
    want = _band(T, back, 0)  # (T, T)
    short = want & (np.arange(T)[:, None] >= back)  # (T, T): rows 0 .. back-1 left empty
    return [
        (_band(T, T, 0), _("that is the plain causal mask: row t still sees every key back to 0, "
                           "a running mean, not a moving average; cut off the keys more than "
                           "{back} steps back").format(back=back)),
        (_band(T, back - 1, 0), _("that is a window of {w}, one key short (off by one): row t "
                                  "must see {window} keys, itself included").format(
            w=window - 1, window=window)),
        (_band(T, back + 1, 0), _("that is a window of {w}, one key too many (off by one): row "
                                  "t sees {w} keys, itself included").format(w=window + 1)),
        (want.T, _("that is the window turned round (transposed, the upper triangle): row t sees "
                   "itself and the keys after the query, the future; the moving average looks "
                   "back")),
        (_band(T, 0, T), _("that is the upper triangle (np.triu): row t sees itself and every key "
                           "after the query; the moving average looks back, not ahead")),
        (~_band(T, T, 0), _("that is the future alone (the causal mask inverted, s > t): row t "
                            "sees only keys after the query, and never itself")),
        (_band(T, back, back), _("that window reaches both ways, including the future: row t "
                                 "also sees keys t+1 .. t+{back}; a moving average of the last "
                                 "{window} tokens sees none after t").format(back=back,
                                                                              window=window)),
        (_band(T, 0, 0), _("that is the diagonal alone: every token averages only itself")),
        (_band(T, back, -1), _("the window without the query itself: row t sees keys t-{back} .. "
                               "t-1, and row 0 nothing; x_t belongs to its own moving "
                               "average").format(back=back)),
        (_band(T, T, 0) & ~want, _("that is the rest of the past, the complement of the window: "
                                   "row t sees the keys more than {back} steps back and not the "
                                   "last {window} (a tril offset with the wrong sign, or the "
                                   "window inverted inside the causal mask?)").format(
            back=back, window=window)),
        (_band(T, T, 0) & ~_band(T, back - 1, 0), _(
            "that keeps the keys at least {back} steps back, older than the window, and drops "
            "the recent ones: a tril offset of -{back} keeps keys s <= t - {back}; the window is "
            "t - {back} <= s <= t").format(back=back)),
        (np.ones((T, T), dtype=bool), _("that mask allows everything: no mask at all, every row "
                                        "averages all {T} tokens, the future included").format(
            T=T)),
        (short, _("rows 0 .. {last} see no key at all: a slice like [t - {back} : t + 1] starts "
                  "at a negative index for the first rows, which numpy reads from the end of the "
                  "row, so the slice is empty; the first rows average the tokens there "
                  "are").format(last=back - 1, back=back)),
        (_wrapped(T, back), _("row 0 also sees the last keys of the sequence: an index t - {back} "
                              "below 0 wraps round to the end (negative indices count from the "
                              "end in numpy); the window of the first rows stops at key "
                              "0").format(back=back)),
    ]


def _rules(got: np.ndarray) -> str | None:
    """What a mask that fits no listed mistake breaks: the future, the query itself, empty rows."""
    T = got.shape[0]
    future = np.argwhere(np.triu(got, k=1))  # (n, 2): allowed keys s > t
    empty = np.flatnonzero(~got.any(axis=-1))
    if not got.any():
        return _("that mask allows nothing: every row is False, so no token has anything to "
                 "average (masked_softmax gives a row of zeros); an empty mask usually comes "
                 "from a tril / triu offset with the wrong sign, or from & of two masks that do "
                 "not overlap")
    if len(future):
        t, s = (int(i) for i in future[0])
        return _("row {t} sees key {s}, after the query: the future; a moving average looks "
                 "back only").format(t=t, s=s)
    if not got.diagonal().any():
        return _("that mask leaves out the query itself (the diagonal is all False): row t "
                 "sees keys before t only, and row 0 sees nothing; x_t belongs to its own "
                 "moving average")
    if len(empty):
        return _("row {row} sees no key at all ({n} of {T} rows are empty): every token belongs "
                 "to its own moving average").format(row=int(empty[0]), n=len(empty), T=T)
    return None


def _first_wrong_row(got: np.ndarray, want: np.ndarray) -> str:
    """Which keys the first wrong row lets its query see, without drawing the answer."""
    t = int(np.argmax((got != want).any(axis=-1)))  # the first row that is wrong
    return _("row {t} is the first wrong row: your mask lets query {t} see keys {keys}").format(
        t=t, keys=np.flatnonzero(got[t]).tolist())


def weights_not_mask(answer: Any, name: str, T: int) -> str | None:
    """A message if the answer is a (T, T) matrix of attention weights (rows summing to 1)."""
    try:
        value = np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer)
    except Exception:  # noqa: BLE001 - ragged lists: read_mask says what arrived
        return None
    if value.dtype.kind not in "iuf":  # booleans are a mask; text, complex: read_mask says
        return None
    if value.shape != (T, T) or np.isin(value, (0.0, 1.0)).all() or (value < 0).any():
        return None
    if not np.allclose(value.sum(axis=-1), 1.0, atol=1e-6):
        return None
    return _("{name} holds attention weights (each row sums to 1), the result of the softmax: "
             "the exercise asks for the mask that goes into it, True where query t may see key "
             "s").format(name=name)


def _size(answer: Any) -> int | None:
    """How many numbers the answer holds, or None if numpy cannot read it as one array."""
    try:
        return int(np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer).size)
    except Exception:  # noqa: BLE001 - ragged lists: read_mask says what arrived
        return None


_WINDOW_BUILDERS = (masks, compose)  # the package's own window masks


@self_check
def check_window_mask(allowed: Any, T: int = 8, window: int = 3) -> str:
    """Say right, or which mistake the mask of a moving average over `window` tokens makes."""
    if allowed is None:
        return not_tried(_("write `allowed`, a ({T}, {T}) boolean array (True where query t may "
                           "see key s), then run this cell").format(T=T))
    if isinstance(allowed, str | bytes) or callable(allowed):
        not_yet(_("allowed must be a ({T}, {T}) boolean array, got {kind} {answer!r:.60}").format(
            T=T, kind=type(allowed).__name__, answer=allowed))
    weights = weights_not_mask(allowed, "allowed", T)
    if weights is not None:
        not_yet(weights)
    if _size(allowed) == T:
        not_yet(_("allowed holds {T} numbers, one per token: that is the averaged sequence, not "
                  "the mask; the mask has one entry per pair (query t, key s), shape ({T}, "
                  "{T})").format(T=T))
    got, convention = read_mask(allowed, "allowed")  # bool, 0/1 or additive, read as allowed
    want = _band(T, window - 1, 0)  # (T, T): keys t - window + 1 .. t
    if got.shape != want.shape:
        not_yet(relate(got, want, "allowed"))
    if np.array_equal(got, want):
        refuse_if_reached(_WINDOW_BUILDERS, _("this Try-it asks you to build the mask with numpy"))
        if convention == "0/1":
            return right(_("row t sees keys t-{back} .. t (fewer at the start), so "
                           "masked_softmax(zeros, allowed) spreads 1/{window} over the last "
                           "{window} tokens: a moving average; it holds 0/1 numbers, and "
                           "masked_softmax wants booleans, so pass it as allowed == 1").format(
                back=window - 1, window=window))
        if convention == "additive":
            return right(_("row t sees keys t-{back} .. t (fewer at the start), so "
                           "masked_softmax(zeros, allowed) spreads 1/{window} over the last "
                           "{window} tokens: a moving average; it is an additive mask (0 where "
                           "allowed), and masked_softmax wants booleans, so pass it as allowed "
                           "== 0 (not .astype(bool), which would invert it)").format(
                back=window - 1, window=window))
        return right(_("row t sees keys t-{back} .. t (fewer at the start), so "
                       "masked_softmax(zeros, allowed) spreads 1/{window} over the last {window} "
                       "tokens: a moving average").format(back=window - 1, window=window))
    why = first_match(got, _mistakes(T, window)) or transposed_match(got, _mistakes(T, window)) \
        or inverted_match(got, _mistakes(T, window), want)
    if why is not None:
        not_yet(why)
    other = mask_verdict(allowed, want, "allowed")  # inverted, 0 and -inf swapped, shifted ...
    if other is not None and np.array_equal(got, ~want):  # inverted, or 0 and -inf swapped
        not_yet(other)
    rule = _rules(got)
    not_yet(rule if rule is not None else joined([other, _first_wrong_row(got, want)]))
