"""Self-check for the Try-it of 07_weighted_sum.ipynb: outputs of equal scores, without and with a mask.

    print(tryit.check_uniform(my_no_mask, my_causal, v_try))  # each a function v -> (B, h, T, d_k)

The answers are functions, so the check can run them under the grading guard (the exercise is
numpy only, without `steps`) and on a second v of another shape (nothing hard-coded). Both parts
are judged, whichever is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mha import steps
from mha_course.i18n import _
from mha_course.tryit import (
    NotYet,
    as_array,
    first_match,
    guarded,
    is_right,
    judge_parts,
    not_tried,
    not_yet,
    relate,
    right,
    where_in_students_code,
    words_of,
)
from mha_course.tryit import self_check as _self_check

ATOL = 1e-12


def _rule() -> str:
    return _("this Try-it asks for numpy only, without steps (or any other function of the "
             "package)")



def lesson_v() -> np.ndarray:
    """The lesson's v_try: (B, h, S, d_k) = (1, 1, 4, 2), seeded."""
    return np.random.default_rng(7).normal(size=(1, 1, 4, 2))


def second_v() -> np.ndarray:
    """Another v, (B, h, S, d_k) = (2, 3, 5, 3): a function that hard-codes v_try's shape fails."""
    return np.random.default_rng(11).normal(size=(2, 3, 5, 3))


def _want(v: np.ndarray, causal: bool) -> np.ndarray:
    """What the package gives for equal scores: (B, h, T, d_k) with T = S."""
    T = v.shape[2]
    equal = np.zeros(v.shape[:2] + (T, T))  # (B, h, T, S): every score the same
    return steps.weighted_sum(steps.masked_softmax(equal, steps.causal_mask(T) if causal else None), v)


def _means(v: np.ndarray, keys) -> np.ndarray:
    """Row t: the mean of the value rows v[keys(t)], a slice; (B, h, T, d_k)."""
    return np.stack([v[:, :, keys(t)].mean(axis=2) for t in range(v.shape[2])], axis=2)


