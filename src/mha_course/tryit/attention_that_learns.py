"""Self-check for the Try-it of 10_attention_that_learns.ipynb: the keys a rotation head reads.

The task is y[t] = x[(t + shift) % T]; the student predicts, for each query t, the key the
trained head reads most. The rule decides; the head the notebook trained (`read`, measured
there) is a cross-check that the model really learned it.

The exercise asks for a prediction made before the run, so the measurement must not come back
as the answer. `measured_keys` marks what the notebook measured: the array itself, its
`.tolist()`, its items and its copies stay marked, and the check refuses a marked answer (or one
that shares the measurement's memory) by that mark, not by its value, which is the right one
whenever the head learned the task.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from mha_course.i18n import _
from mha_course.tryit import (
    answer_sources,
    first_match,
    last_assignment,
    not_tried,
    not_yet,
    read_array,
    relate,
    right,
    self_check,
    students_frame,
)


class _MeasuredKey(int):
    """One key read off the trained head: an int that remembers where it came from."""

    def item(self) -> _MeasuredKey:
        return self


class _MeasuredList(list):
    """`read.tolist()`: a list that remembers it holds the measurement."""


class MeasuredKeys(np.ndarray):
    """The keys the trained head reads (T,), as measured; what is derived from it stays marked."""

    def tolist(self) -> Any:
        out = super().tolist()
        if isinstance(out, list):
            return _MeasuredList(_MeasuredKey(v) if isinstance(v, int) else v for v in out)
        return _MeasuredKey(out) if isinstance(out, int) else out

    def __iter__(self):
        for v in super().__iter__():
            yield _MeasuredKey(int(v)) if np.ndim(v) == 0 else v

    def __getitem__(self, index: Any) -> Any:
        out = super().__getitem__(index)
        return _MeasuredKey(int(out)) if isinstance(out, np.integer) else out

    def numpy(self) -> MeasuredKeys:  # the torch habit `read.numpy()` keeps working
        return self


def measured_keys(read: Any) -> MeasuredKeys:
    """The most-read key per query (a torch tensor or array (T,)), marked as the measurement."""
    value = read.detach().cpu().numpy() if hasattr(read, "detach") else np.asarray(read)
    return np.array(value, dtype=np.int64).view(MeasuredKeys)


def _measurement_form(answer: Any, read: Any) -> str | None:
    """How the answer was made from the measured keys (by mark or by shared memory), or None."""
    if answer is read or isinstance(answer, MeasuredKeys):
        return _("is `read` itself (or a copy of it)")
    if isinstance(answer, _MeasuredList):
        return _("is `read.tolist()`")
    if isinstance(answer, _MeasuredKey):
        return _("is one of `read`'s keys")
    if isinstance(answer, list | tuple) and any(isinstance(v, _MeasuredKey | MeasuredKeys)
                                                for v in answer):
        return _("holds the items of `read` (list(read) or a loop over it)")
    arr = answer.detach().cpu().numpy() if hasattr(answer, "detach") else answer
    if isinstance(arr, np.ndarray) and isinstance(read, np.ndarray) and np.shares_memory(arr, read):
        return _("shares its memory with `read` (a tensor or array made from it)")
    return None


def _assigned_from_measurement(read: Any) -> bool:
    """Whether the code that made the answer reads the measurement: an expression that uses
    `read` (under any name), the trained model, a measured map or `attention_maps`
    (`[int(k) for k in read]` keeps no mark). Read from the calling cell and the cells before
    it (answer_sources), and from the last `answer = ...` the kernel ran."""
    if read is None:
        return False
    frame = students_frame()
    ns = {} if frame is None else {**frame.f_globals, **frame.f_locals}
    nodes = []
    sources = answer_sources(frame)
    if sources is not None:
        nodes += sources[0]
    found = last_assignment("answer")
    if found is not None:
        nodes.append(found[0])
        ns = {**ns, **found[1]}
    return any(_is_measuring(n, ns, read) for node in nodes for n in ast.walk(node))


def _is_measuring(node: ast.AST, ns: dict, read: Any) -> bool:
    """A name bound to the measurement, a trained model or a measured attention map, or a call
    of attention_maps."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
            isinstance(node.slice, ast.Constant) and isinstance(ns.get(node.value.id), dict):
        value = ns[node.value.id].get(node.slice.value)  # e.g. S["read"]: a dict of results
        return value is read or isinstance(value, MeasuredKeys)
    if isinstance(node, ast.Name) and node.id in ns:
        value = ns[node.id]
        return value is read or isinstance(value, MeasuredKeys) or \
            type(value).__name__ == "TinyTransformer" or _is_soft_map(value)
    return isinstance(node, ast.Attribute) and node.attr == "attention_maps"


