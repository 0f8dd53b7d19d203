"""Self-check for the Try-it of 05_causal_mask.ipynb: a sliding window of 3 built from causal_mask."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import checks, steps
from ..numpy_mha import MultiHeadAttention
from . import NotYet, as_array, not_tried, not_yet, right


def _window(T: int, k: int) -> np.ndarray:
    """(T, T) True where t + k <= s <= t: the staircase with keys older than t + k removed."""
    return np.triu(steps.causal_mask(T), k=k)  # (T, S)


def _mistakes(T: int) -> list[tuple[np.ndarray, str]]:
    """The windows students build by mistake, each with what it says about the mistake."""
    stair, ones = steps.causal_mask(T), np.ones((T, T), dtype=bool)  # (T, S) each
    win = _window(T, -2)
    return [
        (stair, "that is the plain causal mask: every key s <= t. The window also drops the keys "
                "older than t - 2; combine the staircase with one more triangle"),
        (_window(T, -1), "each row allows 2 keys (t - 1 and t): off by one in k, the window keeps "
                         "t - 2 as well"),
        (_window(T, -3), "each row allows 4 keys (t - 3 .. t): off by one in k, the window stops "
                         "at t - 2"),
        (_window(T, 2), "no query may attend to any key: np.triu(..., k=+2) keeps s >= t + 2, "
                        "which the staircase has already removed. The sign of k: keys *before* t "
                        "are s = t - 1, t - 2, so k = -2"),
        (win.T, "the window is transposed: query t sees keys t, t + 1, t + 2, its future. "
                "Rows are queries and columns keys: keep the staircase of causal_mask(T)"),
        (np.triu(ones, k=-2), "query 0 may see every later key: np.triu(..., k=-2) on a matrix of "
                              "ones keeps all future keys. Start from steps.causal_mask(T), which "
                              "has already removed them"),
        (np.tril(stair, k=-2), "that keeps the old keys s <= t - 2 and drops t - 1 and t: "
                               "np.tril where np.triu is needed (the window keeps s >= t - 2)"),
        (win & ~np.eye(T, dtype=bool), "the diagonal is missing: the window includes the query's "
                                       "own key t (keys t - 2, t - 1, t)"),
    ]


def _first_future_key(mine: np.ndarray) -> tuple[int, int] | None:
    """(t, s) of the first allowed key in a query's future, or None."""
    future = np.argwhere(mine & ~steps.causal_mask(mine.shape[0]))
    return (int(future[0][0]), int(future[0][1])) if len(future) else None


def _as_mask(answer: Any, T: int, want: np.ndarray) -> np.ndarray:
    """The answer as a (T, T) boolean mask, or NotYet (a 0/1 int mask gets its own message)."""
    if isinstance(answer, str | bytes):
        not_yet(f"my_window must be a ({T}, {T}) boolean array, got text {answer!r}")
    try:
        return as_array(answer, "my_window", shape=(T, T), kind="bool")
    except NotYet as err:
        if "dtype" in str(err) and np.array_equal(np.asarray(answer), want):  # readable, (T, T)
            not_yet(f"the right pattern, but as {np.asarray(answer).dtype} 0/1: the module needs a "
                    f"boolean mask (True = may attend), so write .astype(bool)")
        raise


def _after_module(mine: np.ndarray, T: int) -> str:
    """Run the window through a seeded module: rows still sum to 1, causality still holds."""
    mha = MultiHeadAttention(16, 4, seed=0)
    x = np.random.default_rng(2).normal(size=(1, T, 16))  # (B, T, d_model)
    mha(x, mask=mine)
    rows = checks.check_rows_sum_to_one(mha.attn, atol=1e-12)
    return f"{rows}; {checks.check_causal(lambda a: mha(a, mask=mine), x, t=min(2, T - 2))}"


def check_window(my_window: Any, T: int = 6) -> str:
    """Say right, or which mistake the (T, T) mask makes: keys t-2, t-1, t allowed, nothing else."""
    if my_window is None:
        return not_tried("build the (T, T) boolean mask from steps.causal_mask(T) with one more "
                         "numpy call and put it in `my_window`")
    want = _window(T, -2)  # (T, S): t - 2 <= s <= t
    mine = _as_mask(my_window, T, want)
    if np.array_equal(mine, want):
        return right(f"keys t-2, t-1, t for every query t. In the module: {_after_module(mine, T)}")
    for wrong, why in _mistakes(T):
        if np.array_equal(mine, wrong):
            not_yet(why)
    future = _first_future_key(mine)
    if future is not None:
        not_yet(f"query {future[0]} may see key {future[1]}, which is in its future: keep the "
                f"staircase of steps.causal_mask(T)")
    t = int(np.argwhere((mine != want).any(axis=1))[0][0])
    n = int(mine[t].sum())
    not_yet(f"query {t} is the first row that differs from the window: it allows {n} "
            f"key{'s' * (n != 1)} {np.flatnonzero(mine[t]).tolist()}; the window allows keys "
            f"t - 2, t - 1 and t, where they exist")
