"""Self-checks for the lessons' Try-it exercises: one module per lesson, one contract for all.

A lesson imports its module as `from mha.tryit import <topic> as tryit` and calls
`print(tryit.check_<name>(answer))` under the exercise. Every `check_*` here obeys one
contract, which `tests/test_self_checks.py` enforces with the cases in `tests/self_checks/`:

- the placeholder `None` returns "not tried yet: ..." and shows neither the answer nor a hint
  that gives it away, so Run All passes before the student has written a line;
- the right answer returns "right: ...";
- each typical wrong answer raises `NotYet` ("not yet: ...") naming that mistake, and different
  mistakes get different messages (off by one, reversed, swapped axes, wrong units, ...);
- an answer of the wrong kind (text, a list of the wrong length, a float mask) raises `NotYet`
  saying what was expected and what arrived, never a raw numpy error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import numpy as np


class NotYet(AssertionError):
    """A self-check's verdict on a wrong answer: the message names the mistake."""


def not_tried(what: str) -> str:
    """The message for the untouched placeholder: what to write, nothing about the answer."""
    return f"not tried yet: {what}"


def right(why: str) -> str:
    """The message for a right answer."""
    return f"right: {why}"


def not_yet(why: str) -> NoReturn:
    """Reject a wrong answer with a message that names the mistake."""
    raise NotYet(f"not yet: {why}")


def as_number(answer: Any, name: str, integer: bool = False) -> float | int:
    """The answer as a plain number, or NotYet saying what arrived instead (text, a list, ...)."""
    if isinstance(answer, bool | np.bool_) or isinstance(answer, str | bytes):
        not_yet(f"{name} must be a number, got {type(answer).__name__} {answer!r}")
    try:
        value = np.asarray(answer)
    except Exception:  # noqa: BLE001 - anything that is not array-like
        not_yet(f"{name} must be a number, got {type(answer).__name__}")
    if value.shape != () or not np.issubdtype(value.dtype, np.number):
        not_yet(f"{name} must be one number, got {type(answer).__name__} of shape {value.shape} "
                f"and dtype {value.dtype}")
    if not np.isfinite(value):
        not_yet(f"{name} must be a finite number, got {value.item()}")
    if integer:
        if float(value) != int(value):
            not_yet(f"{name} must be a whole number, got {value.item()}")
        return int(value)
    return float(value)


def read_array(answer: Any, expected: str) -> np.ndarray:
    """Any array-like answer (a list, a numpy array, a torch tensor) as numpy, or NotYet.

    `expected` says what was wanted, e.g. "positions must be a (3, 5) int array".
    """
    if isinstance(answer, str | bytes):
        not_yet(f"{expected}, got text {answer!r:.40}")
    try:
        return np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        not_yet(f"{expected}, got {type(answer).__name__} that numpy cannot read as one "
                f"(rows of different lengths?)")


def as_array(answer: Any, name: str, shape: Sequence[int] | None = None, kind: str = "number",
             ) -> np.ndarray:
    """The answer as an array of the expected shape and kind ("number", "int" or "bool").

    Raises NotYet, not a numpy error, for text, ragged lists, a wrong shape or a wrong dtype.
    """
    try:
        value = np.asarray(answer)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        not_yet(f"{name} must be an array, got {type(answer).__name__} that numpy cannot read "
                f"as one")
    want = {"number": "numbers", "int": "whole numbers (an int array)",
            "bool": "booleans (True = may attend)"}[kind]
    ok = {"number": np.issubdtype(value.dtype, np.number) and value.dtype != np.bool_,
          "int": np.issubdtype(value.dtype, np.integer),
          "bool": value.dtype == np.bool_}[kind]
    if shape is not None and value.shape != tuple(shape):
        not_yet(f"{name} must have shape {tuple(shape)}, got shape {value.shape}")
    if not ok:
        hint = " (e.g. .astype(bool))" if kind == "bool" and np.issubdtype(value.dtype, np.number) else ""
        not_yet(f"{name} must hold {want}, got dtype {value.dtype}{hint}")
    return value


def first_match(got: np.ndarray, mistakes: Iterable[tuple[Any, str]],
                atol: float = 0.0) -> str | None:
    """The message of the first typical mistake whose value `got` equals, or None."""
    for wrong, why in mistakes:
        w = np.asarray(wrong)
        if w.shape != got.shape:
            continue
        same = (np.array_equal(got, w) if w.dtype == np.bool_ or got.dtype == np.bool_
                else np.allclose(got, w, rtol=0.0, atol=atol))
        if same:
            return why
    return None
