"""Say what is wrong with a student's step or forward pass, in words a student understands.

    diagnose.check_step("softmax", my_softmax)      # the success line, or AssertionError(why)
    diagnose.step("softmax", my_softmax)            # the same as a Diagnosis object
    diagnose.check_forward(my_forward, module)      # whole forward pass, x -> (B, T, d_model)
    diagnose.pipeline({"split_heads": f, ...}, module)  # the first step whose output differs

How it decides: the student's code and the reference (`mha.steps`) run on the same seeded
inputs, case by case (ordinary inputs first, then the edge cases a step must survive).
At the first case where they differ, every planted bug of that step (`mha_course.planted`) runs
on the same inputs too; if the student's output matches one of them, that bug is named,
with the evidence measured on this run ("rows sum to 0.84, not 1"). If none matches,
the message says where the student's output first differs from the reference and by how
much, and names no cause: a wrong name would send a student the wrong way.
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha import steps as ref_steps
from mha.validate import shape_of
from mha_course import integrity, planted

Case = tuple[str, tuple]  # (what the case is, positional arguments)


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on one piece of student code: correct or not, where, and the likely bug."""

    target: str  # what was checked: a step name or "forward"
    ok: bool
    message: str
    step: int | None = None  # the pipeline step (1-7) where it first differs
    bug: str | None = None  # the planted bug the output matches, if any
    cases: tuple[str, ...] = field(default=())  # the cases that were run

    def __str__(self) -> str:
        return self.message

    def check(self) -> str:
        """Return the message if correct; raise AssertionError(message) if not."""
        __tracebackhide__ = True  # IPython and pytest show the student's line, not ours
        if not self.ok:
            raise AssertionError(self.message)
        return self.message


# ---- comparing outputs ------------------------------------------------------------------------
def run_student(fn: Callable, *args) -> tuple[Any, str | None]:
    """(fn's value, None), or (None, what went wrong) if a student's function raised."""
    try:
        with np.errstate(all="ignore"):
            return fn(*args), None
    except NotImplementedError:
        return None, "is not written yet (it raises NotImplementedError): replace that line with your code"
    except Exception as e:  # a student's code may raise anything: report it, do not crash
        return None, f"raised {type(e).__name__}: {e}"


def _to_numpy(a: Any) -> Any:
    """A torch tensor becomes a numpy array (float16 and bfloat16 as float32); else unchanged."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        t = a.detach().cpu()
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()  # numpy has no bfloat16
        return t.numpy()
    return a


def _tolerance(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Allowed difference: tight when both are float64, looser when either is float32."""
    if out.dtype == np.float64 and ref.dtype == np.float64:
        return {"rtol": 1e-6, "atol": 1e-9}
    return {"rtol": 1e-4, "atol": 1e-5}


def _same(out: np.ndarray, ref: np.ndarray) -> bool:
    """Same shape and values: booleans exactly, floats within tolerance, NaN only where NaN."""
    if out.shape != ref.shape:
        return False
    if ref.dtype == np.bool_ or out.dtype == np.bool_:
        return bool(np.array_equal(out, ref))
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.allclose(out, ref, equal_nan=True, **_tolerance(out, ref)))


def _same_after_softmax(out: np.ndarray, ref: np.ndarray) -> bool:
    """For masked scores: any fill that softmax turns into exact zeros (-inf, -1e9) is fine."""
    if out.shape != ref.shape:
        return False
    live = np.isfinite(ref).any(axis=-1)  # rows with at least one allowed key
    with np.errstate(invalid="ignore", over="ignore"):
        a, b = ref_steps.softmax(out.astype(np.float64)), ref_steps.softmax(ref)
    return bool(np.allclose(a[live], b[live], rtol=1e-6, atol=1e-9))


def _fmt(v: float) -> str:
    """A plain number for messages (never np.float64(...))."""
    return f"{float(v):.4g}"


