"""Say what is wrong with a student's step backward or whole backward, as `mha_course.diagnose` does
for the forward.

    check_step_backward("softmax_backward", fn)     # the success line, or AssertionError(why)
    step_backward("softmax_backward", fn)           # the same as a Diagnosis object
    check_backward(my_backward, module=None)        # a whole backward with grad.backward's signature
    backward_diagnosis(my_backward, module=None)    # the same as a Diagnosis object

How it decides: the student's step runs on seeded cases (ordinary first, edge cases after)
against the reference (`mha.training.grad.REFERENCE_STEPS`). Where it differs, every planted bug of that
step (`mha_course.planted.BACKWARD_BUGS`) runs on the same inputs, and the one that matches, and was
right on the earlier cases, is named with evidence measured on this run: "softmax_backward
(step 5): ... [case: ...; matches planted bug 'softmax_no_outer_product']". Then the same for
slips that are not planted bugs (`_SLIPS`: a flipped sign, w * w for w w^T, a wrong einsum
index, ...: "[case: ...; looks like: sign_flipped]"); an error the student's code raises is
explained where its words are known (`_RAISED_HINTS`: a missing keepdims, np.diag on a batch).
If nothing matches: "... differs at index (...) [case: ...]: yours 0.12, expected 0.43 ...; no
known mistake fits."
A whole backward (Grads, or a dict with the same names) runs on four cases: plain, causal, a
padding mask with fully masked rows, and cross-attention with T != S; the verdict names the
planted bug whose gradients all match, or the first wrong gradient the backward reaches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mha import steps
from mha.attention import masks
from mha.modules.numpy_mha import MultiHeadAttention
from mha.training.grad import (  # bound at import: a grader's diagnose.refusing(grad, ...) cannot reach them
    _ORIGIN,
    GRAD_NAMES,
    REFERENCE_STEPS,
    Grads,
    _relation,
    _worst,
    backward,
    check_gradient,
    relative_error,
)
from mha.validate import shape_of
from mha_course import planted
from mha_course.diagnose import Diagnosis, _to_numpy
from mha_course.diagnose import _same as _same_array

_softmax = steps.softmax  # saved at import: the cases stay right while a forward bug is planted

STEPS: dict[str, tuple[int, tuple[str, ...]]] = {
    "linear_backward": (1, ("dx", "dW", "db")),
    "split_heads_backward": (2, ("dx",)),
    "scaled_scores_backward": (3, ("dq", "dk")),
    "apply_mask_backward": (4, ("dscores",)),
    "softmax_backward": (5, ("dscores",)),
    "weighted_sum_backward": (6, ("dweights", "dv")),
    "merge_heads_backward": (7, ("dheads",)),
}
"""Step backwards `check_step_backward` knows: (pipeline step, names of what they return)."""

Case = tuple[str, tuple]  # (what the case is, positional arguments)


# ---- what each step backward is run on ----------------------------------------------------------
def step_cases(name: str, rng: np.random.Generator) -> list[Case]:
    """Named input cases for one step backward, ordinary first, edge cases after."""
    n = rng.normal
    if name == "linear_backward":
        return [("dout (2, 5, 12), x (2, 5, 12), W (12, 12)",
                 (n(size=(2, 5, 12)), n(size=(2, 5, 12)), n(size=(12, 12)) / math.sqrt(12))),
                ("dout (2, 5, 20), x (2, 5, 12), W (12, 20)",
                 (n(size=(2, 5, 20)), n(size=(2, 5, 12)), n(size=(12, 20)) / math.sqrt(12)))]
    if name == "split_heads_backward":
        return [("dsplit (2, 3, 5, 4)", (n(size=(2, 3, 5, 4)),)),
                ("dsplit (1, 2, 4, 3)", (n(size=(1, 2, 4, 3)),))]
    if name == "merge_heads_backward":
        return [("dmerged (2, 5, 12), n_heads=3", (n(size=(2, 5, 12)), 3)),
                ("dmerged (1, 4, 8), n_heads=2", (n(size=(1, 4, 8)), 2))]
    if name == "scaled_scores_backward":
        return [("dscores (2, 3, 5, 5), q (2, 3, 5, 16), k (2, 3, 5, 16)",
                 (n(size=(2, 3, 5, 5)), n(size=(2, 3, 5, 16)), n(size=(2, 3, 5, 16)))),
                ("dscores (2, 3, 5, 7), q (2, 3, 5, 16), k (2, 3, 7, 16): T != S",
                 (n(size=(2, 3, 5, 7)), n(size=(2, 3, 5, 16)), n(size=(2, 3, 7, 16))))]
    if name == "apply_mask_backward":
        return [("dscores (2, 3, 5, 5), causal mask (5, 5)",
                 (n(size=(2, 3, 5, 5)), steps.causal_mask(5))),
                ("dscores (2, 3, 5, 5), padding mask (2, 1, 5, 5) with fully masked rows",
                 (n(size=(2, 3, 5, 5)), masks.padding_mask(np.array([5, 3]), 5)))]
    if name == "softmax_backward":
        causal = np.where(steps.causal_mask(5), n(size=(2, 3, 5, 5)), -np.inf)  # (B, h, T, S)
        dead = causal.copy()
        dead[0, 1, 2, :] = -np.inf  # (batch 0, head 1, query 2): nothing to attend to
        return [("ordinary weights (2, 3, 4, 6)",
                 (n(size=(2, 3, 4, 6)), _softmax(n(size=(2, 3, 4, 6))))),
                ("peaked weights (scores in the tens)",
                 (n(size=(2, 3, 4, 6)), _softmax(10 * n(size=(2, 3, 4, 6))))),
                ("causal weights: exact zeros above the diagonal",
                 (n(size=(2, 3, 5, 5)), _softmax(causal))),
                ("a fully masked row (all its weights 0)", (n(size=(2, 3, 5, 5)), _softmax(dead)))]
    if name == "weighted_sum_backward":
        return [("dheads (2, 3, 5, 4), weights (2, 3, 5, 5), v (2, 3, 5, 4)",
                 (n(size=(2, 3, 5, 4)), _softmax(n(size=(2, 3, 5, 5))), n(size=(2, 3, 5, 4)))),
                ("dheads (2, 3, 5, 4), weights (2, 3, 5, 7), v (2, 3, 7, 4): T != S",
                 (n(size=(2, 3, 5, 4)), _softmax(n(size=(2, 3, 5, 7))), n(size=(2, 3, 7, 4))))]
    raise ValueError(f"unknown step {name!r}; expected one of {sorted(STEPS)}")


_T_NE_S = ("This case has T != S: a product that had the right shape only because T == S "
           "needs a transpose (dk = dscores^T @ q, dv = weights^T @ dheads).")
_CASE_HINTS = {  # what a failure with no matching bug most likely means, where the case says it
    "dscores (2, 3, 5, 7), q (2, 3, 5, 16), k (2, 3, 7, 16): T != S": _T_NE_S,
    "dheads (2, 3, 5, 4), weights (2, 3, 5, 7), v (2, 3, 7, 4): T != S": _T_NE_S,
    "dout (2, 5, 20), x (2, 5, 12), W (12, 20)": "W is (12, 20) here, not square: dx = dout @ W.T "
        "is (..., 12) and dW = x^T @ dout is (12, 20), W's own shape.",
    "a fully masked row (all its weights 0)": "A row with every weight 0 must pass back 0, not "
        "NaN: w * (g - sum(w * g, axis=-1, keepdims=True)) needs no division.",
    "dscores (2, 3, 5, 5), padding mask (2, 1, 5, 5) with fully masked rows": "allowed is "
        "(B, 1, T, S) here: let it broadcast over the heads, e.g. np.where(allowed, dscores, 0).",
}


# ---- running and comparing student code ----------------------------------------------------------
def _outputs(out: Any, n: int) -> tuple[tuple[np.ndarray, ...] | None, str | None]:
    """The student's return value as a tuple of n numpy arrays, or a problem to report."""
    if out is None:
        return None, "returned None: did you forget the `return`?"
    items = tuple(out) if isinstance(out, tuple | list) else (out,)
    if len(items) != n:
        return None, f"returned {len(items)} array(s); it must return {n}"
    return tuple(np.asarray(_to_numpy(a)) for a in items), None


