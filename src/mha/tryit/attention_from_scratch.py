"""Self-check for the Try-it of 01_attention_from_scratch.ipynb: the mask of a moving average."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import as_array, not_tried, not_yet, right


def _band(T: int, back: int, ahead: int) -> np.ndarray:
    """(T, T) boolean: query t sees keys t - back .. t + ahead (clipped to 0 .. T-1)."""
    t = np.arange(T)[:, None]  # (T, 1): the query's position
    s = np.arange(T)[None, :]  # (1, T): the key's position
    return (s >= t - back) & (s <= t + ahead)  # (T, T)


def _mistakes(T: int, window: int) -> list[tuple[np.ndarray, str]]:
    """The typical wrong masks for a moving average over the last `window` tokens."""
    back = window - 1  # keys t-2, t-1, t for window 3
    everything = np.ones((T, T), dtype=bool)
    return [
        (_band(T, T, 0), "that is the plain causal mask: row t still sees every key back to 0, "
                         f"a running mean, not a moving average; cut off the keys more than "
                         f"{back} steps back"),
        (_band(T, back - 1, 0), f"that is a window of {window - 1}, one key short (off by one): "
                                f"row t must see {window} keys, itself included"),
        (_band(T, back + 1, 0), f"that is a window of {window + 1}, one key too many (off by one): "
                                f"row t sees {window + 1} keys, itself included"),
        (_band(T, 0, back), "that is the window turned round (transposed, the upper triangle): "
                            "row t sees itself and the keys after the query, the future; the "
                            "moving average looks back"),
        (_band(T, 0, T), "that is the upper triangle (np.triu): row t sees itself and every key "
                         "after the query; the moving average looks back, not ahead"),
        (_band(T, back, back), "that window reaches both ways, including the future: row t also "
                               f"sees keys t+1 .. t+{back}; a moving average of the last "
                               f"{window} tokens sees none after t"),
        (_band(T, 0, 0), "that is the diagonal alone: every token averages only itself"),
        (everything, "that mask allows everything: no mask at all, every row averages all T "
                     "tokens, the future included"),
    ]


def _fallback(got: np.ndarray, want: np.ndarray) -> str:
    """Where the mask first differs from the moving average's, without drawing the answer."""
    t = int(np.argmax((got != want).any(axis=-1)))  # the first row that is wrong
    keys = np.flatnonzero(got[t]).tolist()
    return (f"row {t} is the first wrong row: your mask lets query {t} see keys {keys}; the "
            f"moving average of x_{t} uses the last {int(want.sum(-1).max())} tokens up to "
            f"and including x_{t} (fewer at the start)")


def _kind(answer: Any, T: int) -> np.ndarray:
    """The mask as a (T, T) boolean array, or NotYet naming a float, int or 0/-inf mask."""
    if isinstance(answer, str | bytes) or callable(answer):
        not_yet(f"allowed must be a ({T}, {T}) boolean array, got {type(answer).__name__} "
                f"{answer!r}")
    try:
        numeric = np.issubdtype(np.asarray(answer).dtype, np.number)
    except Exception:  # noqa: BLE001 - ragged lists: as_array says what arrived
        numeric = False
    if not numeric:
        return as_array(answer, "allowed", shape=(T, T), kind="bool")
    value = as_array(answer, "allowed", shape=(T, T), kind="number")
    if np.isin(value, (0.0, -np.inf)).all() and np.isinf(value).any():
        not_yet("that is an additive float mask (0 where allowed, -inf where masked): "
                "masked_softmax wants the boolean mask itself, True where query t may see key s")
    if np.isin(value, (0.0, 1.0)).all():
        kind = "floats" if np.issubdtype(value.dtype, np.floating) else "ints"
        not_yet(f"that mask holds {kind} (dtype {value.dtype}), not booleans: masked_softmax "
                f"needs True / False (True = may see the key); make it with comparisons or "
                f".astype(bool), then run this cell again")
    not_yet(f"allowed must hold booleans (True = may see the key), got dtype {value.dtype} with "
            f"values other than 0 and 1")


def check_window_mask(allowed: Any, T: int = 8, window: int = 3) -> str:
    """Say right, or which mistake the mask of a moving average over `window` tokens makes."""
    if allowed is None:
        return not_tried(f"write `allowed`, a ({T}, {T}) boolean array (True where query t may "
                         f"see key s), then run this cell")
    got = _kind(allowed, T)  # (T, T) bool
    want = _band(T, window - 1, 0)  # (T, T): keys t - window + 1 .. t
    if np.array_equal(got, want):
        return right(f"row t sees keys t-{window - 1} .. t (fewer at the start), so "
                     f"masked_softmax(zeros, allowed) spreads 1/{window} over the last {window} "
                     f"tokens: a moving average")
    for wrong, why in _mistakes(T, window):
        if np.array_equal(got, wrong):
            not_yet(why)
    if not got.diagonal().any():
        not_yet("that mask leaves out the query itself (the diagonal is all False): row t "
                "sees keys before t only, and row 0 sees nothing; x_t belongs to its own "
                "moving average")
    not_yet(_fallback(got, want))