def _where_differs(out: np.ndarray, ref: np.ndarray) -> str:
    """'max |yours - expected| = 0.31 at index (0, 1, 2, 3): yours 0.12, expected 0.43'."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    bad = np.isnan(out) & ~np.isnan(ref)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{int(bad.sum())} value(s) are NaN, first at index {idx} "
                f"(expected {_fmt(ref[idx])})")
    diff = np.where(np.isnan(diff), np.inf, diff)
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    return (f"max |yours - expected| = {_fmt(diff[idx])} at index {idx}: "
            f"yours {_fmt(out[idx])}, expected {_fmt(ref[idx])}")


# ---- evidence for each planted bug, measured on this run --------------------------------------
def _row_sums(w: np.ndarray) -> str:
    s = np.nansum(w, axis=-1)
    lo, hi = float(s.min()), float(s.max())
    return f"{lo:.2f}" if math.isclose(lo, hi, abs_tol=5e-3) else f"between {lo:.2f} and {hi:.2f}"


def _ratio(out: np.ndarray, ref: np.ndarray) -> float:
    """The factor between two arrays that are (nearly) multiples of each other."""
    return float(np.linalg.norm(out) / np.linalg.norm(ref))


def _evidence(bug: str, out: np.ndarray, ref: np.ndarray, args: tuple) -> str:
    """One or two sentences: what the student's output shows, and the likely mistake."""
    shape = shape_of(ref)
    if bug == "weights_transposed":
        return (f"right shape {shape}, but the values equal x @ W.T + b. numpy keeps W as "
                f"(d_in, d_out): compute x @ W + b. Did you use W as (out, in), the way "
                f"nn.Linear stores its weight?")
    if bug == "split_no_transpose":
        return (f"right shape {shape}, wrong values after splitting: head 0 of token 1 holds "
                f"the second d_k-slice of token 0. Did you reshape (B, T, d_model) straight to "
                f"(B, h, T, d_k)? Reshape to (B, T, h, d_k) first, then transpose(0, 2, 1, 3).")
    if bug == "merge_no_transpose":
        return (f"right shape {shape}, wrong values after merging: did you reshape "
                f"(B, h, T, d_k) without transposing back first? transpose(0, 2, 1, 3) to "
                f"(B, T, h, d_k), then reshape to (B, T, d_model).")
    if bug in ("unscaled_scores", "scores_over_d_k"):
        d_k = shape_of(args[0])[-1] if len(args) == 2 else None
        r = _ratio(out, ref)
        root = f"sqrt(d_k) = {math.sqrt(d_k):.3g}" if d_k else "sqrt(d_k)"
        if bug == "unscaled_scores":
            return (f"your scores are {r:.3g} times too large, and {root}: did you forget to "
                    f"divide q k^T by sqrt(d_k)?")
        return (f"your scores are {1 / r:.3g} times too small, and {root}: did you divide by "
                f"d_k instead of sqrt(d_k)?")
    if bug == "anti_causal_mask":
        return (f"query 0 may attend to {int(np.asarray(out)[0].sum())} keys and the last query "
                f"only to itself: the mask is the wrong triangle. Query t may see keys s <= t "
                f"(np.tril), not s >= t (np.triu).")
    if bug == "mask_without_diagonal":
        return ("the diagonal is False, so no query may attend to its own token and query 0 "
                "has no key at all (off by one). Allow s <= t, not s < t: np.tril(..., k=0).")
    if bug == "mask_one_ahead":
        return ("query t may also see key t + 1, one token in the future (off by one). Allow "
                "s <= t only: np.tril(..., k=0).")
    if bug == "mask_after_softmax":
        return (f"rows sum to {_row_sums(out)}, not 1: did you zero the weights after softmax "
                f"instead of masking the scores with -inf before it?")
    if bug == "softmax_no_max":
        big = float(np.nanmax(np.where(np.isfinite(args[0]), args[0], -np.inf)))
        return (f"NaN or inf on scores as large as {big:.0f}: exp overflowed. Subtract each "
                f"row's max before exp (it cancels in the ratio, and keeps exp <= 1).")
    if bug == "softmax_wrong_axis":
        return (f"every column sums to 1 but rows sum to {_row_sums(out)}: you normalised over "
                f"axis -2 (the queries). Each query's weights over the keys must sum to 1: "
                f"softmax over axis=-1.")
    return planted.BUGS[bug]


# ---- what each step is run on -----------------------------------------------------------------
def _causal_scores(rng: np.random.Generator, T: int) -> np.ndarray:
    s = rng.normal(size=(2, 3, T, T))  # (B, h, T, S)
    return np.where(ref_steps.causal_mask(T), s, -np.inf)


def _fully_masked_row(rng: np.random.Generator) -> np.ndarray:
    s = _causal_scores(rng, 5)
    s[0, 1, 2, :] = -np.inf  # (batch 0, head 1, query 2): nothing to attend to
    return s