def _same(out: tuple, ref: tuple) -> bool:
    """As many arrays, each with the same shape and values (NaN only where the reference has NaN)."""
    return len(out) == len(ref) and all(_same_array(o, r) for o, r in zip(out, ref, strict=True))


def _call(fn: Callable, args: tuple, n: int):
    """Run fn on copies of args; return (outputs, None) or (None, problem)."""
    copies = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    try:
        with np.errstate(all="ignore"):
            out = fn(*copies)
    except NotImplementedError:
        return None, ("is not written yet (it raises NotImplementedError): replace that line "
                      "with your code")
    except Exception as e:  # a student's code may raise anything: report it, do not crash
        return None, f"raised {type(e).__name__}: {e}"
    return _outputs(out, n)


# ---- evidence for each planted bug, measured on this run ----------------------------------------
def _ratio(out: np.ndarray, ref: np.ndarray) -> float:
    """The factor between two arrays that are (nearly) multiples of each other."""
    return float(np.linalg.norm(out) / np.linalg.norm(ref))


def _row_sums(out: tuple) -> str:
    """'up to 0.42': the largest row sum of dscores (each should be 0)."""
    return f"up to {float(np.abs(out[0].sum(-1)).max()):.3g}"


def _softmax_no_outer_product(out: tuple, ref: tuple, args: tuple) -> str:
    """The rows of dscores do not sum to 0: the -w w^T term is missing."""
    return (f"each row of dscores should sum to 0 (shifting a whole row of scores leaves "
            f"softmax unchanged); yours sum to {_row_sums(out)}. You kept only diag(w) of the "
            f"Jacobian diag(w) - w w^T: return w * (g - sum(w * g, axis=-1, keepdims=True)).")


