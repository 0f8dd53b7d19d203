"""Self-check for the Try-it of 06_softmax.ipynb: a row of logits where subtracting the mean overflows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import steps
from . import not_tried, not_yet, right

LN_MAX = {name: math.log(float(np.finfo(name).max)) for name in ("float32", "float64")}


def _as_row(answer: Any) -> np.ndarray:
    """The answer as a 1-D float64 row of at least two finite logits, or NotYet saying why not."""
    if isinstance(answer, str | bytes | dict | set) or np.isscalar(answer):
        not_yet(f"my_row must be a list of logits, e.g. [z0, z1, z2], got "
                f"{type(answer).__name__} {answer!r}")
    try:
        raw = np.asarray(answer)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        not_yet(f"my_row must be one flat list of numbers, got {type(answer).__name__} that numpy "
                f"cannot read as one")
    if raw.ndim != 1 or raw.size < 2:
        not_yet(f"my_row must be one row of at least two logits (a flat list), got shape {raw.shape}")
    if raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.number):
        not_yet(f"my_row must hold numbers, got dtype {raw.dtype}")
    z = raw.astype(np.float64)
    if np.isnan(z).any():
        not_yet("your row holds NaN: a logit must be a finite number (NaN is what a broken softmax "
                "returns, not what goes into one)")
    if np.isinf(z).any():
        not_yet("your row holds inf or -inf: the logits must be finite. -inf is a masked score and "
                "never overflows exp; +inf is already an overflow, so it proves nothing about the "
                "mean")
    return z


def _exponents(z: np.ndarray) -> tuple[np.ndarray, bool]:
    """The exponents z - mean(z), and whether exp of them (or their sum) overflows float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        shifted = z - z.mean()
        e = np.exp(shifted)
        return shifted, bool(np.isinf(e).any() or np.isinf(e.sum()))


def check_mean_overflow(my_row: Any) -> str:
    """Say right if exp(z - mean z) overflows in float64 for the row, else which row it is instead."""
    if my_row is None:
        return not_tried("write a list of logits as `my_row`, one where subtracting the row's "
                         "mean instead of its max still overflows")
    z = _as_row(my_row)
    shifted, overflows = _exponents(z)
    top, ln64 = float(shifted.max()), LN_MAX["float64"]
    if overflows:
        with np.errstate(over="ignore"):  # z - max may round to -inf for rows near 1e308: fine
            weights = np.array2string(steps.softmax(z), precision=3)
        return right(f"the mean is {z.mean():.4g}, so the largest exponent is {top:.4g} > "
                     f"{ln64:.2f} and exp overflows; the max shift keeps every exponent <= 0, and "
                     f"steps.softmax(my_row) = {weights} "
                     f"is finite")
    if np.ptp(z) == 0:
        not_yet("all your logits are equal: subtracting the mean gives 0 everywhere and exp(0) = 1, "
                "safe however large they are. The mean shift only fails when one logit sits far "
                "above the row's mean")
    if float(z.max()) > ln64:
        not_yet(f"your row overflows only without any shift (its largest logit {z.max():.4g} > "
                f"{ln64:.2f}), but subtracting its mean ({z.mean():.4g}) leaves a largest exponent "
                f"of {top:.4g}, which exp handles: the question is where the mean shift fails")
    if top > LN_MAX["float32"]:
        not_yet(f"after subtracting the mean your largest exponent is {top:.4g}: that overflows "
                f"in float32 (above {LN_MAX['float32']:.2f}), but the question is float64, where "
                f"exp overflows only above {ln64:.2f}")
    not_yet(f"after subtracting the mean your largest exponent is {top:.4g}, and exp overflows in "
            f"float64 only above {ln64:.2f}: no overflow")