def _mistakes(v: np.ndarray, causal: bool) -> list[tuple[np.ndarray, str]]:
    """Typical wrong answers for one part, each with the mistake it makes."""
    T = v.shape[2]
    counts = np.arange(1, T + 1)[:, None]  # (T, 1): keys query t may see under the mask
    every = np.broadcast_to(v.mean(axis=2, keepdims=True), v.shape)  # (B, h, T, d_k)
    by_features = np.broadcast_to(v.mean(axis=-1, keepdims=True), v.shape)
    shared = [(by_features, _("you averaged over d_k (the last axis, the features of one "
                              "value row): the weights mix value rows, so the mean runs over "
                              "the keys, axis 2")),
              (np.broadcast_to(v.mean(axis=(2, 3), keepdims=True), v.shape),
               _("you averaged every number of v, over the keys and the features together: the "
                 "weights mix value rows, so the mean runs over the keys (axis 2) only"))]
    if not causal:
        return shared + [
            (v, _("each output is its own value row v_t: that is a weight of 1 on the query's "
                  "own key. Equal scores give every key the same weight")),
            (np.broadcast_to(v.sum(axis=2, keepdims=True), v.shape),
             _("that sums the value rows: {T} equal weights are 1/{T} each, so it is their "
               "mean").format(T=T)),
            (_want(v, True), _("that is the running mean, the causal answer: without a mask "
                               "every query sees all the keys")),
            (np.broadcast_to(v.sum(axis=2, keepdims=True), v.shape) / (T - 1) if T > 1 else v,
             _("that divides the sum of the {T} value rows by T - 1: every query sees all {T} "
               "keys").format(T=T)),
        ]
    return shared + [
        (every, _("that is the no-mask answer (every output the mean of all value rows): it "
                  "ignores the mask, under which query t sees only keys 0..t")),
        (v, _("each output is its own value row v_t alone: under the causal mask query t sees "
              "keys 0..t, all of them with the same score")),
        (np.cumsum(v, axis=2), _("a running sum, not a mean: the weights of one row must add "
                                 "up to 1, and yours add up to the number of keys it sees")),
        (np.cumsum(v, axis=2) / (counts + 1), _("divided by t + 2: off by one, count the keys "
                                                "0..t that query t sees, itself included")),
        (np.cumsum(v, axis=2) / np.maximum(counts - 1, 1),
         _("the running sum divided by t (query 0 by 1): off by one, query t sees t + 1 keys, "
           "0..t, itself included")),
        (np.cumsum(v, axis=2) / T, _("the running sum divided by T = {T} for every row: only the "
                                     "last query sees all {T} keys, so the others' weights add "
                                     "up to less than 1").format(T=T)),
        (_means(v, lambda t: slice(0, max(t, 1))),
         _("the mean of the keys before t, without key t itself: off by one, the causal mask "
           "allows s <= t")),
        (_means(v, lambda t: slice(0, t + 2)), _("the mean of keys 0..t+1: off by one, one key "
                                                 "in the future")),
        (_means(v, lambda t: slice(t, T)), _("the mean of keys t..T-1, the future: the causal "
                                             "mask keeps the past, keys 0..t")),
        ((np.tril(np.ones((T, T))) / np.arange(T, 0, -1)) @ v,  # (T, S) @ (B, h, S, d_k)
         _("your weights sum to 1 down each column (over the queries), not along each row: "
           "normalise each query's row, over the keys it may see")),
        (_means(v, lambda t: slice(T - 1 - t, T)), _("row t averages the last t + 1 keys (a "
                                                     "running mean of v in reverse): the causal "
                                                     "mask keeps the first keys, 0..t")),
        (np.flip(_want(v, True), axis=2), _("the running means in reverse order: row t must be "
                                            "the mean of keys 0..t, the first row v_0 alone")),
        (np.cumsum(v, axis=-1) / np.arange(1, v.shape[3] + 1), _(
            "a running mean over d_k (the last axis): the mask runs over the keys, axis 2")),
    ]


def _judge(name: str, got: Any, v: np.ndarray, causal: bool) -> str | None:
    """None if `got` is this part's output for v; else the message naming the mistake."""
    want = _want(v, causal)
    if isinstance(got, str | bytes):
        return _("{name} gave text {answer!r:.40}, not an array of shape {shape}").format(
            name=name, answer=got, shape=want.shape)
    output = _("{name}'s output").format(name=name)
    got = as_array(got.detach() if hasattr(got, "detach") else got, output)
    atol = ATOL if got.dtype == np.float64 else 1e-5 * max(1.0, float(np.abs(want).max()))
    got = got.astype(np.float64)
    if got.shape != want.shape:
        mean = v.mean(axis=2)  # (B, h, d_k): the no-mask output of every query
        if not causal and got.size == mean.size and got.shape[-1] == mean.shape[-1] \
                and np.allclose(got.reshape(-1), mean.reshape(-1), rtol=0, atol=atol):
            return _("the right mean, but one row of shape {shape} for all queries: broadcast "
                     "it to v's shape {want}, one output per query").format(shape=got.shape,
                                                                            want=want.shape)
        try:
            spread = np.broadcast_to(got, want.shape)  # a shape that broadcasts: judge its values
        except ValueError:
            return relate(got, want, output)
        why = _judge(name, spread, v, causal)
        if why:
            return _("{why} (and its shape {shape} is not v's {want})").format(
                why=why, shape=got.shape, want=want.shape)
        return _("the right values, but of shape {shape}: broadcast them to v's shape {want}, "
                 "one output per query").format(shape=got.shape, want=want.shape)
    if np.allclose(got, want, rtol=0, atol=atol):
        return None
    if not np.isfinite(got).all():
        row = int(np.argwhere(~np.isfinite(got))[0][2])
        if causal:
            return _("row {row} is inf or NaN: a division by zero? count the keys 0..t query t "
                     "sees under the causal mask (from 1, not 0)").format(row=row)
        return _("row {row} is inf or NaN: a division by zero? every query sees all {T} "
                 "keys").format(row=row, T=v.shape[2])
    why = first_match(got, _mistakes(v, causal), atol=atol)
    if why is not None:
        return why
    T = v.shape[2]
    return relate(got, want, output, factors={f"T = {T}": T})


