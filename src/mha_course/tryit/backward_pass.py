"""Self-check for the Try-it of 15_backward_pass.ipynb: softmax's backward through its Jacobian.

The student's my_softmax_backward(dweights, weights) runs under the grading guard (the package's
own gradients are the answer key) on four seeded cases: ordinary, peaked, causal and fully masked
weights. Where it differs from the reference, every typical slip that gives the same numbers is
named; an unlisted one is described by how it relates to the right dscores (a ratio, a transpose,
the first entry that differs) and by the two properties it breaks (rows summing to 0, masked keys
getting 0). No message shows the formula or the code of the answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from mha import steps
from mha.training.grad import softmax_backward as _reference  # bound at import: the answer key
from mha_course.diagnose.backward import step_cases
from mha_course.i18n import _
from mha_course.tryit import (
    first_match,
    joined,
    not_tried,
    not_yet,
    read_array,
    relate,
    require_params,
    right,
    run_student,
    self_check,
)


def _what() -> str:
    """What the placeholder asks for."""
    return _("write the body of my_softmax_backward(dweights, weights): build J = diag(w) - w w^T "
             "for every row, (B, h, T, S, S), and return dscores (B, h, T, S)")


def _rule() -> str:
    """What the grading guard says when the package's gradients made the answer."""
    return _("write softmax's backward yourself (numpy, and steps' forward functions if you "
             "like); the package's gradients are the answer key")


def _case_name(case: str) -> str:
    """A seeded case's name (from mha_course.diagnose.backward) in the learner's language."""
    names = {"ordinary weights (2, 3, 4, 6)": _("ordinary weights (2, 3, 4, 6)"),
             "peaked weights (scores in the tens)": _("peaked weights (scores in the tens)"),
             "causal weights: exact zeros above the diagonal":
                 _("causal weights: exact zeros above the diagonal"),
             "a fully masked row (all its weights 0)": _("a fully masked row (all its weights 0)")}
    return names.get(case, case)


def _returns_none(fn: Any) -> bool:
    """True if fn, run on one small row, returns None (the untouched stub, or a missing return)."""
    w = np.array([[[[0.2, 0.3, 0.5]]]])  # (1, 1, 1, 3): one row of weights
    try:
        with np.errstate(all="ignore"):
            return fn(np.ones_like(w), w) is None
    except Exception:  # noqa: BLE001 - the full check below reports what it raised
        return False