def _is_soft_map(value: Any) -> bool:
    """Attention weights as a model makes them: rows of a (..., T, T) float array summing to 1,
    not all 0 or 1 (a map the student writes as a prediction is one-hot)."""
    try:
        a = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
    except Exception:  # noqa: BLE001 - anything that is not array-like
        return False
    if a.ndim < 2 or a.shape[-1] != a.shape[-2] or a.dtype.kind != "f" or not a.size:
        return False
    return bool(np.allclose(a.sum(-1), 1, atol=1e-4) and not np.isin(a, (0, 1)).all())


def _keys(answer: Any, name: str, T: int) -> np.ndarray:
    """The answer as T integer key positions, from a list, array, tensor, {query: key} mapping,
    (query, key) pairs or a one-hot (T, T) map; or NotYet saying which form is wanted."""
    form = _("{name} must be a list of {T} key positions (whole numbers), one per query").format(
        name=name, T=T)
    if isinstance(answer, bytes):
        answer = answer.decode(errors="replace")
    if isinstance(answer, str):
        if not re.fullmatch(r"[\s\[\](),;-]*(\d[\s\[\](),;-]*)+", answer):
            not_yet(_("{expected}, got text {answer!r:.40}").format(expected=form, answer=answer))
        answer = [int(k) for k in re.findall(r"-?\d+", answer)]  # "3, 4, ...": the numbers in it
    if isinstance(answer, Mapping):
        if all(isinstance(q, str) and q.strip().isdigit() for q in answer):
            answer = {int(q): k for q, k in answer.items()}  # {"0": 3, ...}: queries as text
        if sorted(answer, key=str) != sorted(range(T), key=str):
            not_yet(_("{form} (or a mapping query -> key with the queries 0..{last} as keys), "
                      "got a mapping with keys {keys!r:.60}").format(
                form=form, last=T - 1, keys=sorted(answer, key=str)))
        answer = [answer[t] for t in range(T)]
    got = read_array(answer, form)
    if got.dtype.kind in "US" and all(re.fullmatch(r"\s*-?\d+\s*", str(v)) for v in got.flat):
        got = got.astype(np.int64)  # ["3", "4", ...]: numbers written as text
    if got.shape == (T, T):
        got = _from_map(got, name, T)
    elif got.shape == (T, 2) and np.array_equal(np.sort(got[:, 0]), np.arange(T)):
        got = got[np.argsort(got[:, 0]), 1]  # (query, key) pairs, in any order
    elif got.ndim == 2 and 1 in got.shape and got.size == T:
        got = got.reshape(T)
    if got.dtype == np.bool_ or not np.issubdtype(got.dtype, np.number):
        if got.dtype == np.bool_:
            not_yet(_("{form}, got booleans").format(form=form))
        not_yet(_("{form}, got dtype {dtype}").format(form=form, dtype=got.dtype))
    if got.shape != (T,):
        not_yet(_("{form}, got shape {shape}").format(form=form, shape=got.shape))
    if not np.all(np.isfinite(got)) or not np.array_equal(got, np.round(got)):
        not_yet(_("{name} must hold whole key positions, got {keys}").format(name=name,
                                                                             keys=got.tolist()))
    return got.astype(np.int64)


def _from_map(m: np.ndarray, name: str, T: int) -> np.ndarray:
    """A predicted (T, T) attention map, as the key each row reads most: one-hot rows, or
    weights (rows summing to 1) with a single largest entry per row."""
    if m.dtype == np.bool_ or np.isin(m, (0, 1)).all():
        if (m.sum(axis=1) == 1).all():
            return np.argmax(m, axis=1)
    elif np.isfinite(m).all() and np.allclose(m.sum(axis=1), 1, atol=1e-6) and (m >= 0).all():
        top = m.max(axis=1, keepdims=True)
        if ((m == top).sum(axis=1) == 1).all():
            return np.argmax(m, axis=1)
    not_yet(_("{name} as a ({T}, {T}) map must have a single 1 (True) in each row, or weights "
              "summing to 1 with one largest entry, at the key that query reads; or give the {T} "
              "keys as a list").format(name=name, T=T))