def _run(fn: Callable, name: str, v: np.ndarray, second: bool) -> Any:
    """fn(v) under the grading guard; the student's own error becomes NotYet naming its line."""
    try:
        return guarded(fn, v.copy(), rule=_rule())
    except NotYet:
        raise
    except Exception as err:  # noqa: BLE001 - the student's function may raise anything
        where = where_in_students_code(err.__traceback__)
        hint = (_(", on a v of shape {shape} (it runs on v_try): read T and the shape from v, "
                  "not from v_try") if second else _(", on v_try of shape {shape}")).format(
            shape=v.shape)
        not_yet(_("{name}(v) raised {error}: {text}{where}{hint}").format(
            name=name, error=type(err).__name__, text=str(err)[:200],
            where=_(" ({where})").format(where=where) if where else "", hint=hint))


def _part(name: str, answer: Any, v: np.ndarray, causal: bool) -> str:
    """One part's verdict: right, not tried, or NotYet naming the mistake."""
    if answer is None:
        return not_tried(_("`{name}` is still None: write it as a function of v").format(
            name=name))
    if not callable(answer):
        said = _judge(name, answer, v, causal)
        if said is not None:
            not_yet(_("{said} (and write it as a function of v: def {name}(v): return "
                      "...)").format(said=said, name=name))
        not_yet(_("these are the right values for v_try; now write them as a function, def "
                  "{name}(v): return ..., so the check can run it on a second v and make sure it "
                  "uses numpy only, not steps").format(name=name))
    first = None
    for k, x in enumerate((v, second_v())):
        out = _run(answer, name, x, second=k == 1)
        if out is None:
            not_yet(_("{name}(v) returned None: did you forget the `return`?").format(name=name))
        said = _judge(name, out, x, causal)
        if k == 1 and said is not None:
            fixed = first is not None and np.shape(out) == np.shape(first) and np.allclose(
                np.asarray(out, dtype=np.float64), first)
            if fixed:
                said = _("it gives the same output whatever v is: use its argument v, not "
                         "v_try")
            said = _("right for v_try, but not for a v of shape {shape}: {said}").format(
                shape=x.shape, said=said)
        if said is not None:
            not_yet(said)
        first = np.asarray(out, dtype=np.float64)
    T = v.shape[2]
    return right(_("the mean of all {T} value rows for every query").format(T=T) if not causal
                 else _("the running mean v_0..v_t for query t"))


@_self_check
def check_uniform(my_no_mask: Any, my_causal: Any, v: np.ndarray | None = None) -> str:
    """Say right, or what each answer misses: equal scores make each output a mean of value rows."""
    v = lesson_v() if v is None else np.asarray(v, dtype=np.float64)
    if my_no_mask is None and my_causal is None:
        return not_tried(_("write both outputs as numpy functions of v, `my_no_mask(v)` and "
                           "`my_causal(v)`, each returning v's shape (B, h, T, d_k)"))
    said = judge_parts(my_no_mask=lambda: _part("my_no_mask", my_no_mask, v, False),
                       my_causal=lambda: _part("my_causal", my_causal, v, True))
    if not is_right(said):
        return said
    return right(_("with equal scores every output is a plain average of the value rows it may "
                   "see ({said}), as steps.weighted_sum(steps.masked_softmax(zeros, mask), v) "
                   "gives").format(said=words_of(said)))