def _softmax_sum_wrong_axis(out: tuple, ref: tuple, args: tuple) -> str:
    """The rows of dscores do not sum to 0: w . g was summed over the queries."""
    return (f"each row of dscores should sum to 0; yours sum to {_row_sums(out)}. You summed "
            f"w * g over axis -2 (the queries): w . g belongs to one row, so sum over the keys, "
            f"axis=-1.")


def _mask_skipped(out: tuple, ref: tuple, args: tuple) -> str:
    """How many masked positions got a gradient."""
    masked = ~np.broadcast_to(np.asarray(args[1]), out[0].shape)
    return (f"{int((out[0][masked] != 0).sum())} masked position(s) (allowed=False) got a "
            f"gradient. A masked score was replaced by -inf and never reaches the output, so its "
            f"gradient is exactly 0: np.where(allowed, dscores, 0).")


def _mask_inverted(out: tuple, ref: tuple, args: tuple) -> str:
    """How many allowed positions got no gradient."""
    kept = np.broadcast_to(np.asarray(args[1]), out[0].shape)
    return (f"your gradient is 0 at all {int(kept.sum())} allowed positions and passes through "
            f"at the masked ones: the mask's polarity is flipped. allowed is True where a query "
            f"may attend (nn.MultiheadAttention's masks mean the opposite): "
            f"np.where(allowed, dscores, 0).")


