"""Self-check for the Try-it of 15_backward_pass.ipynb: softmax's backward through its Jacobian."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import diagnose_backward
from . import not_tried, not_yet, right

WHAT = ("write the body of my_softmax_backward(dweights, weights): build J = diag(w) - w w^T for "
        "every row, (B, h, T, S, S), and return dscores (B, h, T, S)")


def _returns_none(fn: Any) -> bool:
    """True if fn, run on one small row, returns None (the untouched stub, or a missing return)."""
    w = np.array([[[[0.2, 0.3, 0.5]]]])  # (1, 1, 1, 3): one row of weights
    try:
        with np.errstate(all="ignore"):
            return fn(np.ones_like(w), w) is None
    except Exception:  # noqa: BLE001 - the full check below reports what it raised
        return False


def check_softmax_backward(answer: Any) -> str:
    """Say right, or name the mistake, running the student's function on four seeded cases."""
    if answer is None or (callable(answer) and _returns_none(answer)):
        return not_tried(WHAT + ("" if answer is None else " (yours returns None so far: end it "
                                                            "with `return dscores`)"))
    if not callable(answer):
        not_yet(f"my_softmax_backward must be a function (dweights, weights) -> dscores, got "
                f"{type(answer).__name__}")
    verdict = diagnose_backward.step_backward("softmax_backward", answer, own=True)
    if verdict.ok:
        return right(f"your Jacobian product equals grad.softmax_backward on all "
                     f"{len(verdict.cases)} seeded cases ({'; '.join(verdict.cases)}), so every "
                     f"row of your dscores sums to 0 and a fully masked row passes back 0")
    not_yet(verdict.message)
