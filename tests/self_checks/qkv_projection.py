"""Contract cases for mha_course.tryit.qkv_projection (02_qkv_projection.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import qkv_projection as tryit
from tests.self_checks import Case

B, T, D = 2, 4, 8
QKV = np.random.default_rng(0).normal(size=(B, T, 3 * D))  # (B, T, 3 * d_model): stands in for x @ W_qkv


def _columns(cols: list[int]) -> np.ndarray:
    """(B, T, len(cols)) built by a loop: column i is column cols[i] of QKV."""
    out = np.empty((B, T, len(cols)))
    for b in range(B):
        for t in range(T):
            for i, c in enumerate(cols):
                out[b, t, i] = QKV[b, t, c]
    return out


Q = _columns(list(range(0, D)))  # q: the first block of columns, by hand
K = _columns(list(range(D, 2 * D)))
V = _columns(list(range(2 * D, 3 * D)))
EVERY_THIRD = _columns(list(range(0, 3 * D, 3)))  # the classmate's reshape(B, T, D, 3)[..., 0]


def _mixed_tokens() -> np.ndarray:
    """reshape(B, 3, T, D)[:, 0] written as a loop: the first T * D numbers of each sequence."""
    out = np.empty((B, T, D))
    for b in range(B):
        flat = [QKV[b, t, c] for t in range(T) for c in range(3 * D)]  # row-major order
        for t in range(T):
            out[b, t] = flat[t * D:(t + 1) * D]
    return out


def _wrong_index() -> np.ndarray:
    """reshape(B, T, 3, D)[..., 0] as a loop: column 0 of each of q, k and v."""
    return _columns([0, D, 2 * D])


Q_VIEW = QKV[:, :, :D]  # q cut out of QKV: a view, sharing its memory
Q2 = np.split(QKV, 3, axis=-1)[0]  # the lesson's own q2
TORCH_QKV = torch.from_numpy(QKV)

CASES = [
    Case(tryit.check_split,
         right=lambda: (False, Q_VIEW, QKV),
         right_forms=[lambda: (np.False_, QKV.reshape(B, T, 3, D)[:, :, 0], QKV),
                      lambda: (0, QKV.reshape(B, T, 3, D)[:, :, 0], QKV),  # 0 == False
                      lambda: (False, QKV.reshape(B, T, 3, D)[..., 0, :], QKV, Q2),
                      lambda: (False, np.split(QKV, 3, axis=-1)[0], QKV, Q2),  # a fresh split
                      lambda: (False, QKV.reshape(B, T, 3, D).transpose(2, 0, 1, 3)[0], QKV),
                      lambda: (torch.tensor(False), TORCH_QKV.reshape(B, T, 3, D)[:, :, 0],
                               TORCH_QKV)],
         untried=lambda: (None, None, QKV),
         wrong={"you say the classmate's split gives q": lambda: (True, Q_VIEW, QKV),
                "classmate's split:": lambda: (False, EVERY_THIRD, QKV),
                "classmate's split with index 1": lambda: (False, _columns(list(range(1, 3 * D, 3))),
                                                           QKV),
                "that is k": lambda: (False, K, QKV),
                "that is v": lambda: (False, V, QKV),
                "wrong index": lambda: (False, _wrong_index(), QKV),
                "mixes tokens": lambda: (False, _mixed_tokens(), QKV),
                "all of qkv": lambda: (False, QKV.copy(), QKV),
                "belongs to k": lambda: (False, np.concatenate([Q[..., :4], K[..., 4:]], -1), QKV),
                "indexes the T axis": lambda: (False, QKV.reshape(B, T, 3, D)[:, 0], QKV),
                "indexes the B axis": lambda: (False, QKV.reshape(B, T, 3, D)[0], QKV),
                # the issue: my_q = q (computed apart, or copied) passed; so did q2 itself
                "shares no memory with qkv": lambda: (False, Q, QKV, Q2),
                "the lesson's own np.split": lambda: (False, Q2, QKV, Q2),
                # both parts judged, the second too when the first is wrong
                "0 of 2 parts right": lambda: (True, EVERY_THIRD, QKV),
                # unlisted, told by relate
                "axes in another order": lambda: (False, Q_VIEW.transpose(0, 2, 1), QKV),
                "a reshape is missing": lambda: (False, QKV.reshape(B * T, 3, D)[:, 0], QKV),
                "no column of it is a column of qkv": lambda: (False, Q + K + V, QKV),
                "reversed along axis 1": lambda: (False, Q[:, ::-1], QKV),
                "axes in another order than (B, T, d_model); put back in order, that is the "
                "classmate's split": lambda: (False, EVERY_THIRD.T, QKV)},
         garbage=[lambda: ("False", Q_VIEW, QKV), lambda: (2, Q_VIEW, QKV),
                  lambda: (False, "qkv[..., :8]", QKV), lambda: (False, [[1.0, 2.0], [3.0]], QKV),
                  lambda: (False, np.zeros((B, T, 7)), QKV), lambda: (False, Q_VIEW, "qkv"),
                  lambda: (False, Q_VIEW, np.zeros((B, T, 8))), lambda: (False, Q_VIEW > 0, QKV)],
         secret=["reshape(B, T, 3, d_model)", "[:, :, 0]", "3, d_model)"]),
]