def _scores_scale(out: tuple, ref: tuple, args: tuple) -> str:
    """dq and dk off by sqrt(d_k), measured."""
    d_k, r = shape_of(args[1])[-1], _ratio(out[0], ref[0])
    size = f"{r:.4g} times too large" if r > 1 else f"{1 / r:.4g} times too small"
    why = ("the forward divided q k^T by sqrt(d_k), so both gradients carry 1/sqrt(d_k) too"
           if r > 1 else "divide by sqrt(d_k), not by d_k")
    return f"dq and dk are {size}, and sqrt(d_k) = {math.sqrt(d_k):.4g}: {why}."


def _db_mean(out: tuple, ref: tuple, args: tuple) -> str:
    """db too small by B*T, measured."""
    n = int(np.prod(shape_of(args[0])[:-1]))
    return (f"db is {1 / _ratio(out[2], ref[2]):.4g} times too small, and B*T = {n}: b is added "
            f"at each of the {n} positions, so db sums dout over them (not the mean).")


_EVIDENCE: dict[str, str | Callable[[tuple, tuple, tuple], str]] = {
    "softmax_no_outer_product": _softmax_no_outer_product,
    "softmax_sum_wrong_axis": _softmax_sum_wrong_axis,
    "mask_backward_skipped": _mask_skipped,
    "mask_backward_inverted": _mask_inverted,
    "scores_backward_unscaled": _scores_scale,
    "scores_backward_over_d_k": _scores_scale,
    "linear_db_mean": _db_mean,
    "linear_dW_transposed": "dW is the transpose of the right gradient: you computed dout^T @ x, "
        "shape (d_out, d_in). numpy keeps W as (d_in, d_out) and a gradient has its parameter's "
        "shape: dW = x^T @ dout, with x and dout flattened to (B*T, d_in) and (B*T, d_out).",
    "linear_dx_no_transpose": "dx equals dout @ W. W maps d_in to d_out, so the way back "
        "multiplies by its transpose: dx = dout @ W.T (W is square here, so the shape could not "
        "warn you).",
    "scores_backward_dk_no_transpose": "dk equals dscores @ q, which has the right shape only "
        "because T == S here. Key s collects dscores[t, s] * q_t from every query t that scored "
        "it: dk = dscores.swapaxes(-1, -2) @ q / sqrt(d_k).",
    "weighted_sum_dv_no_transpose": "dv equals weights @ dheads, which has the right shape only "
        "because T == S here. Value s collects w[t, s] * dheads_t from every query t: dv = "
        "weights.swapaxes(-1, -2) @ dheads.",
    "split_backward_no_transpose": "right shape, numbers in the wrong places: you reshaped "
        "(B, h, T, d_k) straight to (B, T, d_model). Undo split_heads in reverse order: "
        "swapaxes(1, 2) to (B, T, h, d_k) first, then reshape.",
    "merge_backward_no_transpose": "right shape, numbers in the wrong places: you reshaped "
        "(B, T, d_model) straight to (B, h, T, d_k). Reshape to (B, T, h, d_k) first, then "
        "swapaxes(1, 2).",
}
"""What each planted step bug's output shows: a fixed sentence, or one measured on this run."""


def _evidence(bug_name: str, out: tuple, ref: tuple, args: tuple) -> str:
    """One or two sentences: what the student's output shows, measured, and the likely mistake."""
    said = _EVIDENCE.get(bug_name, planted.BACKWARD_BUGS[bug_name].wrong)
    return said(out, ref, args) if callable(said) else said


# ---- slips that are not planted bugs, and errors students' code raises --------------------------
_RAISED_HINTS: dict[str, tuple[tuple[str, str], ...]] = {  # (words in the error, what they mean)
    "softmax_backward": (
        ("could not be broadcast", "Missing keepdims: sum(w * g, axis=-1) drops the key axis, so "
         "the (B, h, T) row sums cannot meet the (B, h, T, S) gradient. Keep it: sum(axis=-1, "
         "keepdims=True), shape (B, h, T, 1)."),
        ("must be 1- or 2-d", "np.diag builds one (S, S) matrix from one row; for every row at "
         "once write w[..., :, None] * np.eye(S), shape (B, h, T, S, S)."),
        ("mismatch in its core dimension", "J @ dweights reads dweights (B, h, T, S) as a stack of "
         "(T, S) matrices; each row's (S, S) Jacobian must meet that row's gradient alone: "
         "(J @ dweights[..., :, None])[..., 0], or an einsum."),
    ),
}
"""What an error raised by a student's step most likely means, where its words say so."""


