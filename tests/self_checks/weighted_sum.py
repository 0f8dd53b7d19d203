"""Contract cases for mha_course.tryit.weighted_sum (07_weighted_sum.ipynb).

The answers are functions v -> (B, h, T, d_k); the right ones here are built with loops, the
wrong ones each make one slip. The check also runs them on a second v of shape (2, 3, 5, 3).
"""

import numpy as np
import torch

from mha import steps
from mha_course.tryit import weighted_sum as tryit
from tests.self_checks import Case

V = np.random.default_rng(7).normal(size=(1, 1, 4, 2))  # the lesson's v_try (B, h, S, d_k)


def means(keys_of):
    """A student's function: output t is the plain mean of the value rows keys_of(t, T), by loops."""
    def fn(v):
        B, h, T, d_k = v.shape
        out = np.zeros(v.shape)  # (B, h, T, d_k)
        for t in range(T):
            rows = list(keys_of(t, T))
            out[:, :, t] = sum(v[:, :, s] for s in rows) / len(rows)
        return out
    return fn


NO_MASK = means(lambda t, T: range(T))  # every query: the mean of all value rows
CAUSAL = means(lambda t, T: range(t + 1))  # query t: the running mean of v_0..v_t


def running_sum(v):
    return np.cumsum(v, axis=2)  # (B, h, T, d_k)


def by_t(v):
    with np.errstate(divide="ignore"):
        return np.cumsum(v, axis=2) / np.arange(v.shape[2])[:, None]  # row 0 divided by 0: inf


def hard_coded(v):
    return np.cumsum(v, axis=2) / np.arange(1, 5)[:, None]  # T = 4 of v_try, not of v


def uses_v_try(v):
    return CAUSAL(V)  # ignores its argument


def with_steps(v):
    T = v.shape[2]
    equal = np.zeros(v.shape[:2] + (T, T))  # (B, h, T, S)
    return steps.weighted_sum(steps.masked_softmax(equal, steps.causal_mask(T)), v)


def normalised_over_queries(v):
    T = v.shape[2]
    w = np.tril(np.ones((T, T)))  # (T, S)
    return (w / w.sum(axis=0)) @ v  # columns sum to 1, not rows


def median(v):
    return np.broadcast_to(np.median(v, axis=2, keepdims=True), v.shape)


CASES = [
    Case(tryit.check_uniform,
         right=lambda: (NO_MASK, CAUSAL, V),
         untried=lambda: (None, None, V),
         right_forms=[
             lambda: (lambda v: np.broadcast_to(v.mean(axis=2, keepdims=True), v.shape),
                      lambda v: np.cumsum(v, axis=2) / np.arange(1, v.shape[2] + 1)[:, None], V),
             lambda: (lambda v: torch.from_numpy(v).mean(2, keepdim=True).expand(v.shape),
                      lambda v: (np.tril(np.ones((v.shape[2],) * 2))
                                 / np.arange(1, v.shape[2] + 1)[:, None]) @ v, V),
             lambda: (NO_MASK, CAUSAL, None),  # v defaults to the lesson's v_try
             lambda: (lambda v: NO_MASK(v).astype(np.float32), lambda v: CAUSAL(v).tolist(), V)],
         wrong={"its own value row v_t: that is a weight of 1": lambda: (lambda v: v, CAUSAL, V),
                "averaged over d_k": lambda: (lambda v: np.broadcast_to(v.mean(-1, keepdims=True),
                                                                        v.shape), CAUSAL, V),
                "sums the value rows": lambda: (lambda v: np.broadcast_to(v.sum(2, keepdims=True),
                                                                          v.shape), CAUSAL, V),
                "the causal answer": lambda: (CAUSAL, NO_MASK, V),
                "one row of shape": lambda: (lambda v: v.mean(2, keepdims=True), CAUSAL, V),
                "ignores the mask": lambda: (NO_MASK, NO_MASK, V),
                "its own value row v_t alone": lambda: (NO_MASK, lambda v: v, V),
                "a running sum, not a mean": lambda: (NO_MASK, running_sum, V),
                "divided by t + 2": lambda: (NO_MASK, lambda v: running_sum(v) / np.arange(
                    2, v.shape[2] + 2)[:, None], V),
                "without key t itself": lambda: (NO_MASK, means(lambda t, T: range(max(t, 1))), V),
                "one key in the future": lambda: (NO_MASK, means(lambda t, T: range(min(t + 2, T))), V),
                "the future: the causal mask keeps": lambda: (NO_MASK, means(lambda t, T: range(t, T)), V),
                "division by zero": lambda: (NO_MASK, by_t, V),
                # the findings: steps is the exercise's forbidden shortcut, and a wrong
                # first part must not hide the second
                "without steps": lambda: (NO_MASK, with_steps, V),
                "0 of 2 parts right": lambda: (lambda v: v, running_sum, V),
                "read t and the shape from v": lambda: (NO_MASK, hard_coded, V),
                "use its argument v": lambda: (NO_MASK, uses_v_try, V),
                "write them as a function": lambda: (NO_MASK(V), CAUSAL(V), V),
                "forget the `return`": lambda: (lambda v: None, CAUSAL, V),
                # not in the old table: named through relate or the new rows
                "exactly 1/2 of the right one": lambda: (lambda v: NO_MASK(v) / 2, CAUSAL, V),
                "over the queries": lambda: (NO_MASK, normalised_over_queries, V),
                "0 of 8 entries are right": lambda: (median, CAUSAL, V),
                "+1 away from the right one": lambda: (lambda v: NO_MASK(v) + 1, CAUSAL, V),
                "every number of v": lambda: (lambda v: np.full(v.shape, v.mean()), CAUSAL, V),
                "a running mean of v in reverse": lambda: (NO_MASK, lambda v: CAUSAL(v[:, :, ::-1]), V),
                "(and its shape (1, 1, 4, 1)": lambda: (lambda v: v.mean(axis=3, keepdims=True),
                                                        CAUSAL, V),
                "on v_try of shape": lambda: (NO_MASK, lambda v: running_sum(v) / np.arange(
                    1, v.shape[2] + 1), V)},  # (T,) divides the last axis, d_k: shapes clash
         garbage=[lambda: ("v_try.mean()", CAUSAL, V), lambda: (NO_MASK, lambda v: [[1.0, 2.0], [3.0]], V),
                  lambda: (NO_MASK, lambda v: np.zeros((1, 1, 4, 3)), V),
                  lambda: (lambda v: v > 0, CAUSAL, V), lambda: (NO_MASK, "running mean", V)],
         secret=["1/(t + 1)", "/ (t + 1)", "arange(1, v.shape[2] + 1)"]),
]