def _slips(g: np.ndarray, w: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """Typical wrong dscores for upstream g and weights w, each with the sentence that names it."""
    S = w.shape[-1]
    wg = (w * g).sum(-1, keepdims=True)  # (B, h, T, 1): one w . g per row
    right_one = w * (g - wg)  # (B, h, T, S)
    with np.errstate(all="ignore"):
        sign = (-right_one, _("sign flipped: yours is exactly minus the right gradient, as from "
                              "w w^T - diag(w). The Jacobian has +w_i on its diagonal and -w_i w_j "
                              "everywhere"))
        zeros = (np.zeros_like(w), _("0 everywhere: the einsum (or sum) paired dweights with the "
                                     "index it kept, so it multiplied dweights by a row sum of J, "
                                     "and every row and column of J sums to 0. Sum over the index "
                                     "J and dweights share, keep the other"))
        slips = [
            (w * g, _("kept only diag(w) of the Jacobian: the -w w^T part is missing, so the rows "
                      "of your dscores do not sum to 0 (they must: adding one constant to a whole "
                      "row of scores leaves softmax unchanged)")),
            sign,
            (w * g - w * w * g, _("w * w (elementwise) where the outer product w w^T belongs: "
                                  "that keeps only J's diagonal, w_i (1 - w_i), and drops every "
                                  "off-diagonal -w_i w_j. The outer product of one row is an "
                                  "(S, S) matrix, (B, h, T, S, S) for all rows")),
            (w * g - w * w * g.sum(-1, keepdims=True),
             _("w * w (the squares of one row) where the outer product w w^T belongs: your J has "
               "-w_j^2 in every row of column j, not -w_i w_j; the off-diagonal entry pairs the "
               "row's weight with the column's. The outer product of one row is an (S, S) "
               "matrix")),
            (w * g - (g * w * w).sum(-1, keepdims=True),
             _("w * w (the squares of one row) where the outer product w w^T belongs: your J has "
               "-w_i^2 across row i, not -w_i w_j; the off-diagonal entry pairs the row's weight "
               "with the column's. The outer product of one row is an (S, S) matrix")),
            (w * (w - (w * w).sum(-1, keepdims=True)),
             _("the weights where the upstream gradient belongs: J was applied to the weights, "
               "not to dweights (the gradient arriving from the next step)")),
            (g * (w - wg), _("the two arguments swapped: yours treats dweights as the weights and "
                             "the weights as dweights; the function is called as (dweights, "
                             "weights), in that order")),
            (-w * wg, _("diag(w) is missing: only the -w w^T part of the Jacobian is left. J has "
                        "w_i on its diagonal as well as -w_i w_j everywhere")),
            (w * (g + wg), _("the outer product's sign: J = diag(w) + w w^T where the minus "
                             "belongs (the off-diagonal entries of softmax's Jacobian are "
                             "-w_i w_j)")),
            (wg * (1 - w), _("diag(w) without its identity: w_i stood in every column of row i's "
                             "J, not only on the diagonal i = j, so each entry became "
                             "(w . g)(1 - w_j). A diagonal matrix keeps w_i where i = j and 0 "
                             "elsewhere")),
            (w * (g - w), _("w . g replaced by w itself: the term subtracted from g must be one "
                            "number per row, the same for every key of the row")),
            zeros,
            (w * (g - (w * g).sum(-2, keepdims=True)),
             _("w . g summed over axis -2 (the queries): w . g belongs to one query row, a sum "
               "over its keys, the last axis")),
            (w * (g - (w * g).mean(-1, keepdims=True)),
             _("the mean of w * g where its sum belongs: w . g is a sum over the row's keys, not "
               "an average")),
            (w * (g - (w * g).sum()), _("w . g summed over the whole array, one number for every "
                                        "row: it belongs to one query row")),
            (g - wg, _("the factor w in front is missing: every entry of dscores carries its own "
                       "key's weight w_j (J's column j is w_j times something), so a masked key "
                       "(w = 0) must get 0, and yours gives it a gradient")),
            (w * (g - wg / w.sum(-1, keepdims=True)),
             _("a division by the row sum of w: softmax's rows already sum to 1, so the backward "
               "needs no division, and in a fully masked row that sum is 0 (0 / 0 = NaN)")),
            (w * (g - wg) * math.sqrt(S), _("sqrt(S) times too big: the softmax backward has no "
                                            "scale; 1/sqrt(d_k) belongs to the scores' step")),
            (w * (g - wg) / math.sqrt(S), _("1/sqrt(S) of the right gradient: the softmax "
                                            "backward has no scale; 1/sqrt(d_k) belongs to the "
                                            "scores' step")),
        ]
    flipped = [(-v, _("the sign is flipped as well: yours is minus what this slip gives: "
                      "{why}").format(why=why))
               for v, why in slips if why not in (sign[1], zeros[1])]
    return slips + flipped


def _raised_hint(text: str, w: np.ndarray) -> str:
    """What an error raised by a student's softmax backward most likely means, from its words
    (numpy's, English in both editions) and the shapes it names, or ''."""
    shapes = {tuple(int(n) for n in m.split(",") if n.strip())
              for m in re.findall(r"\(([\d, ]+)\)", text)}
    if "could not be broadcast" in text and w.shape in shapes and w.shape[:-1] in shapes:
        return _("Missing keepdims? A sum over the keys without keepdims drops the key axis, so "
                 "the (B, h, T) row sums cannot meet the (B, h, T, S) gradient.")
    if "could not be broadcast" in text and any(len(sh) == 2 and sh[0] == sh[1] != w.shape[-1]
                                                for sh in shapes):
        return _("A ({T}, {T}) square met a row of {S} keys: a row's Jacobian is (S, S), S the "
                 "number of keys, the last axis of the weights (this case has T = {T} queries "
                 "and S = {S} keys).").format(T=w.shape[-2], S=w.shape[-1])
    if "must be 1- or 2-d" in text:
        return _("np.diag builds one (S, S) matrix from one 1-D row; the weights here are "
                 "(B, h, T, S), so every row's diagonal matrix has to be built at once, by "
                 "broadcasting against np.eye(S).")
    if "mismatch in its core dimension" in text:
        return _("J @ dweights reads dweights (B, h, T, S) as a stack of (T, S) matrices; each "
                 "row's (S, S) Jacobian must meet that row's gradient alone, an (S,) vector.")
    if "einstein sum subscripts" in text or "remapped shapes" in text:
        return _("The einsum's subscripts do not fit the arrays: J is (B, h, T, S, S), dweights "
                 "(B, h, T, S).")
    return ""


def _run(fn: Callable, g: np.ndarray, w: np.ndarray, case: str) -> Any:
    """fn(g, w) on copies under the grading guard; an error in it is named with the case and line."""
    name = getattr(fn, "__name__", _("function"))
    with np.errstate(all="ignore"):
        return run_student(fn, g.copy(), w.copy(),
                           said_as=_("[case: {case}] your {name}").format(case=case, name=name),
                           hint=lambda text: _raised_hint(text, w), allow=(steps,), rule=_rule())


def _properties(got: np.ndarray, w: np.ndarray) -> str:
    """The properties of a softmax backward that the answer breaks, measured."""
    said = []
    sums = np.abs(got.sum(-1))  # (B, h, T): each should be 0
    if np.isfinite(sums).all() and sums.max() > 1e-8:
        said.append(_("its rows should each sum to 0 (a shift of a whole row of scores leaves "
                      "softmax unchanged) and sum to up to {most:.3g}").format(most=sums.max()))
    leak = (w == 0) & (got != 0)
    if leak.any():
        n = int(leak.sum())
        said.append(_("1 entry where the weight is 0 (a masked key) got a gradient, which must be "
                      "exactly 0") if n == 1 else
                    _("{n} entries where the weight is 0 (a masked key) got a gradient, which "
                      "must be exactly 0").format(n=n))
    return "".join(_("; {clause}").format(clause=s) for s in said)


def _constant_ratio(got: np.ndarray, want: np.ndarray) -> str | None:
    """'every entry is 2 times the right one' when got is a constant multiple of want, else None."""
    big = np.abs(want) > 1e-9 * np.abs(want).max()
    if not big.any() or not np.isfinite(got).all() or np.abs(got[~big]).max(initial=0) > 1e-9:
        return None
    ratios = got[big] / want[big]
    r = float(np.median(ratios))
    if r in (0.0, 1.0) or not np.allclose(ratios, r, rtol=1e-6, atol=0):
        return None
    return _("every entry of your dscores is {r:.4g} times the right one: the right pattern with "
             "a constant factor that does not belong (softmax's backward has no scale of its "
             "own)").format(r=r)


def _judge_case(fn: Callable, case: str, g: np.ndarray, w: np.ndarray) -> None:
    """Nothing if fn agrees with the reference on this case, else NotYet naming how it differs."""
    name = getattr(fn, "__name__", _("function"))
    out = _run(fn, g, w, case)
    if out is None:
        not_yet(_("[case: {case}] your {name} returned None: did you forget the "
                  "`return`?").format(case=case, name=name))
    if isinstance(out, tuple):
        not_yet(_("[case: {case}] your {name} returned a tuple of {n}; it must return one array, "
                  "dscores {shape}").format(case=case, name=name, n=len(out), shape=w.shape))
    got = read_array(out, _("[case: {case}] your {name} must return an array, dscores "
                            "{shape}").format(case=case, name=name, shape=w.shape))
    if got.dtype == object or got.dtype.kind not in "biuf":
        not_yet(_("[case: {case}] your {name} must return an array of numbers, dscores {shape}, "
                  "got dtype {dtype}").format(case=case, name=name, shape=w.shape,
                                              dtype=got.dtype))
    want = _reference(g, w)  # (B, h, T, S)
    # float64 agrees to rounding; an answer computed in float32 (or float16) to its own rounding.
    # Every slip differs by order 0.1 of the largest entry, so 1e-6 of it separates them safely
    eps = np.finfo(got.dtype).eps if got.dtype.kind == "f" else 0.0
    tol = max(16 * w.shape[-1] * eps, 1e-6)
    if got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol * np.abs(want).max()):
        return
    if got.shape != want.shape:
        said = relate(got, want, _("your dscores"))
        if got.shape == (*want.shape, want.shape[-1]):
            not_yet(_("[case: {case}] {said}. Did you return J itself? dscores is J applied to "
                      "dweights, one number per key.").format(case=case, said=said))
        not_yet(_("[case: {case}] {said}.").format(case=case, said=said))
    got = got.astype(np.float64)
    nan = -7.25  # stands for NaN on both sides, so a slip's NaN matches the answer's NaN
    named = first_match(np.where(np.isnan(got), nan, got),
                        [(np.where(np.isnan(v), nan, v), why) for v, why in _slips(g, w)], atol=1e-9)
    if named is None:
        named = _constant_ratio(got, want)
    if named is None:
        named = relate(got, want, _("your dscores"),
                       factors={"sqrt(S)": math.sqrt(w.shape[-1]), _("S (the keys)"): w.shape[-1]},
                       atol=1e-12, rtol=1e-9) + _properties(got, w)
    not_yet(_("[case: {case}] {said}").format(case=case, said=named))


@self_check
def check_softmax_backward(answer: Any) -> str:
    """Say right, or name the mistake, running the student's function on four seeded cases."""
    if answer is None:
        return not_tried(_what())
    if callable(answer) and _returns_none(answer):
        return not_tried(_("{what} (yours returns None so far: end it with `return "
                           "dscores`)").format(what=_what()))
    if not callable(answer):
        not_yet(_("my_softmax_backward must be a function (dweights, weights) -> dscores, got "
                  "{kind}").format(kind=type(answer).__name__))
    require_params(answer, ("dweights", "weights"), "my_softmax_backward")
    cases = [(_case_name(case), gw) for case, gw in
             step_cases("softmax_backward", np.random.default_rng(0))]
    for case, (g, w) in cases:
        _judge_case(answer, case, g, w)
    return right(_("your Jacobian product equals softmax's gradient on all {n} seeded cases "
                   "({cases}), so every row of your dscores sums to 0 and a fully masked row "
                   "passes back 0").format(n=len(cases), cases=joined(c for c, _gw in cases)))