def _softmax_slips(dweights: np.ndarray, weights: np.ndarray) -> list[tuple[str, np.ndarray, str]]:
    """Slips in softmax's backward that are not planted bugs: (name, what it gives, the fix)."""
    w, g = weights, dweights
    wg = (w * g).sum(-1, keepdims=True)  # (B, h, T, 1): one w . g per row
    return [
        ("sign_flipped", w * (wg - g),
         "sign flipped: yours is exactly minus the right gradient. The Jacobian is diag(w) - w w^T: "
         "plus w_i on the diagonal, minus w_i w_j everywhere, so dscores = w * (g - w . g)."),
        ("w_times_w", w * g - w * w * g,
         "w * w (elementwise) where the outer product w w^T belongs: that keeps only the diagonal of "
         "J, w_i (1 - w_i), and drops every off-diagonal -w_i w_j. The outer product of each row is "
         "w[..., :, None] * w[..., None, :], shape (B, h, T, S, S)."),
        ("einsum_wrong_axis", np.zeros_like(w),
         "yours is 0 everywhere: the einsum (or sum) paired the upstream gradient with the index it "
         "kept, so it multiplied g by a row sum of J, and every row and column of J sums to 0. Sum "
         "over the index g shares with J and keep the other: einsum('...ij,...i->...j', J, dweights)."),
        ("sum_over_everything", w * (g - (w * g).sum()),
         "w . g summed over the whole array, one number for every row: it belongs to one query "
         "row, sum(w * g, axis=-1, keepdims=True)."),
        ("no_leading_w", g - wg,
         "the factor w in front is missing: dscores_j = w_j (g_j - w . g). Without it a masked key "
         "(w = 0) gets a gradient, and so does a fully masked row."),
    ]


_SLIPS: dict[str, Callable[..., list[tuple[str, np.ndarray, str]]]] = {
    "softmax_backward": _softmax_slips,
}
"""Per step: slips a student makes that `planted` does not hold, each named by what it gives."""


def _matching_slip(name: str, out: tuple, args: tuple, passed: list[tuple]) -> tuple[str, str] | None:
    """(slip, sentence) for a known slip of step `name` that gives the student's output here and
    the reference's on the earlier cases, or None."""
    if name not in _SLIPS:
        return None
    n, ref = len(STEPS[name][1]), _reference(name)
    for slip, value, why in _SLIPS[name](*args):
        if not _same(out, (value,)) or _same((value,), _call(ref, args, n)[0]):
            continue
        earlier = [{s: v for s, v, _ in _SLIPS[name](*a)}[slip] for a in passed]
        if all(_same(_call(ref, a, n)[0], (v,)) for a, v in zip(passed, earlier, strict=True)):
            return slip, why
    return None


def _raised_hint(name: str, problem: str) -> str:
    """The meaning of an error the student's step raised, if its words are known, else ''."""
    return next((hint for words, hint in _RAISED_HINTS.get(name, ()) if words in problem), "")


# ---- checking a step backward -------------------------------------------------------------------
def _reference(name: str) -> Callable:
    """The reference step backward `name` (a field of grad.REFERENCE_STEPS)."""
    return getattr(REFERENCE_STEPS, name)


def _matching_bug(name: str, out: tuple, ref: tuple, args: tuple, passed: list[tuple]) -> str | None:
    """The planted bug of step `name` that gives the student's output here and was right before."""
    n = len(STEPS[name][1])
    for b in planted.BACKWARD_BUGS.values():
        if b.step != name:
            continue
        cand, problem = _call(b.fn, args, n)
        if problem or _same(ref, cand) or not _same(out, cand):
            continue
        earlier = [(_call(b.fn, a, n)[0], _call(_reference(name), a, n)[0]) for a in passed]
        if all(c is not None and _same(c, r) for c, r in earlier):
            return b.name
    return None


