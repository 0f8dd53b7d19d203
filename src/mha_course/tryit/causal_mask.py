"""Self-check for the Try-it of 05_causal_mask.ipynb: a sliding window of 3 built from causal_mask."""

from __future__ import annotations

from typing import Any

import numpy as np

from mha import checks, steps
from mha.attention import masks
from mha.modules import compose
from mha.modules.numpy_mha import MultiHeadAttention
from mha_course.i18n import _
from mha_course.tryit import (
    first_match,
    inverted_match,
    joined,
    mask_verdict,
    not_tried,
    not_yet,
    read_mask,
    refuse_if_reached,
    relate,
    right,
    self_check,
    transposed_match,
)
from mha_course.tryit.attention_from_scratch import weights_not_mask


def _window(T: int, k: int) -> np.ndarray:
    """(T, T) True where t + k <= s <= t: the staircase with keys older than t + k removed."""
    return np.triu(steps.causal_mask(T), k=k)  # (T, S)


def _mistakes(T: int) -> list[tuple[np.ndarray, str]]:
    """The windows students build by mistake, each with what it says about the mistake."""
    stair, ones = steps.causal_mask(T), np.ones((T, T), dtype=bool)  # (T, S) each
    win = _window(T, -2)
    rows = np.arange(T)[:, None]  # (T, 1): the query's position
    return [
        (stair, _("that is the plain causal mask: every key s <= t. The window also drops the "
                  "keys older than t - 2; combine the staircase with one more triangle")),
        (_window(T, -1), _("each row allows 2 keys (t - 1 and t): off by one in k, the window "
                           "keeps t - 2 as well")),
        (_window(T, -3), _("each row allows 4 keys (t - 3 .. t): off by one in k, the window "
                           "stops at t - 2")),
        (_window(T, 2), _("no query may attend to any key (the mask is all False). np.triu with "
                          "a positive k keeps only keys after the query, which the staircase has "
                          "already removed: mind the sign of k; the keys to keep lie *before* t, "
                          "below the diagonal")),
        (win.T, _("the window is transposed: query t sees keys t, t + 1, t + 2, its future. "
                  "Rows are queries and columns keys: keep the staircase of causal_mask(T)")),
        (np.triu(ones, k=-2), _("query 0 may see every later key: np.triu on a matrix of ones "
                                "keeps all future keys. Start from steps.causal_mask(T), which "
                                "has already removed them")),
        (np.tril(stair, k=-2), _("that keeps the old keys s <= t - 2 and drops t - 1 and t: "
                                 "np.tril keeps a diagonal and what lies below it, and the "
                                 "window is the part of the staircase on and above a diagonal")),
        (win & ~np.eye(T, dtype=bool), _("the diagonal is missing: the window includes the "
                                         "query's own key t (keys t - 2, t - 1, t)")),
        (np.triu(ones, k=-2) & np.tril(ones, k=2), _(
            "that window reaches both ways, t - 2 .. t + 2: the two triangles were cut from a "
            "matrix of ones, so query t sees its future; start from the staircase")),
        (np.eye(T, dtype=bool), _("that is the diagonal alone: each query sees only its own "
                                  "key; the window keeps the two keys before it as well")),
        (~stair, _("that is the causal mask inverted (~): True above the diagonal, the future "
                   "keys the staircase blocks")),
        (win & (rows >= 2), _("queries 0 and 1 see no key at all: a slice [t - 2 : t + 1] "
                              "starts at a negative index for them, which numpy reads from the "
                              "end of the row, so the slice is empty; the window of the first "
                              "queries stops at key 0")),
    ]


def _first_future_key(mine: np.ndarray) -> tuple[int, int] | None:
    """(t, s) of the first allowed key in a query's future, or None."""
    future = np.argwhere(mine & ~steps.causal_mask(mine.shape[0]))
    return (int(future[0][0]), int(future[0][1])) if len(future) else None


