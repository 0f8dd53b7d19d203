"""Contract cases for mha.tryit.weighted_sum (07_weighted_sum.ipynb)."""

import numpy as np

from mha.tryit import weighted_sum as tryit
from tests.self_checks import Case

V = np.random.default_rng(7).normal(size=(1, 1, 4, 2))  # the lesson's v_try (B, h, S, d_k)
T = V.shape[2]


def mean_of(rows) -> np.ndarray:
    """(d_k,): the plain mean of the value rows listed, by a loop."""
    return sum(V[0, 0, s] for s in rows) / len(rows)


def outputs(keys_of) -> np.ndarray:
    """(1, 1, T, d_k): output t is the mean of the value rows keys_of(t), built by hand."""
    return np.array([[[mean_of(keys_of(t)) for t in range(T)]]])


NO_MASK = outputs(lambda t: range(T))  # every query: the mean of all value rows
CAUSAL = outputs(lambda t: range(t + 1))  # query t: the running mean of v_0..v_t
RUNNING_SUM = np.array([[[sum(V[0, 0, s] for s in range(t + 1)) for t in range(T)]]])
with np.errstate(divide="ignore"):
    BY_T = RUNNING_SUM / np.arange(T)[:, None]  # row 0 divided by 0: inf

CASES = [
    Case(tryit.check_uniform,
         right=lambda: (NO_MASK, CAUSAL),
         untried=lambda: (None, None),
         wrong={"its own value row v_t: that is a weight of 1": lambda: (V, CAUSAL),
                "averaged over d_k": lambda: (np.broadcast_to(V.mean(-1, keepdims=True), V.shape),
                                              CAUSAL),
                "sums the value rows": lambda: (np.broadcast_to(V.sum(2, keepdims=True), V.shape),
                                                CAUSAL),
                "the causal answer": lambda: (CAUSAL, NO_MASK),
                "one row of shape": lambda: (NO_MASK[:, :, :1], CAUSAL),
                "ignores the mask": lambda: (NO_MASK, NO_MASK),
                "its own value row v_t alone": lambda: (NO_MASK, V),
                "a running sum, not a mean": lambda: (NO_MASK, RUNNING_SUM),
                "divided by t + 2": lambda: (NO_MASK, RUNNING_SUM / np.arange(2, T + 2)[:, None]),
                "without key t itself": lambda: (NO_MASK, outputs(lambda t: range(max(t, 1)))),
                "one key in the future": lambda: (NO_MASK, outputs(lambda t: range(min(t + 2, T)))),
                "the future: the causal mask keeps": lambda: (NO_MASK, outputs(lambda t: range(t, T))),
                "division by zero": lambda: (NO_MASK, BY_T),
                "is furthest from": lambda: (NO_MASK, CAUSAL + np.eye(T)[None, None, :, :2])},
         garbage=[lambda: ("v_try.mean()", CAUSAL), lambda: (NO_MASK, [[1.0, 2.0], [3.0]]),
                  lambda: (NO_MASK, np.zeros((1, 1, 4, 3))), lambda: (NO_MASK > 0, CAUSAL),
                  lambda: (NO_MASK, "running mean")]),
]