def _cases(name: str, rng: np.random.Generator) -> list[Case]:
    """Named input cases for one step, ordinary first, edge cases after."""
    n = rng.normal
    if name == "linear":
        return [("x (2, 5, 12), W (12, 12), b (12,)",
                 (n(size=(2, 5, 12)), n(size=(12, 12)) / math.sqrt(12), n(size=12))),
                ("x (2, 5, 12), W (12, 20), b (20,)",
                 (n(size=(2, 5, 12)), n(size=(12, 20)) / math.sqrt(12), n(size=20)))]
    if name == "split_heads":
        return [("x (2, 5, 12), n_heads=3", (n(size=(2, 5, 12)), 3)),
                ("x (1, 4, 8), n_heads=2", (n(size=(1, 4, 8)), 2))]
    if name == "merge_heads":
        return [("x (2, 3, 5, 4)", (n(size=(2, 3, 5, 4)),)),
                ("x (1, 2, 4, 3)", (n(size=(1, 2, 4, 3)),))]
    if name == "scaled_scores":
        return [("q (2, 3, 5, 16), k (2, 3, 7, 16)", (n(size=(2, 3, 5, 16)), n(size=(2, 3, 7, 16)))),
                ("q (1, 2, 4, 4), k (1, 2, 4, 4)", (n(size=(1, 2, 4, 4)), n(size=(1, 2, 4, 4))))]
    if name == "causal_mask":
        return [("T=5", (5,)), ("T=1", (1,))]
    if name == "apply_mask":
        return [("scores (2, 3, 5, 5), causal mask (5, 5)",
                 (n(size=(2, 3, 5, 5)), ref_steps.causal_mask(5)))]
    if name == "masked_softmax":
        return [("scores (2, 3, 5, 5), causal mask (5, 5)",
                 (n(size=(2, 3, 5, 5)), ref_steps.causal_mask(5)))]
    if name == "softmax":
        return [("ordinary scores (2, 3, 4, 6)", (n(size=(2, 3, 4, 6)),)),
                ("large scores, in the hundreds", (400.0 * n(size=(2, 3, 4, 6)),)),
                ("causal scores with -inf above the diagonal", (_causal_scores(rng, 5),)),
                ("a fully masked row (every score -inf)", (_fully_masked_row(rng),))]
    if name == "weighted_sum":
        return [("weights (2, 3, 5, 7), v (2, 3, 7, 4)",
                 (ref_steps.softmax(n(size=(2, 3, 5, 7))), n(size=(2, 3, 7, 4))))]
    raise ValueError(f"unknown step {name!r}; expected one of {sorted(STEPS)}")


_REAL = {name: getattr(ref_steps, name) for name in (
    "linear", "split_heads", "scaled_scores", "causal_mask", "apply_mask", "softmax",
    "weighted_sum", "merge_heads")}
"""The real steps, saved at import: references stay right even while a bug is planted."""


