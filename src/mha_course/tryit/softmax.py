"""Self-check for the Try-it of 06_softmax.ipynb: a row of logits where subtracting the mean overflows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mha import steps
from mha_course.i18n import _
from mha_course.tryit import not_tried, not_yet, read_array, right, self_check

LN_MAX = {name: math.log(float(np.finfo(name).max)) for name in ("float16", "float32", "float64")}
LN_TINY = math.log(float(np.finfo("float64").smallest_subnormal))  # about -744.4: exp underflows to 0


def _as_row(answer: Any) -> np.ndarray:
    """The answer as a 1-D float64 row of at least two finite logits, or NotYet saying why not."""
    if isinstance(answer, dict | set) or np.isscalar(answer):
        not_yet(_("my_row must be a list of logits, e.g. [z0, z1, z2], got {kind} "
                  "{answer!r:.60}").format(kind=type(answer).__name__, answer=answer))
    raw = read_array(answer, _("my_row must be one flat list of numbers"))
    if raw.ndim == 2 and raw.shape[0] == 1:
        raw = raw[0]  # a (1, n) array is one row as well
    if raw.ndim != 1 or raw.size < 2:
        not_yet(_("my_row must be one row of at least two logits (a flat list), got shape "
                  "{shape}").format(shape=raw.shape))
    if raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.number):
        not_yet(_("my_row must hold numbers, got dtype {dtype}").format(dtype=raw.dtype))
    z = raw.astype(np.float64)
    if np.isnan(z).any():
        not_yet(_("your row holds NaN: a logit must be a finite number (NaN is what a broken "
                  "softmax returns, not what goes into one)"))
    if np.isinf(z).any():
        not_yet(_("your row holds inf or -inf: the logits must be finite. -inf is a masked score "
                  "and never overflows exp; +inf is already an overflow, so it proves nothing "
                  "about the mean"))
    return z


def _after_mean(z: np.ndarray) -> tuple[np.ndarray, bool, bool]:
    """(z - mean(z), whether exp of one of them overflows float64, whether only their sum does)."""
    with np.errstate(over="ignore", invalid="ignore"):
        shifted = z - z.mean()  # the mean is finite here (checked by the caller)
        e = np.exp(shifted)
        each = bool(np.isinf(e).any())
        return shifted, each, not each and bool(np.isinf(e.sum()))


@self_check
def check_mean_overflow(my_row: Any) -> str:
    """Say right if exp(z - mean z) overflows in float64 for the row, else which row it is instead."""
    if my_row is None:
        return not_tried(_("write a list of logits as `my_row`, one where subtracting the row's "
                           "mean instead of its max still overflows"))
    z = _as_row(my_row)
    with np.errstate(over="ignore"):
        mean = float(z.mean())
    if not math.isfinite(mean):
        not_yet(_("your logits are so large that their sum, and so the mean, overflows to inf "
                  "before any exp runs: then z - mean is -inf or NaN everywhere. Use logits that "
                  "float64 can add up; the question is where exp(z - mean) overflows for a "
                  "finite mean"))
    shifted, overflows, sum_only = _after_mean(z)
    top, low, ln64 = float(shifted.max()), float(shifted.min()), LN_MAX["float64"]
    if overflows:
        with np.errstate(over="ignore"):  # z - max may round to -inf for rows near 1e308: fine
            weights = np.array2string(steps.softmax(z), precision=3)
        return right(_("the mean is {mean:.4g}, so the largest exponent is {top:.4g} > "
                       "{ln64:.2f} and exp itself overflows (inf / inf is NaN); the max shift "
                       "keeps every exponent <= 0, and steps.softmax(my_row) = {weights} is "
                       "finite").format(mean=z.mean(), top=top, ln64=ln64, weights=weights))
    if sum_only:
        not_yet(_("after subtracting the mean your largest exponent is {top:.4g}, below "
                  "{ln64:.2f}: each exp fits in float64 and only their sum overflows (every "
                  "weight becomes finite / inf = 0, the silent failure of the sweep above). The "
                  "question asks for a row where exp itself overflows: one exponent above "
                  "{ln64:.2f}").format(top=top, ln64=ln64))
    if np.ptp(z) == 0:
        not_yet(_("all your logits are equal: subtracting the mean gives 0 everywhere and exp(0) "
                  "= 1, safe however large they are. The mean shift only fails when one logit "
                  "sits far above the row's mean"))
    if float(z.max()) > ln64:
        not_yet(_("your row overflows only without any shift (its largest logit {zmax:.4g} > "
                  "{ln64:.2f}), but subtracting its mean ({mean:.4g}) leaves a largest exponent "
                  "of {top:.4g}, which exp handles: the question is where the mean shift "
                  "fails").format(zmax=z.max(), ln64=ln64, mean=z.mean(), top=top))
    if low < LN_TINY and top <= LN_MAX["float32"]:
        not_yet(_("after subtracting the mean your smallest exponent is {low:.4g}: exp of it "
                  "underflows to 0, which is harmless (a weight of 0, as for a masked key). "
                  "Overflow needs the opposite: one exponent far above 0, a logit far above the "
                  "row's mean (your largest exponent is only {top:.4g})").format(low=low, top=top))
    if -low > top and top <= ln64:  # the outlier lies below: it drags the mean down
        not_yet(_("your row's outlier lies BELOW the others ({zmin:.4g}): it drags the mean "
                  "down, so the others rise to {top:.4g} after the shift, still below {ln64:.2f}, "
                  "and its own exp underflows towards 0, which is harmless. Overflow needs a "
                  "logit far ABOVE the row's mean, by more than {ln64:.2f}").format(
            zmin=z.min(), top=top, ln64=ln64))
    for dtype in ("float32", "float16"):
        if top > LN_MAX[dtype]:
            not_yet(_("after subtracting the mean your largest exponent is {top:.4g}: that "
                      "overflows in {dtype} (above {limit:.2f}), but the question is float64, "
                      "where exp overflows only above {ln64:.2f}").format(
                top=top, dtype=dtype, limit=LN_MAX[dtype], ln64=ln64))
    not_yet(_("after subtracting the mean your largest exponent is {top:.4g}, and exp overflows "
              "in float64 only above {ln64:.2f}: no overflow").format(top=top, ln64=ln64))