def _shape_problem(name: str, out: tuple, ref: tuple) -> str | None:
    """Which output has the wrong shape, and what the shape says, or None."""
    for label, o, r in zip(STEPS[name][1], out, ref, strict=True):
        if o.shape != r.shape:
            hint = (" It is transposed: a gradient has the shape of its parameter, (d_in, d_out) "
                    "for numpy's W: dW = x^T @ dout." if label == "dW" and o.shape == r.shape[::-1]
                    else " A gradient has the shape of what it is the gradient of.")
            return f"should return {label} of shape {r.shape}, got {o.shape}.{hint}"
    return None


def _judge(name: str, fn: Callable, args: tuple, case: str, passed: list[tuple]) -> Diagnosis | None:
    """None if fn agrees with the reference on args, else the Diagnosis of how it differs."""
    number, labels = STEPS[name]
    where = f"{name} (step {number})"
    ref, _ = _call(_reference(name), args, len(labels))
    out, problem = _call(fn, args, len(labels))
    hint = _CASE_HINTS.get(case, "")
    if problem:
        if problem.startswith("returned") and "must return" in problem:
            problem += " (" + ", ".join(labels) + ")"
        hint = " ".join(h for h in (_raised_hint(name, problem), hint) if h)
        return Diagnosis(name, False, f"{where} {problem} [case: {case}]" +
                         (f". {hint}" if hint else ""), number)
    shape = _shape_problem(name, out, ref)
    if shape:
        return Diagnosis(name, False, f"{where} {shape} [case: {case}]", number)
    if _same(out, ref):
        return None
    found = _matching_bug(name, out, ref, args, passed)
    if found:
        return Diagnosis(name, False, f"{where}: {_evidence(found, out, ref, args)} "
                         f"[case: {case}; matches planted bug '{found}']", number, found)
    slip = _matching_slip(name, out, args, passed)
    if slip:
        return Diagnosis(name, False, f"{where}: {slip[1]} [case: {case}; looks like: {slip[0]}]",
                         number)
    label, o, r = next((lab, o, r) for lab, o, r in zip(labels, out, ref, strict=True)
                       if not _same((o,), (r,)))
    what = f"{label} " if len(labels) > 1 else ""
    return Diagnosis(name, False, f"{where}: {what}differs {_worst(o, r)} [case: {case}]; no known "
                     f"mistake fits." + (f" {hint}" if hint else ""), number)


def _step_name(name: str) -> str:
    """Accept 'softmax' as well as 'softmax_backward'."""
    full = name if name.endswith("_backward") else f"{name}_backward"
    if full not in STEPS:
        raise ValueError(f"unknown step {name!r}; expected one of {sorted(STEPS)}")
    return full


def step_backward(name: str, fn: Callable, seed: int = 0, own: bool = False) -> Diagnosis:
    """Run a student's version of `mha.training.grad.<name>` on seeded cases and say what is wrong.

    With `own=True`, the package's own function (or an alias of it) does not count.
    """
    name = _step_name(name)
    number = STEPS[name][0]
    module = getattr(fn, "__module__", "") or ""
    if own and module.split(".")[0] in ("mha", "mha_course"):
        return Diagnosis(name, False, f"{name} is {module}.{getattr(fn, '__name__', name)} from "
                         f"the package: write your own version (the reference is what it is "
                         f"checked against)", number)
    cases = step_cases(name, np.random.default_rng(seed))
    passed: list[tuple] = []
    for case, args in cases:
        verdict = _judge(name, fn, args, case, passed)
        if verdict is not None:
            return verdict
        passed.append(args)
    names = tuple(c for c, _ in cases)
    return Diagnosis(name, True, f"{name} (step {number}) matches the reference on {len(cases)} "
                     f"case(s): " + "; ".join(names), number, cases=names)


