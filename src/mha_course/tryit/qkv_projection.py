"""Self-check for the Try-it of 02_qkv_projection.ipynb: cutting q out of the fused qkv."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from mha_course.i18n import _
from mha_course.tryit import (
    as_array,
    first_match,
    judge_parts,
    not_tried,
    not_yet,
    read_array,
    relate,
    right,
    self_check,
    words_of,
)


def _q_of(qkv: np.ndarray) -> np.ndarray:
    """q as the fused layout stores it: the first d_model of the 3 * d_model columns."""
    d_model = qkv.shape[-1] // 3
    return qkv[..., :d_model]  # (B, T, d_model)


def _require_qkv(qkv: Any) -> np.ndarray:
    """The fused output, (B, T, 3 * d_model), as the lesson computes it."""
    value = as_array(read_array(qkv, _("qkv must be an array")), "qkv")
    if value.ndim != 3 or value.shape[-1] % 3:
        not_yet(_("qkv must be the fused output of shape (B, T, 3 * d_model), got shape "
                  "{shape}").format(shape=value.shape))
    return value


def _as_bool(prediction: Any) -> bool:
    """The prediction as True or False (a numpy or torch boolean too), or NotYet."""
    value = np.asarray(prediction.detach().cpu() if hasattr(prediction, "detach") else prediction)
    if not isinstance(prediction, str | bytes) and value.shape == () and \
            value.dtype.kind in "iu" and int(value) in (0, 1):
        return bool(value)  # 0 and 1 stand for False and True, as in Python
    if isinstance(prediction, str | bytes) or value.dtype != np.bool_ or value.shape != ():
        not_yet(_("my_prediction must be True or False, got {kind} {answer!r:.40}").format(
            kind=type(prediction).__name__, answer=prediction))
    return bool(value)


def _judge_prediction(prediction: Any, qkv: np.ndarray) -> str:
    """Right about the prediction 'the classmate's split gives q', or NotYet."""
    said = _as_bool(prediction)
    B, T, three_d = qkv.shape
    classmate = qkv.reshape(B, T, three_d // 3, 3)[..., 0]  # (B, T, d_model)
    gives_q = bool(np.allclose(classmate, _q_of(qkv), rtol=0.0, atol=1e-12))
    if said != gives_q:
        if said:
            not_yet(_("you say the classmate's split gives q; compare qkv.reshape(B, T, d_model, "
                      "3)[..., 0] with q: which columns of qkv does [..., 0] pick, and which "
                      "columns hold q?"))
        not_yet(_("you say the classmate's split does not give q; compare qkv.reshape(B, T, "
                  "d_model, 3)[..., 0] with q: which columns of qkv does [..., 0] pick, and which "
                  "columns hold q?"))
    return right(_("the classmate's split is not q"))


def _source_columns(got: np.ndarray, qkv: np.ndarray) -> list[int | None]:
    """For each column of got (B, T, d_model): the column of qkv it equals, or None."""
    cols = []
    for c in range(got.shape[-1]):
        same = [j for j in range(qkv.shape[-1])
                if np.allclose(got[..., c], qkv[..., j], rtol=0.0, atol=1e-12)]
        cols.append(same[0] if same else None)
    return cols


def _mistakes(qkv: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """The typical wrong cuts of qkv, as values, each with the mistake it makes."""
    B, T, three_d = qkv.shape
    d = three_d // 3
    grouped = qkv.reshape(B, T, d, 3)  # (B, T, d_model, 3): consecutive columns in threes
    blocks = qkv.reshape(B, T, 3, d)  # (B, T, 3, d_model)
    found = [
        (grouped[..., 0], _("that is the classmate's split: reshape(B, T, d_model, 3)[..., 0] "
                            "groups consecutive columns in threes, so it takes every third "
                            "column (0, 3, 6, ...), a mix of q, k and v columns")),
        (blocks[..., 0], _("wrong index: your reshape groups the columns well, but [..., 0] "
                           "indexes the last axis (d_model) and keeps column 0 of q, k and v; "
                           "index the axis of length 3")),
        (blocks[:, 0], _("that indexes the T axis: [:, 0] keeps token 0 of each sequence (its "
                         "q, k and v); the index belongs on the axis of length 3")),
        (blocks[0], _("that indexes the B axis: [0] keeps sequence 0 (its q, k and v for every "
                      "token); the index belongs on the axis of length 3")),
        (qkv, _("that is all of qkv, q, k and v side by side: cut one of the three blocks out")),
        (qkv.reshape(B, 3, T, d)[:, 0], _("that reshape puts the 3 before T, (B, 3, T, "
                                          "d_model): it mixes tokens, since a reshape never "
                                          "moves numbers; keep B and T first and split the last "
                                          "axis")),
        (qkv.reshape(3, B, T, d)[0], _("that reshape puts the 3 in front of B, (3, B, T, "
                                       "d_model): it mixes sequences and tokens; keep B and T "
                                       "first and split the last axis")),
    ]
    for start in (1, 2):
        found.append((grouped[..., start], _("that is the classmate's split with index {start}: "
                                             "every third column from column {start}, still a "
                                             "mix of q, k and v").format(start=start)))
    for name, block in (("k", 1), ("v", 2)):
        found.append((blocks[:, :, block], _("that is {name}: index {block} of the axis of "
                                             "length 3 is the {name} block; the blocks are q, k, "
                                             "v in this order").format(name=name, block=block)))
    return found


def _fallback(got: np.ndarray, qkv: np.ndarray) -> str:
    """What the unknown answer holds, in terms of qkv's columns, without writing the reshape."""
    d = qkv.shape[-1] // 3
    want = _q_of(qkv)  # (B, T, d_model)
    said = relate(got, want, "my_q")
    if got.shape != want.shape:
        for perm in itertools.permutations(range(got.ndim)):
            if got.transpose(perm).shape == want.shape:
                why = first_match(got.transpose(perm), _mistakes(qkv), atol=1e-12)
                if why is not None:  # a listed slip with its axes in another order
                    return _("my_q has shape {shape}, its axes in another order than (B, T, "
                             "d_model); put back in order, {why}").format(shape=got.shape,
                                                                         why=why)
        return said
    if not said.startswith(("my_q: ", "my_q：")):  # reversed, shifted, a ratio ...: says more
        return said
    cols = _source_columns(got, qkv)
    if all(c is None for c in cols):
        return _("{said}; and no column of it is a column of qkv: a reshape and an index only "
                 "pick numbers, they never compute new ones").format(said=said)
    c = next((i for i, j in enumerate(cols) if j != i), 0)
    if cols[c] is None:
        return _("column {c} of your q is no column of qkv for every token: the reshape mixed "
                 "tokens or sequences; split only the last axis").format(c=c)
    block = "qkv"[cols[c] // d]
    return _("column {c} of your q is column {col} of qkv, which belongs to {block}: qkv holds "
             "all of q, then all of k, then all of v along its last axis").format(
        c=c, col=cols[c], block=block)


def _judge_q(my_q: Any, qkv: np.ndarray, q2: Any) -> str:
    """Right if my_q is q cut out of qkv (a view of it, not a copy of q), or NotYet."""
    got = read_array(my_q, _("my_q must be an array (a reshape of qkv)"))
    as_array(got, "my_q")  # numbers, not text or booleans
    want = _q_of(qkv)  # (B, T, d_model)
    if got.shape == want.shape and np.allclose(got, want, rtol=0.0, atol=1e-12):
        if q2 is not None and my_q is q2:
            not_yet(_("my_q is q2, the lesson's own np.split of qkv: cut q out of qkv "
                      "yourself, with a reshape and an index"))
        if isinstance(my_q, list | tuple):
            not_yet(_("my_q holds q's numbers, as a list: a list cannot show where it was cut "
                      "from, so give the array itself (the view of qkv your reshape and index "
                      "make), not .tolist()"))
        if not np.shares_memory(got, qkv):
            not_yet(_("my_q holds q's numbers but shares no memory with qkv, so it was not cut "
                      "out of it: it is q itself (my_q = q), q computed again, or a copy "
                      "(.copy(), np.array(...)). A reshape and an index give a view of qkv: "
                      "cut q out of qkv that way"))
        return right(_("my_q is q: qkv holds all of q, then all of k, then all of v, so the "
                       "axis of length 3 comes before d_model"))
    why = first_match(got, _mistakes(qkv), atol=1e-12)
    not_yet(why if why is not None else _fallback(got, qkv))


@self_check
def check_split(prediction: Any, my_q: Any, qkv: Any, q2: Any = None) -> str:
    """Say right, or what is wrong with the prediction and the reshape that cuts q out of qkv.

    q2: the lesson's own np.split block, so that `my_q = q2` is told apart from a reshape.
    """
    if prediction is None and my_q is None:
        return not_tried(_("write my_prediction (True or False) and my_q (a reshape of qkv), "
                           "then run this cell"))
    fused = _require_qkv(qkv)
    if my_q is None:
        said = words_of(_judge_prediction(prediction, fused))
        return not_tried(_("the prediction is right ({said}); now write my_q, a reshape of qkv "
                           "that gives q").format(said=said))
    if prediction is None:
        _judge_q(my_q, fused, q2)
        return not_tried(_("my_q is right; now write my_prediction: does the classmate's split "
                           "give q, True or False?"))
    return judge_parts(my_prediction=lambda: _judge_prediction(prediction, fused),
                       my_q=lambda: _judge_q(my_q, fused, q2))
