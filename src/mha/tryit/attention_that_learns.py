"""Self-check for the Try-it of 10_attention_that_learns.ipynb: the keys a rotation head reads.

The task is y[t] = x[(t + shift) % T]; the student predicts, for each query t, the key the
trained head reads most. The rule decides; the head the notebook trained (`read`, measured
there) is a cross-check that the model really learned it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import as_array, not_tried, not_yet, right


def _keys(answer: Any, name: str, T: int) -> np.ndarray:
    """The answer as T integer key positions, or NotYet saying what arrived instead."""
    if isinstance(answer, str | bytes):
        not_yet(f"{name} must be a list of {T} key positions (ints), got text {answer!r}")
    got = as_array(answer, name, shape=(T,), kind="number")
    if not np.all(got == np.round(got)):
        not_yet(f"{name} must hold whole key positions, got {got.tolist()}")
    return got.astype(np.int64)


def _mistakes(T: int, shift: int) -> list[tuple[np.ndarray, str]]:
    """Typical wrong predictions for y[t] = x[(t + shift) % T], each with what it gets wrong."""
    t = np.arange(T)
    return [
        ((t - shift) % T, f"shifted the other way: that list sends query t to key t - {shift}, "
                          f"the map for y[t] = x[t - {shift}] (or, read backwards, which query "
                          f"reads each key); the target here is the token {shift} places on"),
        (t + shift, f"keys {T}, {T + 1}, ... do not exist: positions run 0..{T - 1}, and the "
                    f"rotation wraps around at the end"),
        (t - shift, f"negative keys do not exist: positions run 0..{T - 1}, and the rotation "
                    f"wraps around at the start"),
        (t, "that is the diagonal, each query reading its own position: it would copy x, but "
            f"the target is the token {shift} places on"),
        (T - 1 - t, "that is the reversal map from the first task (the anti-diagonal); this "
                    "task rotates instead of mirroring"),
        ((t + shift - 1) % T, f"off by one: that shifts by {shift - 1}, one place short"),
        ((t + shift + 1) % T, f"off by one: that shifts by {shift + 1}, one place too far"),
        ((t + shift) % T + 1, f"counted from 1: key positions start at 0 (query 0 ... query "
                              f"{T - 1}, key 0 ... key {T - 1})"),
    ]


def _first_difference(got: np.ndarray, want: np.ndarray, T: int) -> str:
    """Where the prediction first goes wrong, without saying what is right there."""
    if got.min() < 0 or got.max() >= T:
        bad = int(got[(got < 0) | (got >= T)][0])
        return f"key {bad} does not exist: positions run 0..{T - 1}"
    if len(set(got.tolist())) == 1:
        return (f"every query reads the same key {int(got[0])}: each query t needs its own "
                f"token, so the keys must differ")
    t = int(np.flatnonzero(got != want)[0])
    return (f"query {t} is the first that goes wrong (you have key {int(got[t])}): which "
            f"position holds the token that y[{t}] must copy?")


def check_rotation_keys(answer: Any, read: Any = None, T: int = 8, shift: int = 3) -> str:
    """Say right, or which mistake the predicted keys of the rotation head make.

    `read` is what the trained head reads most (measured in the notebook), or None.
    """
    if answer is None:
        return not_tried(f"write the {T} key positions as the list `answer`: for each query "
                         f"t = 0, ..., {T - 1}, the key the trained head reads")
    got = _keys(answer, "answer", T)
    want = (np.arange(T) + shift) % T
    measured = None if read is None else _keys(read, "read (the trained head's keys)", T)
    if np.array_equal(got, want):
        said = (f"query t reads key (t + {shift}) % {T}: a diagonal shifted {shift} to the "
                f"right that wraps around from query {T - shift} on")
        if measured is not None and not np.array_equal(measured, want):
            said += (f"; but this run's head reads {measured.tolist()}: it has not learned the "
                     f"rotation everywhere (train longer, or check its accuracy)")
        elif measured is not None:
            said += ", and the trained head reads exactly these keys"
        return right(said)
    for wrong, why in _mistakes(T, shift):
        if np.array_equal(got, wrong):
            not_yet(why)
    not_yet(_first_difference(got, want, T))
