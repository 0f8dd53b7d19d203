"""Self-check for the Try-it of 07_weighted_sum.ipynb: outputs of equal scores, without and with a mask."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import steps
from . import as_array, first_match, not_tried, not_yet, right

ATOL = 1e-12


def lesson_v() -> np.ndarray:
    """The lesson's v_try: (B, h, S, d_k) = (1, 1, 4, 2), seeded."""
    return np.random.default_rng(7).normal(size=(1, 1, 4, 2))


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
    shared = [(by_features, "you averaged over d_k (the last axis, the features of one value "
                            "row): the weights mix value rows, so the mean runs over the keys, "
                            "axis 2")]
    if not causal:
        return shared + [
            (v, "each output is its own value row v_t: that is a weight of 1 on the query's own "
                "key. Equal scores give every key the same weight"),
            (np.broadcast_to(v.sum(axis=2, keepdims=True), v.shape),
             f"that sums the value rows: {T} equal weights are 1/{T} each, so it is their mean"),
            (_want(v, True), "that is the running mean, the causal answer: without a mask every "
                             "query sees all the keys"),
        ]
    return shared + [
        (every, "that is the no-mask answer (every output the mean of all value rows): it "
                "ignores the mask, under which query t sees only keys 0..t"),
        (v, "each output is its own value row v_t alone: under the causal mask query t sees "
            "keys 0..t, all of them with the same score"),
        (np.cumsum(v, axis=2), "a running sum, not a mean: row t adds t + 1 value rows with "
                               "weight 1/(t + 1) each"),
        (np.cumsum(v, axis=2) / (counts + 1), "divided by t + 2: off by one, query t sees t + 1 "
                                              "keys (0..t, itself included)"),
        (_means(v, lambda t: slice(0, max(t, 1))),
         "the mean of the keys before t, without key t itself: off by one, the causal mask "
         "allows s <= t"),
        (_means(v, lambda t: slice(0, t + 2)), "the mean of keys 0..t+1: off by one, one key in "
                                               "the future"),
        (_means(v, lambda t: slice(t, T)), "the mean of keys t..T-1, the future: the causal mask "
                                           "keeps the past, keys 0..t"),
    ]


def _judge(label: str, answer: Any, v: np.ndarray, causal: bool) -> None:
    """Return if `answer` is this part's output; else NotYet naming the mistake."""
    want = _want(v, causal)
    if isinstance(answer, str | bytes):
        not_yet(f"({label}) write the outputs as a numpy array of shape {want.shape}, got text "
                f"{answer!r}")
    name = "my_no_mask" if label == "no mask" else "my_causal"
    got = as_array(answer, name).astype(np.float64)
    if got.shape != want.shape:
        if got.shape in ((*want.shape[:2], 1, want.shape[3]), (want.shape[3],)) and not causal \
                and np.allclose(got.reshape(-1), want[0, 0, 0], rtol=0, atol=ATOL):
            not_yet(f"(no mask) the right mean, but one row of shape {got.shape} for all queries: "
                    f"broadcast it to v_try's shape {want.shape}, one output per query")
        not_yet(f"({label}) the outputs must have v_try's shape {want.shape} (B, h, T, d_k), got "
                f"shape {got.shape}")
    if np.allclose(got, want, rtol=0, atol=ATOL):
        return
    if not np.isfinite(got).all():
        row = int(np.argwhere(~np.isfinite(got))[0][2])
        count = ("query t sees t + 1 keys under the causal mask (count from 1, not 0)" if causal
                 else f"every query sees all {v.shape[2]} keys")
        not_yet(f"({label}) row {row} is inf or NaN: a division by zero? {count}")
    why = first_match(got, _mistakes(v, causal), atol=ATOL)
    if why is not None:
        not_yet(f"({label}) {why}")
    t = int(np.argmax(np.abs(got - want).max(axis=(0, 1, 3))))  # the query furthest off
    not_yet(f"({label}) query {t} is furthest from the expected output (by "
            f"{float(np.abs(got - want)[:, :, t].max()):.3g}): with equal scores each key the "
            f"query may see gets weight 1 / (the number of those keys)")


def check_uniform(my_no_mask: Any, my_causal: Any, v: np.ndarray | None = None) -> str:
    """Say right, or what each answer misses: equal scores make each output a mean of value rows."""
    v = lesson_v() if v is None else np.asarray(v, dtype=np.float64)
    if my_no_mask is None and my_causal is None:
        return not_tried("write both outputs as numpy expressions of v_try, `my_no_mask` and "
                         "`my_causal`, each of v_try's shape (B, h, T, d_k)")
    for label, answer, causal in (("no mask", my_no_mask, False), ("causal", my_causal, True)):
        if answer is not None:
            _judge(label, answer, v, causal)
    if my_causal is None or my_no_mask is None:
        return not_tried(f"`my_{'causal' if my_causal is None else 'no_mask'}` is still None: "
                         f"write it too")
    T = v.shape[2]
    return right(f"with equal scores every output is a plain average of the value rows it may see: "
                 f"without a mask the mean of all {T}, with the causal mask the running mean "
                 f"v_0..v_t (as steps.weighted_sum(steps.masked_softmax(zeros, mask), v) gives)")