def _real_masked_softmax(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """steps.masked_softmax through the saved steps (it looks its parts up at call time)."""
    return _REAL["softmax"](_REAL["apply_mask"](scores, allowed))


_REAL["masked_softmax"] = _real_masked_softmax

STEPS: dict[str, int] = {
    "linear": 1, "split_heads": 2, "scaled_scores": 3, "causal_mask": 4, "apply_mask": 4,
    "masked_softmax": 4, "softmax": 5, "weighted_sum": 6, "merge_heads": 7,
}
"""Step functions `diagnose.step` knows, with their pipeline step number."""

# What a case that fails with no matching bug most likely means (only where the case says it).
_CASE_HINTS = {
    "large scores, in the hundreds": "exp overflows past about 709 in float64: subtract each "
                                      "row's max before exp.",
    "a fully masked row (every score -inf)": "A row with nothing to attend to must come out as "
        "zeros, not NaN: where the row max is -inf use 0 instead, and divide only where the "
        "row sum is > 0 (06_softmax.ipynb).",
    "x (2, 5, 12), W (12, 20), b (20,)": "W is (d_in, d_out) here, not square: compute x @ W + b.",
}


def _shape_hint(name: str, got: tuple[int, ...], want: tuple[int, ...], args: tuple) -> str:
    """A likely cause for a wrong shape, only where the shape itself says so."""
    if name == "split_heads" and len(got) == 4 and (got[0], got[2], got[1], got[3]) == want:
        return " You reshaped to (B, T, h, d_k) but did not transpose: transpose(0, 2, 1, 3)."
    if name == "scaled_scores" and got == shape_of(args[0])[:2] + (shape_of(args[0])[-1],) * 2:
        return " You multiplied over the tokens (q^T k); scores need q @ k.swapaxes(-1, -2)."
    return ""


# ---- running student code ---------------------------------------------------------------------
def _call(fn: Callable, args: tuple) -> tuple[np.ndarray | None, str | None]:
    """Run the student's function on copies of args; return (output, None) or (None, problem)."""
    copies = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    try:
        with np.errstate(all="ignore"):
            out = fn(*copies)
    except NotImplementedError:
        return None, "is not written yet (it raises NotImplementedError): replace that line " \
                     "with your code"
    except Exception as e:  # a student's code may raise anything; report it, do not crash
        return None, f"raised {type(e).__name__}: {e}"
    if out is None:
        return None, "returned None: did you forget the `return`?"
    if isinstance(out, tuple):
        return None, f"returned a tuple of {len(out)} items; return one array"
    out = np.asarray(_to_numpy(out))
    return out, None


def _matching_bug(name: str, out: np.ndarray, ref: np.ndarray, args: tuple,
                  passed: list[tuple]) -> str | None:
    """The planted bug of step `name` that explains the student's output on every case so far.

    It must give the student's output on `args`, and the reference's on every earlier case
    (`passed`), where the student's code was right: a bug that would already have failed
    there is not the student's bug, however alike the outputs look now.
    """
    for bug in planted.CATALOGUE.values():
        if bug.step != name:
            continue
        with np.errstate(all="ignore"):
            cand = np.asarray(bug.fn(*args))
            if _same(ref, cand) or not _same(out, cand):
                continue
            if all(_same(np.asarray(bug.fn(*a)), np.asarray(_REAL[name](*a)))
                   for a in passed):
                return bug.name
    return None


def _compare(name: str, out: np.ndarray, ref: np.ndarray) -> bool:
    return _same_after_softmax(out, ref) if name == "apply_mask" else _same(out, ref)


def _judge(name: str, label: str, fn: Callable, args: tuple, case: str,
           passed: list[tuple]) -> Diagnosis | None:
    """None if fn agrees with the reference on args, else the Diagnosis of how it differs.

    `passed` holds the arguments of the earlier cases of this step, which fn got right.
    """
    number = STEPS[name]
    where = f"{label} (step {number})"
    with np.errstate(all="ignore"):
        ref = np.asarray(_REAL[name](*args))
    out, problem = _call(fn, args)
    if problem:
        return Diagnosis(label, False, f"{where} {problem} [case: {case}]", number)
    if name == "causal_mask" and out.dtype != np.bool_:
        return Diagnosis(label, False, f"{where} returned dtype {out.dtype}; return a boolean "
                         f"array (True = may attend), e.g. np.tril(np.ones((T, T), dtype=bool)) "
                         f"[case: {case}]", number)
    if out.shape != ref.shape:
        hint = _shape_hint(name, shape_of(out), shape_of(ref), args)
        return Diagnosis(label, False, f"{where} should return shape {shape_of(ref)}, got "
                         f"{shape_of(out)} [case: {case}].{hint}", number)
    if _compare(name, out, ref):
        return None
    bug = _matching_bug(name, out, ref, args, passed)
    if bug:
        return Diagnosis(label, False, f"{where}: {_evidence(bug, out, ref, args)} "
                         f"[case: {case}; matches planted bug '{bug}']", number, bug)
    hint = _CASE_HINTS.get(case, "")
    return Diagnosis(label, False, f"{label} differs from the reference at step {number} "
                     f"[case: {case}]: {_where_differs(out, ref)}." + (f" {hint}" if hint else ""),
                     number)


def _not_own(name: str, fn: Callable) -> Diagnosis | None:
    """A Diagnosis if fn is the package's own code rather than the student's."""
    module = getattr(fn, "__module__", "") or ""
    if module.split(".")[0] in ("mha", "mha_course"):
        return Diagnosis(name, False, f"{name} is {module}.{getattr(fn, '__name__', name)} from "
                         f"the package: write your own version (the reference is what it is "
                         f"checked against)", STEPS[name])
    return None


def _check_name(name: str) -> None:
    if name not in STEPS:
        raise ValueError(f"unknown step {name!r}; expected one of {sorted(STEPS)}")


def step(name: str, fn: Callable, seed: int = 0, own: bool = False) -> Diagnosis:
    """Run a student's version of `mha.steps.<name>` on seeded cases and say what is wrong.

    With `own=True`, the package's own function (or an alias of it) does not count.
    """
    _check_name(name)
    if own and (mine := _not_own(name, fn)):
        return mine
    cases = _cases(name, np.random.default_rng(seed))
    passed: list[tuple] = []
    for case, args in cases:
        verdict = _judge(name, name, fn, args, case, passed)
        if verdict is not None:
            return verdict
        passed.append(args)
    names = tuple(c for c, _ in cases)
    return Diagnosis(name, True, f"{name} (step {STEPS[name]}) matches the reference on "
                     f"{len(cases)} case(s): " + "; ".join(names), STEPS[name], cases=names)


def check_step(name: str, fn: Callable, seed: int = 0, own: bool = False) -> str:
    """`step(name, fn).check()`: the success line, or AssertionError saying what is wrong."""
    __tracebackhide__ = True
    return step(name, fn, seed, own).check()


def compare(name: str, fn: Callable, *args) -> Diagnosis:
    """Judge a student's step on arguments of your choice (e.g. other shapes) against mha.steps."""
    _check_name(name)
    case = ", ".join(f"{type(a).__name__} {shape_of(a)}" if hasattr(a, "shape") else repr(a)
                     for a in args)
    verdict = _judge(name, name, fn, args, case, [])
    return verdict or Diagnosis(name, True, f"{name} (step {STEPS[name]}) matches the "
                                f"reference on {case}", STEPS[name], cases=(case,))


def reference_steps(namespace: dict, names=tuple(STEPS)) -> Iterator[list[str]]:
    """Within the block, names in `namespace` that are steps are the reference steps.

    Graders use it to judge a student's forward on its own: a mistake in an earlier part
    (say split_heads) then costs points only in that part. A step the forward needs that is
    missing (its cell failed to run, or it was renamed) is put in too, and a note says so.
    Yields the names it replaced or added.
    """
    return swapped_in(namespace, {n: _REAL[n] for n in names}, needed=_FORWARD_NEEDS)


_FORWARD_NEEDS = ("split_heads", "merge_heads", "scaled_scores", "causal_mask", "softmax")
"""The steps a student's forward (A1) calls by name: put in when missing."""


def _students_functions(namespace: dict) -> list[types.FunctionType]:
    """The plain functions in `namespace` that are not the package's or a library's."""
    return [v for v in namespace.values() if isinstance(v, types.FunctionType)
            and not integrity.is_library_code(v.__code__)]


def _rebound(namespace: dict, old: dict[int, Any], refs: dict[int, Callable]) -> list[Callable[[], None]]:
    """Point the student's aliases, default arguments and closure cells that hold one of `old`
    (by id) at its reference; return the undo steps."""
    undo: list[Callable[[], None]] = []
    for name, value in list(namespace.items()):
        if id(value) in old and value is old[id(value)]:
            undo.append(lambda name=name, value=value: namespace.__setitem__(name, value))
            namespace[name] = refs[id(value)]
    for fn in _students_functions(namespace):
        if fn.__defaults__ and any(id(d) in old for d in fn.__defaults__):
            undo.append(lambda fn=fn, d=fn.__defaults__: setattr(fn, "__defaults__", d))
            fn.__defaults__ = tuple(refs.get(id(d), d) for d in fn.__defaults__)
        if fn.__kwdefaults__ and any(id(d) in old for d in fn.__kwdefaults__.values()):
            undo.append(lambda fn=fn, d=fn.__kwdefaults__: setattr(fn, "__kwdefaults__", d))
            fn.__kwdefaults__ = {k: refs.get(id(d), d) for k, d in fn.__kwdefaults__.items()}
        for cell in fn.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if id(held) in old and held is old[id(held)]:
                undo.append(lambda cell=cell, held=held: setattr(cell, "cell_contents", held))
                cell.cell_contents = refs[id(held)]
    return undo


@contextmanager
def swapped_in(namespace: dict, refs: Mapping[str, Callable],
               needed: tuple[str, ...] = ()) -> Iterator[list[str]]:
    """Names in `namespace` (and missing ones from `needed`) set to `refs` within the block:
    `reference_steps` for any parts (A5's backward uses it).

    The student's other handles on a replaced function follow it: an alias (`update =
    online_update`), a default argument (`fold=online_update`) or a closure's cell, so a later
    part that reaches an earlier one any of those ways is judged with the reference too.
    """
    present = [n for n in refs if n in namespace]
    missing = [n for n in needed if n in refs and n not in namespace]
    for n in missing:
        print(f"note: {n} is not defined (did its cell fail to run, or was it renamed?): this "
              f"part runs with the reference {n} in its place, so only {n}'s own part loses "
              f"points")
    old = {id(namespace[n]): namespace[n] for n in present if callable(namespace[n])}
    by_id = {id(namespace[n]): refs[n] for n in present if callable(namespace[n])}
    saved = {n: namespace[n] for n in present}
    undo: list[Callable[[], None]] = []
    try:
        undo = _rebound(namespace, old, by_id)
        namespace.update({n: refs[n] for n in present + missing})
        yield present + missing
    finally:
        for step in reversed(undo):
            step()
        for n in missing:
            namespace.pop(n, None)
        namespace.update(saved)


def as_bool(value: Any, what: str) -> bool:
    """A check's verdict as a Python bool: True, False, np.True_, np.False_ or a 0-d bool array.

    Anything else (a number, an array of several values, None) raises AssertionError saying
    what came back, so a check that returns np.True_ is judged by its value, not its type.
    """
    __tracebackhide__ = True
    arr = np.asarray(value) if value is not None else None
    if arr is None or arr.dtype != np.bool_ or arr.shape != ():
        got = "None" if value is None else f"{value!r} ({type(value).__name__})"
        raise AssertionError(f"{what} should return True or False, got {got}")
    return bool(arr)


def module_with_biases(d_model: int, n_heads: int, seed: int = 0):
    """MultiHeadAttention(d_model, n_heads, seed) with small non-zero biases (its own are zero),
    so a forward or decode that drops a bias gives a different output."""
    from mha.modules.numpy_mha import MultiHeadAttention

    m = MultiHeadAttention(d_model, n_heads, seed=seed)
    rng = np.random.default_rng(1000 + seed)
    m.bq, m.bk, m.bv, m.bo = (0.1 * rng.normal(size=d_model) for _ in range(4))
    return m


@contextmanager
def refusing(owner: Any, names: tuple[str, ...]) -> Iterator[None]:
    """Within the block, calling `owner.<name>` raises AssertionError naming it.

    Graders wrap a student's call in it, so a part that leans on the package's own solution
    (say `MultiHeadAttention.from_numpy` in a weight-transfer exercise) fails with a reason.
    """
    # Patch each name where it is defined: on a class, that may be a base class (a mixin).
    holders = {n: next((c for c in getattr(owner, "__mro__", (owner,)) if n in vars(c)), owner)
               for n in names}
    saved = {n: vars(holders[n])[n] for n in names}

    def refuse(name: str) -> Callable:
        @integrity.not_a_reference  # the refusal says which reference it stands for
        def refused(*args, **kwargs):
            where = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', '')}" \
                if inspect.isclass(owner) else getattr(owner, "__name__", "")
            raise AssertionError(f"your code called the reference's {name}: write this part "
                                 f"yourself (the reference is what it is compared with) "
                                 f"[reference used: {where}.{name}]")
        return refused

    try:
        for n in names:
            setattr(holders[n], n, refuse(n))
        yield
    finally:
        for n, fn in saved.items():
            setattr(holders[n], n, fn)


# ---- the whole pipeline -----------------------------------------------------------------------
def trace_values(module, x: np.ndarray, causal: bool = True) -> list[tuple[str, str, tuple, np.ndarray]]:
    """Every step call of the reference forward as (step name, label, args, output), in order."""
    h = module.n_heads
    T = x.shape[1]
    rows: list[tuple[str, str, tuple, np.ndarray]] = []

    def run(name: str, label: str, *args):
        out = _REAL[name](*args)
        rows.append((name, label, args, out))
        return out

    q = run("linear", "linear (q = x Wq + bq)", x, module.Wq, module.bq)  # (B, T, d_model)
    k = run("linear", "linear (k = x Wk + bk)", x, module.Wk, module.bk)
    v = run("linear", "linear (v = x Wv + bv)", x, module.Wv, module.bv)
    qh = run("split_heads", "split_heads (q)", q, h)  # (B, h, T, d_k)
    kh = run("split_heads", "split_heads (k)", k, h)
    vh = run("split_heads", "split_heads (v)", v, h)
    scores = run("scaled_scores", "scaled_scores", qh, kh)  # (B, h, T, S)
    if causal:
        allowed = run("causal_mask", "causal_mask", T)  # (T, S)
        run("masked_softmax", "masked_softmax", scores, allowed)
        scores = run("apply_mask", "apply_mask", scores, allowed)  # (B, h, T, S)
    weights = run("softmax", "softmax", scores)  # (B, h, T, S)
    heads = run("weighted_sum", "weighted_sum", weights, vh)  # (B, h, T, d_k)
    merged = run("merge_heads", "merge_heads", heads)  # (B, T, d_model)
    run("linear", "linear (out = merged Wo + bo)", merged, module.Wo, module.bo)
    return rows


_BY_HAND = (  # (name in a by-hand pipeline, trace label it must equal, pipeline steps behind it)
    ("q", "split_heads (q)", "1-2"), ("k", "split_heads (k)", "1-2"),
    ("v", "split_heads (v)", "1-2"), ("scores", "apply_mask", "3-4"),
    ("weights", "softmax", "5"), ("heads", "weighted_sum", "6"),
    ("merged", "merge_heads", "7"), ("out", "linear (out = merged Wo + bo)", "7"),
)


def check_by_hand(yours: Mapping[str, np.ndarray], module, x: np.ndarray,
                  causal: bool = True) -> str:
    """Compare a by-hand pipeline's tensors with the module's, in order; name the first that differs.

    `yours` maps names from q, k, v (split into heads), scores (masked), weights, heads,
    merged, out to your arrays; names you leave out are skipped.
    """
    __tracebackhide__ = True
    ref = {label: out for _, label, _, out in trace_values(module, x, causal)}
    if not causal:
        ref["apply_mask"] = ref["scaled_scores"]
    checked = []
    for name, label, number in _BY_HAND:
        if name not in yours:
            continue
        got, want = np.asarray(yours[name]), ref[label]
        if got.shape != want.shape:
            raise AssertionError(f"{name} (step {number}) should have shape {shape_of(want)}, "
                                 f"got {shape_of(got)}: the first tensor that differs")
        if not _same(got, want):
            raise AssertionError(f"{name} (step {number}) is the first tensor that differs from "
                                 f"the module's: {_where_differs(got, want)}. Steps before it "
                                 f"are right; look at step {number}.")
        checked.append(name)
    return f"by hand == module at every step ({', '.join(checked)})"


def _inputs(module, seed: int) -> list[tuple[str, np.ndarray]]:
    """Seeded inputs for a whole forward pass: ordinary, then large enough to overflow exp."""
    x = np.random.default_rng(seed).normal(size=(2, 5, module.d_model)).astype(module.dtype)
    return [("x (2, 5, d_model), unit normal", x),
            ("x * 400 (scores far past exp's range)", x * 400)]


def pipeline(fns: Mapping[str, Callable], module, causal: bool = True, seed: int = 0) -> Diagnosis:
    """Feed each student step the reference's input for it; report the first step that differs.

    `fns` maps step names (`split_heads`, `softmax`, ...) to the student's functions. Every
    step gets the reference's input, so one wrong step cannot hide or cause another.
    """
    unknown = sorted(set(fns) - set(STEPS))
    if unknown:  # one message for all of them
        raise ValueError(f"unknown step(s) {unknown}; expected names from {sorted(STEPS)}")
    passed: dict[str, list[tuple]] = {name: [] for name in fns}
    for case, x in _inputs(module, seed):
        for name, label, args, _ in trace_values(module, x, causal):
            if name in fns:
                verdict = _judge(name, label, fns[name], args, case, passed[name])
                if verdict is not None:
                    return verdict
                passed[name].append(args)
    return Diagnosis("pipeline", True, "every step you gave (" + ", ".join(sorted(fns)) +
                     ") matches the reference on the module's own inputs")


def _as_forward(student) -> Callable[[np.ndarray], Any]:
    """Wrap an nn.Module so it takes numpy input in its own dtype; callables pass through."""
    params = getattr(student, "parameters", None)
    if params is None or not callable(params):
        return student
    import torch  # only when a torch module was passed

    p = next(iter(student.parameters()))
    return lambda x: student(torch.from_numpy(x).to(dtype=p.dtype, device=p.device))


def _without_biases(module):
    """A copy of the module with every bias zero: what a forward that drops them computes."""
    import copy

    bare = copy.copy(module)
    bare.bq, bare.bk, bare.bv, bare.bo = (np.zeros_like(b) for b in
                                          (module.bq, module.bk, module.bv, module.bo))
    return bare


def forward(student, module, causal: bool = True, steps: Mapping[str, Callable] | None = None,
            seed: int = 0) -> Diagnosis:
    """Compare `student(x)` with `module(x, causal=causal)`; name the planted bug it matches.

    `student` maps x (B, T, d_model) to (B, T, d_model): a function or a torch module (fed a
    tensor of its own dtype). With `steps` (the student's step functions), a mismatch that
    no planted bug explains is traced to the first step that differs.
    """
    run = _as_forward(student)
    passed: list[tuple[np.ndarray, np.ndarray]] = []  # (x, reference output) where it was right
    for case, x in _inputs(module, seed):
        with np.errstate(all="ignore"):
            ref = module(x, causal=causal)
        out, problem = _call(run, (x,))
        if problem:
            return Diagnosis("forward", False, f"forward {problem} [case: {case}]")
        if out.shape != ref.shape:
            return Diagnosis("forward", False, f"forward should return shape {shape_of(ref)} "
                             f"(B, T, d_model), got {shape_of(out)} [case: {case}]")
        if _same(out, ref):
            passed.append((x, ref))
            continue
        for bug in planted.CATALOGUE.values():
            with planted.bug(bug.name), np.errstate(all="ignore"):
                cand = module(x, causal=causal)
                fits = not _same(ref, cand) and _same(out, cand) and all(
                    _same(module(a, causal=causal), r) for a, r in passed)
            if fits:
                name, _, args, _ = next(r for r in trace_values(module, x, causal)
                                        if r[0] == bug.step)
                with np.errstate(all="ignore"):
                    bad = np.asarray(bug.fn(*args))
                    good = np.asarray(_REAL[name](*args))
                why = _evidence(bug.name, bad, good, args)
                return Diagnosis("forward", False, f"forward differs from the reference, and "
                                 f"exactly like a module with a bug at step {bug.number} "
                                 f"({bug.step}): {why} [case: {case}; matches planted bug "
                                 f"'{bug.name}']", bug.number, bug.name)
        if _same(out, _without_biases(module)(x, causal=causal)) and any(
                np.any(b != 0) for b in (module.bq, module.bk, module.bv, module.bo)):
            return Diagnosis("forward", False, "forward equals the module's output with every "
                             "bias left out: a projection is x @ W + b; add module.bq, bk, bv "
                             f"and bo [case: {case}]", 1)
        with np.errstate(all="ignore"):
            other = module(x, causal=not causal)
        if _same(out, other):
            said = "ignores causal=True: it gives the unmasked output. Apply the causal mask " \
                "(-inf above the diagonal) to the scores before softmax" if causal else \
                "masks although causal=False: apply the causal mask only when asked"
            return Diagnosis("forward", False, f"forward {said} [case: {case}]", 4)
        where = f"forward differs from the reference [case: {case}]: {_where_differs(out, ref)}."
        if steps:
            found = pipeline(steps, module, causal, seed)
            if not found.ok:
                return Diagnosis("forward", False, f"forward differs from the reference; the "
                                 f"first of your steps that differs: {found.message}",
                                 found.step, found.bug)
            return Diagnosis("forward", False, f"{where} Every step you passed ("
                             f"{', '.join(sorted(steps))}) is right, so look at how forward "
                             f"joins them, and at any step it computes inline.")
        return Diagnosis("forward", False, f"{where} No single known mistake matches: check "
                         f"each step with diagnose.check_step, or pass your step functions "
                         f"(steps={{...}}) to find the first one that differs.")
    return Diagnosis("forward", True, f"forward matches the reference module (causal={causal}) "
                     f"on {len(_inputs(module, seed))} inputs, including x * 400")


def check_forward(student, module, causal: bool = True,
                  steps: Mapping[str, Callable] | None = None, seed: int = 0) -> str:
    """`forward(...).check()`: the success line, or AssertionError saying what is wrong."""
    __tracebackhide__ = True
    return forward(student, module, causal, steps, seed).check()