def check_step_backward(name: str, fn: Callable, seed: int = 0, own: bool = False) -> str:
    """`step_backward(...).check()`: the success line, or AssertionError naming step and mistake."""
    __tracebackhide__ = True
    return step_backward(name, fn, seed, own).check()


# ---- checking a whole backward ------------------------------------------------------------------
_CHAIN = ("dWo", "dbo", "dWv", "dbv", "dWq", "dbq", "dWk", "dbk", "dx", "dcontext")
"""Gradients in the order the backward reaches them: the first wrong one points at a step."""


def default_module(d_model: int = 8, n_heads: int = 2, seed: int = 0) -> MultiHeadAttention:
    """A small float64 MultiHeadAttention with nonzero biases (zero biases hide bias mistakes)."""
    m = MultiHeadAttention(d_model, n_heads, seed=seed)
    rng = np.random.default_rng(seed + 1)
    m.bq, m.bk, m.bv, m.bo = (rng.normal(0.0, 0.5, d_model) for _ in range(4))
    return m


def backward_cases(module: MultiHeadAttention, seed: int = 0) -> list[tuple[str, dict]]:
    """Named keyword arguments for backward: plain, causal, padding with fully masked rows, cross."""
    rng = np.random.default_rng(seed)
    d = module.d_model

    def arr(*shape):
        return rng.normal(size=shape).astype(module.dtype)

    x, dout = arr(2, 5, d), arr(2, 5, d)
    return [
        ("self-attention, no mask", dict(x=x, dout=dout)),
        ("causal self-attention", dict(x=x, dout=dout, causal=True)),
        ("padding mask, lengths [5, 3]: two fully masked query rows",
         dict(x=x, dout=dout, mask=masks.padding_mask(np.array([5, 3]), 5))),
        ("cross-attention T=5, S=7, key lengths [7, 4]",
         dict(x=x, dout=dout, context=arr(2, 7, d),
              mask=masks.padding_mask(np.array([5, 5]), 5, 7, kv_lengths=np.array([7, 4])))),
    ]


def _as_grads(out: Any) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """The student's Grads or dict as {name: numpy array}, or a problem to report."""
    if out is None:
        return None, "returned None: did you forget the `return`?"
    if isinstance(out, Mapping):
        got = dict(out)
    elif all(hasattr(out, n) for n in GRAD_NAMES[:-1]):
        got = {n: getattr(out, n, None) for n in GRAD_NAMES}
    else:
        return None, (f"returned {type(out).__name__}; return a grad.Grads or a dict with keys "
                      f"{', '.join(GRAD_NAMES[:-1])} (and dcontext for cross-attention)")
    return {k: np.asarray(_to_numpy(v)) for k, v in got.items() if v is not None}, None


def _grads_same(out: dict, ref: Grads) -> bool:
    """Every reference gradient is in `out`, with the same shape and values."""
    return all(n in out and _same((out[n],), (r,)) for n, r in ref.items())


def _run(fn: Callable, module, kw: dict) -> tuple[dict | None, str | None]:
    """Run a backward on one case: ({name: array}, None) or (None, problem)."""
    try:
        with np.errstate(all="ignore"):
            out = fn(module, **kw)
    except NotImplementedError:
        return None, "is not written yet (it raises NotImplementedError)"
    except Exception as e:  # a student's code may raise anything: report it, do not crash
        return None, f"raised {type(e).__name__}: {e}"
    return _as_grads(out)


def _matching_backward_bug(out: dict, ref: Grads, module, kw: dict,
                           passed: list[dict]) -> planted.BackwardBug | None:
    """The planted bug whose gradients all equal the student's here, and the reference's before."""
    for b in planted.BACKWARD_BUGS.values():
        wrong = planted.backward_with(b.name)
        cand, problem = _run(wrong, module, kw)
        if problem or _grads_same(cand, ref) or not all(
                n in cand and _same((out[n],), (cand[n],)) for n, _ in ref.items()):
            continue
        if all(_grads_same(_run(wrong, module, p)[0] or {}, backward(module, **p))
               for p in passed):
            return b
    return None


