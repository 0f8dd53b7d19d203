"""Self-check for the Try-it of 01_attention_from_scratch.ipynb: the mask of a moving average."""

from __future__ import annotations

from typing import Any

import numpy as np

from mha.attention import masks
from mha.modules import compose
from mha_course.tryit import (
    first_match,
    inverted_match,
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
        (_band(T, T, 0), "that is the plain causal mask: row t still sees every key back to 0, "
                         f"a running mean, not a moving average; cut off the keys more than "
                         f"{back} steps back"),
        (_band(T, back - 1, 0), f"that is a window of {window - 1}, one key short (off by one): "
                                f"row t must see {window} keys, itself included"),
        (_band(T, back + 1, 0), f"that is a window of {window + 1}, one key too many (off by one): "
                                f"row t sees {window + 1} keys, itself included"),
        (want.T, "that is the window turned round (transposed, the upper triangle): "
                 "row t sees itself and the keys after the query, the future; the "
                 "moving average looks back"),
        (_band(T, 0, T), "that is the upper triangle (np.triu): row t sees itself and every key "
                         "after the query; the moving average looks back, not ahead"),
        (~_band(T, T, 0), "that is the future alone (the causal mask inverted, s > t): row t "
                          "sees only keys after the query, and never itself"),
        (_band(T, back, back), "that window reaches both ways, including the future: row t also "
                               f"sees keys t+1 .. t+{back}; a moving average of the last "
                               f"{window} tokens sees none after t"),
        (_band(T, 0, 0), "that is the diagonal alone: every token averages only itself"),
        (_band(T, back, -1), f"the window without the query itself: row t sees keys t-{back} .. "
                             f"t-1, and row 0 nothing; x_t belongs to its own moving average"),
        (_band(T, T, 0) & ~want, f"that is the rest of the past, the complement of the window: "
                                 f"row t sees the keys more than {back} steps back and not the "
                                 f"last {window} (a tril offset with the wrong sign, or the "
                                 f"window inverted inside the causal mask?)"),
        (_band(T, T, 0) & ~_band(T, back - 1, 0), f"that keeps the keys at least {back} steps "
                                                  f"back, older than the window, and drops the "
                                                  f"recent ones: a tril offset of -{back} "
                                                  f"keeps keys s <= t - {back}; the window is "
                                                  f"t - {back} <= s <= t"),
        (np.ones((T, T), dtype=bool), "that mask allows everything: no mask at all, every row "
                                      f"averages all {T} tokens, the future included"),
        (short, f"rows 0 .. {back - 1} see no key at all: a slice like [t - {back} : t + 1] "
                f"starts at a negative index for the first rows, which numpy reads from the end "
                f"of the row, so the slice is empty; the first rows average the tokens there are"),
        (_wrapped(T, back), f"row 0 also sees the last keys of the sequence: an index t - {back} "
                            f"below 0 wraps round to the end (negative indices count from the "
                            f"end in numpy); the window of the first rows stops at key 0"),
    ]


def _rules(got: np.ndarray) -> str | None:
    """What a mask that fits no listed mistake breaks: the future, the query itself, empty rows."""
    T = got.shape[0]
    future = np.argwhere(np.triu(got, k=1))  # (n, 2): allowed keys s > t
    empty = np.flatnonzero(~got.any(axis=-1))
    if not got.any():
        return ("that mask allows nothing: every row is False, so no token has anything to "
                "average (masked_softmax gives a row of zeros); an empty mask usually comes "
                "from a tril / triu offset with the wrong sign, or from & of two masks that do "
                "not overlap")
    if len(future):
        t, s = (int(i) for i in future[0])
        return (f"row {t} sees key {s}, after the query: the future; a moving average looks "
                f"back only")
    if not got.diagonal().any():
        return ("that mask leaves out the query itself (the diagonal is all False): row t "
                "sees keys before t only, and row 0 sees nothing; x_t belongs to its own "
                "moving average")
    if len(empty):
        return (f"row {int(empty[0])} sees no key at all ({len(empty)} of {T} rows are empty): "
                f"every token belongs to its own moving average")
    return None


def _first_wrong_row(got: np.ndarray, want: np.ndarray) -> str:
    """Which keys the first wrong row lets its query see, without drawing the answer."""
    t = int(np.argmax((got != want).any(axis=-1)))  # the first row that is wrong
    return f"row {t} is the first wrong row: your mask lets query {t} see keys " \
           f"{np.flatnonzero(got[t]).tolist()}"


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
    return (f"{name} holds attention weights (each row sums to 1), the result of the softmax: "
            f"the exercise asks for the mask that goes into it, True where query t may see key s")


def _size(answer: Any) -> int | None:
    """How many numbers the answer holds, or None if numpy cannot read it as one array."""
    try:
        return int(np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer).size)
    except Exception:  # noqa: BLE001 - ragged lists: read_mask says what arrived
        return None


_USE = {"bool": "", "0/1": "; it holds 0/1 numbers, and masked_softmax wants booleans, so pass "
                           "it as allowed == 1",
        "additive": "; it is an additive mask (0 where allowed), and masked_softmax wants booleans, so "
                    "pass it as allowed == 0 (not .astype(bool), which would invert it)"}


_WINDOW_BUILDERS = (masks, compose)  # the package's own window masks


@self_check
def check_window_mask(allowed: Any, T: int = 8, window: int = 3) -> str:
    """Say right, or which mistake the mask of a moving average over `window` tokens makes."""
    if allowed is None:
        return not_tried(f"write `allowed`, a ({T}, {T}) boolean array (True where query t may "
                         f"see key s), then run this cell")
    if isinstance(allowed, str | bytes) or callable(allowed):
        not_yet(f"allowed must be a ({T}, {T}) boolean array, got {type(allowed).__name__} "
                f"{allowed!r:.60}")
    weights = weights_not_mask(allowed, "allowed", T)
    if weights is not None:
        not_yet(weights)
    if _size(allowed) == T:
        not_yet(f"allowed holds {T} numbers, one per token: that is the averaged sequence, not "
                f"the mask; the mask has one entry per pair (query t, key s), shape ({T}, {T})")
    got, convention = read_mask(allowed, "allowed")  # bool, 0/1 or additive, read as allowed
    want = _band(T, window - 1, 0)  # (T, T): keys t - window + 1 .. t
    if got.shape != want.shape:
        not_yet(relate(got, want, "allowed"))
    if np.array_equal(got, want):
        refuse_if_reached(_WINDOW_BUILDERS, "this Try-it asks you to build the mask with numpy")
        return right(f"row t sees keys t-{window - 1} .. t (fewer at the start), so "
                     f"masked_softmax(zeros, allowed) spreads 1/{window} over the last {window} "
                     f"tokens: a moving average{_USE[convention]}")
    why = first_match(got, _mistakes(T, window)) or transposed_match(got, _mistakes(T, window)) \
        or inverted_match(got, _mistakes(T, window), want)
    if why is not None:
        not_yet(why)
    other = mask_verdict(allowed, want, "allowed")  # inverted, 0 and -inf swapped, shifted ...
    if other is not None and ("inverted" in other or "swapped" in other):
        not_yet(other)
    rule = _rules(got)
    not_yet(rule if rule is not None else f"{other}; {_first_wrong_row(got, want)}")
