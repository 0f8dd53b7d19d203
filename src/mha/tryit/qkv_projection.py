"""Self-check for the Try-it of 02_qkv_projection.ipynb: cutting q out of the fused qkv."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import as_array, not_tried, not_yet, right


def _q_of(qkv: np.ndarray) -> np.ndarray:
    """q as the fused layout stores it: the first d_model of the 3 * d_model columns."""
    d_model = qkv.shape[-1] // 3
    return qkv[..., :d_model]  # (B, T, d_model)


def _require_qkv(qkv: Any) -> np.ndarray:
    """The fused output, (B, T, 3 * d_model), as the lesson computes it."""
    value = as_array(qkv, "qkv")
    if value.ndim != 3 or value.shape[-1] % 3:
        not_yet(f"qkv must be the fused output of shape (B, T, 3 * d_model), got shape "
                f"{value.shape}")
    return value


def _check_prediction(prediction: Any, qkv: np.ndarray) -> str:
    """Say right about the prediction 'the classmate's split gives q', or raise NotYet."""
    if not isinstance(prediction, bool | np.bool_):
        not_yet(f"my_prediction must be True or False, got {type(prediction).__name__} "
                f"{prediction!r}")
    B, T, three_d = qkv.shape
    classmate = qkv.reshape(B, T, three_d // 3, 3)[..., 0]  # (B, T, d_model)
    gives_q = bool(np.allclose(classmate, _q_of(qkv), rtol=0.0, atol=1e-12))
    if bool(prediction) != gives_q:
        not_yet("the prediction: you say the classmate's split gives q; compare "
                "qkv.reshape(B, T, d_model, 3)[..., 0] with q: which columns of qkv does "
                "[..., 0] pick, and which columns hold q?")
    return "the prediction is right: the classmate's split is not q"


def _source_columns(got: np.ndarray, qkv: np.ndarray) -> list[int | None]:
    """For each column of got (B, T, d_model): the column of qkv it equals, or None."""
    cols = []
    for c in range(got.shape[-1]):
        same = [j for j in range(qkv.shape[-1])
                if np.allclose(got[..., c], qkv[..., j], rtol=0.0, atol=1e-12)]
        cols.append(same[0] if same else None)
    return cols


def _named(got: np.ndarray, qkv: np.ndarray) -> str | None:
    """The message of the typical wrong reshape that got is, or None."""
    B, T, three_d = qkv.shape
    d = three_d // 3
    if got.shape == (B, T, 3) and np.allclose(got, qkv.reshape(B, T, 3, d)[..., 0], atol=1e-12):
        return ("wrong index: reshape(B, T, 3, d_model) is right, but [..., 0] indexes the last "
                "axis (d_model) and keeps column 0 of q, k and v; index the axis of length 3")
    if got.shape == (B, T, 3 * d):
        return "that is all of qkv, q, k and v side by side: cut one of the three blocks out"
    if got.shape != (B, T, d):
        return None
    cols = _source_columns(got, qkv)
    if cols == list(range(0, 3 * d, 3)):
        return ("that is the classmate's split: reshape(B, T, d_model, 3)[..., 0] groups "
                "consecutive columns in threes, so it takes every third column (0, 3, 6, ...), "
                "a mix of q, k and v columns")
    for start in (1, 2):
        if cols == list(range(start, 3 * d, 3)):
            return (f"that is the classmate's split with index {start}: every third column "
                    f"from column {start}, still a mix of q, k and v; the axis of length 3 "
                    f"must come before d_model")
    for name, block in (("k", 1), ("v", 2)):
        if cols == list(range(block * d, (block + 1) * d)):
            return (f"that is {name}: index {block} of the axis of length 3 is the {name} "
                    f"block; the blocks are q, k, v in this order")
    if np.allclose(got, qkv.reshape(B, 3, T, d)[:, 0], atol=1e-12):
        return ("that reshape puts the 3 before T, (B, 3, T, d_model): it mixes tokens, since "
                "a reshape never moves numbers; keep B and T first and split the last axis")
    if np.allclose(got, qkv.reshape(3, B, T, d)[0], atol=1e-12):
        return ("that reshape puts the 3 in front of B, (3, B, T, d_model): it mixes sequences "
                "and tokens; keep B and T first and split the last axis")
    return None


def _fallback(got: np.ndarray, qkv: np.ndarray) -> str:
    """What the unknown answer holds, in terms of qkv's columns, without writing the reshape."""
    d = qkv.shape[-1] // 3
    if got.shape != qkv.shape[:2] + (d,):
        return f"my_q must have the shape of q, {qkv.shape[:2] + (d,)}, got shape {got.shape}"
    cols = _source_columns(got, qkv)
    c = next((i for i, j in enumerate(cols) if j != i), 0)
    if cols[c] is None:
        return (f"column {c} of your q is no column of qkv for every token: the reshape mixed "
                f"tokens or sequences; split only the last axis")
    block = "qkv"[cols[c] // d]
    return (f"column {c} of your q is column {cols[c]} of qkv, which belongs to {block}: "
            f"qkv holds all of q, then all of k, then all of v along its last axis")


def check_split(prediction: Any, my_q: Any, qkv: Any) -> str:
    """Say right, or what is wrong with the prediction and the reshape that cuts q out of qkv."""
    if prediction is None and my_q is None:
        return not_tried("write my_prediction (True or False) and my_q (a reshape of qkv), then "
                         "run this cell")
    fused = _require_qkv(qkv)
    said = _check_prediction(prediction, fused) if prediction is not None else None
    if my_q is None:
        return not_tried(f"{said}; now write my_q, a reshape of qkv that gives q")
    got = as_array(my_q, "my_q")
    if got.shape == fused.shape[:2] + (fused.shape[-1] // 3,) and np.allclose(
            got, _q_of(fused), rtol=0.0, atol=1e-12):
        if said is None:
            return not_tried("my_q is right; now write my_prediction: does the classmate's "
                             "split give q, True or False?")
        return right(f"{said}, and your my_q is q: the axis of length 3 comes before d_model, "
                     f"because qkv holds all of q, then all of k, then all of v")
    why = _named(got, fused)
    not_yet(why if why is not None else _fallback(got, fused))
