"""Contract cases for mha.tryit.qkv_projection (02_qkv_projection.ipynb)."""

import numpy as np

from mha.tryit import qkv_projection as tryit
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


CASES = [
    Case(tryit.check_split,
         right=lambda: (False, Q, QKV),
         untried=lambda: (None, None, QKV),
         wrong={"the prediction": lambda: (True, Q, QKV),
                "classmate's split:": lambda: (False, EVERY_THIRD, QKV),
                "classmate's split with index 1": lambda: (False, _columns(list(range(1, 3 * D, 3))),
                                                           QKV),
                "that is k": lambda: (False, K, QKV),
                "that is v": lambda: (False, V, QKV),
                "wrong index": lambda: (False, _wrong_index(), QKV),
                "mixes tokens": lambda: (False, _mixed_tokens(), QKV),
                "all of qkv": lambda: (False, QKV.copy(), QKV),
                "belongs to k": lambda: (False, np.concatenate([Q[..., :4], K[..., 4:]], -1), QKV)},
         garbage=[lambda: ("False", Q, QKV), lambda: (0, Q, QKV), lambda: (False, "qkv[..., :8]", QKV),
                  lambda: (False, [[1.0, 2.0], [3.0]], QKV), lambda: (False, np.zeros((B, T, 7)), QKV),
                  lambda: (False, Q, "qkv"), lambda: (False, Q, np.zeros((B, T, 8)))]),
]