def _after_module(mine: np.ndarray, T: int) -> str:
    """Run the window through a seeded module: rows still sum to 1, causality still holds."""
    mha = MultiHeadAttention(16, 4, seed=0)
    x = np.random.default_rng(2).normal(size=(1, T, 16))  # (B, T, d_model)
    mha(x, mask=mine)
    rows = checks.check_rows_sum_to_one(mha.attn, atol=1e-12)
    return joined([rows, checks.check_causal(lambda a: mha(a, mask=mine), x, t=min(2, T - 2))])


def _unlisted(mine: np.ndarray, answer: Any, want: np.ndarray) -> str:
    """What a mask that fits no listed mistake does: sees the future, leaves a row empty, ..."""
    said = mask_verdict(answer, want, "my_window")  # inverted, swapped, shifted, too open ...
    if said is not None and np.array_equal(mine, ~want):  # inverted, or 0 and -inf swapped
        return said
    future = _first_future_key(mine)
    if future is not None:
        return joined([_("query {t} may see key {s}, which is in its future: keep the staircase "
                         "of steps.causal_mask(T)").format(t=future[0], s=future[1]), str(said)])
    alone = np.flatnonzero(~mine.diagonal())
    empty = np.flatnonzero(~mine.any(axis=-1))
    if len(empty) and len(alone) < len(mine):
        return joined([_("query {t} may see no key at all, so its row of weights is all zeros: "
                         "every query keeps at least its own key").format(t=int(empty[0])),
                       str(said)])
    if len(alone):
        return joined([_("query {t} may not see its own key ({n} of {T} queries miss it): the "
                         "window includes the query's own key t").format(
            t=int(alone[0]), n=len(alone), T=len(mine)), str(said)])
    t = int(np.argwhere((mine != want).any(axis=1))[0][0])
    n = int(mine[t].sum())
    keys = np.flatnonzero(mine[t]).tolist()
    return joined([str(said), (_("query {t} is the first row that differs from the window: it "
                                 "allows {n} key {keys}") if n == 1 else
                               _("query {t} is the first row that differs from the window: it "
                                 "allows {n} keys {keys}")).format(t=t, n=n, keys=keys)])


_WINDOW_BUILDERS = (masks, compose)  # the package's own window masks


@self_check
def check_window(my_window: Any, T: int = 6) -> str:
    """Say right, or which mistake the (T, T) mask makes: keys t-2, t-1, t allowed, nothing else."""
    if my_window is None:
        return not_tried(_("build the (T, T) boolean mask from steps.causal_mask(T) with one "
                           "more numpy call and put it in `my_window`"))
    if isinstance(my_window, str | bytes) or callable(my_window):
        not_yet(_("my_window must be a ({T}, {T}) boolean array, got {kind} {answer!r:.60}").format(
            T=T, kind=type(my_window).__name__, answer=my_window))
    weights = weights_not_mask(my_window, "my_window", T)
    if weights is not None:
        not_yet(weights)
    mine, convention = read_mask(my_window, "my_window")  # bool, 0/1 or additive, as allowed
    want = _window(T, -2)  # (T, S): t - 2 <= s <= t
    if mine.shape != want.shape:
        not_yet(relate(mine, want, "my_window"))
    if np.array_equal(mine, want):
        refuse_if_reached(_WINDOW_BUILDERS, _("this Try-it asks you to build the window from "
                                              "steps.causal_mask with one more numpy call"))
        if convention == "0/1":
            said = _("keys t-2, t-1, t for every query t (your mask holds 0/1 numbers; the "
                     "module wants booleans, so it was passed as my_window == 1). In the module: "
                     "{checks}")
        elif convention == "additive":
            said = _("keys t-2, t-1, t for every query t (your mask is additive, 0 where "
                     "allowed; the module wants booleans, so it was passed as my_window == 0, not "
                     ".astype(bool), which would invert it). In the module: {checks}")
        else:
            said = _("keys t-2, t-1, t for every query t. In the module: {checks}")
        return right(said.format(checks=_after_module(mine, T)))
    why = first_match(mine, _mistakes(T)) or transposed_match(mine, _mistakes(T)) \
        or inverted_match(mine, _mistakes(T), want)
    not_yet(why if why is not None else _unlisted(mine, my_window, want))