def _judge_backward(student: Callable, module, case: str, kw: dict,
                    passed: list[dict]) -> Diagnosis | None:
    """None if the student's backward agrees with the reference on this case, else why not."""
    ref = backward(module, **kw)
    out, problem = _run(student, module, kw)
    if problem:
        hint = "" if not (passed and "context" in kw) else (
            f" Your backward ran on the self-attention cases; this one has a context (S = "
            f"{shape_of(kw['context'])[1]} keys, T = {shape_of(kw['x'])[1]} queries): read k and "
            f"v from the context, return dcontext, and look for a product that had the right "
            f"shape only while T == S (dk = dscores^T @ q, dv = weights^T @ dheads).")
        return Diagnosis("backward", False, f"backward {problem} [case: {case}].{hint}")
    missing = [n for n, _ in ref.items() if n not in out]
    if missing:
        return Diagnosis("backward", False, f"backward returned no {', '.join(missing)} [case: "
                         f"{case}]: return every gradient of {', '.join(GRAD_NAMES[:-1])}" +
                         (", and dcontext for cross-attention" if "dcontext" in missing else ""))
    if _grads_same(out, ref):
        return None
    refs = dict(ref.items())
    wrong = [n for n in _CHAIN if n in refs and not _same((out[n],), (refs[n],))]
    right = [n for n in _CHAIN if n in refs and n not in wrong]
    first = wrong[0]  # the first wrong one the backward reaches: its steps are the suspects
    if out[first].shape != refs[first].shape:
        try:
            check_gradient(first, out[first], refs[first])
        except AssertionError as e:
            return Diagnosis("backward", False, f"backward [case: {case}]: {e}")
    summary = (f"backward differs from the reference [case: {case}]: wrong {', '.join(wrong)}; "
               f"right {', '.join(right) or 'none'}. The first wrong one the backward reaches is "
               f"{first} (relative error {relative_error(out[first], refs[first]):.3g})")
    b = _matching_backward_bug(out, ref, module, kw, passed)
    if b:
        where = "the whole pass" if b.step == "backward" else b.step
        return Diagnosis("backward", False, f"{summary}. Every gradient equals a backward with a "
                         f"planted mistake in {where} (step {b.number}): {b.wrong} [matches "
                         f"planted bug '{b.name}']", b.number, b.name)
    why = _relation(out[first].astype(np.float64), refs[first], module.d_k)
    return Diagnosis("backward", False, f"{summary}, {_worst(out[first], refs[first])}; no known "
                     f"mistake fits." + (f" The numbers say: {why}." if why else "") +
                     f" {first} comes from {_ORIGIN[first]}: check those steps with "
                     f"diagnose_backward.check_step_backward.")


def backward_diagnosis(student: Callable, module: MultiHeadAttention | None = None,
                       seed: int = 0) -> Diagnosis:
    """Compare a whole backward (backward's signature) with the reference; name the bug it matches."""
    module = default_module() if module is None else module
    cases = backward_cases(module, seed)
    passed: list[dict] = []
    for case, kw in cases:
        verdict = _judge_backward(student, module, case, kw, passed)
        if verdict is not None:
            return verdict
        passed.append(kw)
    names = tuple(c for c, _ in cases)
    return Diagnosis("backward", True, f"backward matches the reference on {len(cases)} cases: "
                     + "; ".join(names), cases=names)


def check_backward(student: Callable, module: MultiHeadAttention | None = None,
                   seed: int = 0) -> str:
    """`backward_diagnosis(...).check()`: the success line, or AssertionError saying what is wrong."""
    __tracebackhide__ = True
    return backward_diagnosis(student, module, seed).check()