def _mistakes(T: int, shift: int) -> list[tuple[np.ndarray, str]]:
    """Typical wrong predictions for y[t] = x[(t + shift) % T], each with what it gets wrong."""
    t = np.arange(T)
    return [
        ((t - shift) % T, _("shifted the other way: that list sends query t to key t - {shift}, "
                            "the map for y[t] = x[t - {shift}] (or, read backwards, which query "
                            "reads each key); the target here is the token {shift} places "
                            "on").format(shift=shift)),
        (t + shift, _("keys {T}, {T1}, ... do not exist: positions run 0..{last}, and the "
                      "rotation wraps around at the end").format(T=T, T1=T + 1, last=T - 1)),
        (t - shift, _("negative keys do not exist: positions run 0..{last}, and the rotation "
                      "wraps around at the start").format(last=T - 1)),
        (t, _("that is the diagonal, each query reading its own position: it would copy x, but "
              "the target is the token {shift} places on").format(shift=shift)),
        (T - 1 - t, _("that is the reversal map from the first task (the anti-diagonal); this "
                      "task rotates instead of mirroring")),
        ((t + shift - 1) % T, _("off by one: that shifts by {s}, one place short").format(
            s=shift - 1)),
        ((t + shift + 1) % T, _("off by one: that shifts by {s}, one place too far").format(
            s=shift + 1)),
        ((t + shift) % T + 1, _("counted from 1: key positions start at 0 (query 0 ... query "
                                "{last}, key 0 ... key {last})").format(last=T - 1)),
        ((t + 1 + shift) % T, _("numbered the queries from 1: the first query is query 0, so "
                                "query t is row t of the map")),
        (np.minimum(t + shift, T - 1), _("stops at the last key instead of wrapping around: "
                                         "past the last position the rotation starts again at "
                                         "key 0")),
        (np.maximum(t - shift, 0), _("reads {shift} places back and stops at key 0: the target "
                                     "is the token {shift} places on, wrapping around").format(
            shift=shift)),
        ((t * shift) % T, _("multiplies t by {shift}: the rotation adds {shift} to the "
                            "position").format(shift=shift)),
        ((t + shift) % (T - 1), _("wraps around at {last}: there are {T} positions (0..{last}), "
                                  "so the rotation wraps at {T}").format(last=T - 1, T=T)),
        (T - 1 - (t + shift) % T, _("mirrored: each key is counted from the other end (key "
                                    "{last} where key 0 belongs), as if the map's columns were "
                                    "flipped").format(last=T - 1)),
        ((shift - t) % T, _("goes down as t grows (key {shift} - t, wrapping): the rotation "
                            "moves forward, so the key grows with the query").format(shift=shift)),
    ]


def _diagnosis(got: np.ndarray, want: np.ndarray, T: int, shift: int) -> str:
    """What is wrong with a wrong prediction, without the right keys."""
    named = first_match(got, _mistakes(T, shift))
    if named:
        return named
    if got.min() < 0 or got.max() >= T:
        bad = int(got[(got < 0) | (got >= T)][0])
        return _("key {bad} does not exist: positions run 0..{last}").format(bad=bad, last=T - 1)
    if len(set(got.tolist())) == 1:
        return _("every query reads the same key {key}: each query t needs its own token, so the "
                 "keys must differ").format(key=int(got[0]))
    t = np.arange(T)
    for s in range(T):
        if np.array_equal(got, (t + s) % T):
            return (_("that rotates by {s} place (query t reads key (t + {s}) mod {T}); the "
                      "target is the token {shift} places on") if s == 1 else
                    _("that rotates by {s} places (query t reads key (t + {s}) mod {T}); the "
                      "target is the token {shift} places on")).format(s=s, T=T, shift=shift)
    values, counts = np.unique(got, return_counts=True)
    if (counts > 1).any():
        twice = int(values[counts > 1][0])
        readers = np.flatnonzero(got == twice).tolist()
        return _("queries {readers} all read key {twice}: in a rotation each key holds the "
                 "target of exactly one query, so no key appears twice; {said}").format(
            readers=readers, twice=twice, said=relate(got, want, "answer"))
    return relate(got, want, "answer")


@self_check
def check_rotation_keys(answer: Any, read: Any = None, T: int = 8, shift: int = 3) -> str:
    """Say right, or which mistake the predicted keys of the rotation head make.

    `read` is what the trained head reads most (measured in the notebook, marked by
    `measured_keys`), or None.
    """
    if answer is None:
        return not_tried(_("write the {T} key positions as the list `answer`: for each query "
                           "t = 0, ..., {last}, the key the trained head reads").format(
            T=T, last=T - 1))
    copied = _measurement_form(answer, read)
    if copied is None and _assigned_from_measurement(read):
        copied = _("is computed from `read` (or from the trained model) in the cell that sets it")
    if copied:
        not_yet(_("`answer` {copied}: that is the trained head's measurement, not your "
                  "prediction. The exercise asks you to predict the map from the task's rule "
                  "before looking, then compare; write the keys yourself").format(copied=copied))
    got = _keys(answer, "answer", T)
    want = (np.arange(T) + shift) % T
    measured = None if read is None else _keys(read, _("read (the trained head's keys)"), T)
    if not np.array_equal(got, want):
        not_yet(_diagnosis(got, want, T, shift))
    said = _("query t reads key (t + {shift}) % {T}: a diagonal shifted {shift} to the right "
             "that wraps around from query {first} on").format(shift=shift, T=T, first=T - shift)
    if measured is not None and not np.array_equal(measured, want):
        said = _("{said}; but this run's head reads {keys}: it has not learned the rotation "
                 "everywhere (train longer, or check its accuracy)").format(
            said=said, keys=measured.tolist())
    elif measured is not None:
        said = _("{said}, and the trained head reads exactly these keys").format(said=said)
    return right(said)
