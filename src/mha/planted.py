"""Deliberately wrong versions of the steps, kept in one place for lessons and tests.

Each planted bug is a small function with the same signature as the correct step it
imitates, and a docstring saying what is wrong with it. None of them raises: each
returns arrays of the right shape, which is exactly why they are dangerous.

To run the whole module with one bug swapped in, use the context manager:

    with planted.bug("merge_no_transpose"):
        out = mha(x)            # mha.numpy_mha.MultiHeadAttention calls steps.xxx

It temporarily replaces attributes of the `mha.steps` module (which `numpy_mha` calls
as `steps.xxx(...)`) and always restores them, even if the body raises.
`planted.forward_with(mha, name, causal=True)` wraps that into a callable for checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from . import ledger, steps
from .ledger import LedgerRow
from .numpy_mha import LEDGER_LABELS, MultiHeadAttention
from .validate import require_float, require_shape

# Keep the real steps, so a swapped-in bug can still call them while the swap is active.
_softmax = steps.softmax


# 1) Weights used as (out, in) ---------------------------------------------------------
def weights_transposed(x: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """WRONG: x @ W.T + b, treating numpy's (in, out) W as nn.Linear's (out, in) weight.

    With square weights the shape is right, so nothing complains: every projection
    silently uses the transpose of the trained matrix.
    """
    require_float("x", x)
    return x @ W.T + b  # (..., d_in) @ (d_out, d_in).T: only works because W is square


# 2) Split without the transpose -------------------------------------------------------
def split_no_transpose(x: np.ndarray, n_heads: int) -> np.ndarray:
    """WRONG: reshape (B, T, d_model) straight to (B, h, T, d_k), skipping the transpose.

    The shape is right, but "head 0, token 1" now holds the second d_k-slice of token 0:
    tokens and heads are mixed up in memory order.
    """
    require_shape("x", x, (("B", None), ("T", None), ("d_model", None)))
    B, T, d_model = x.shape
    return x.reshape(B, n_heads, T, d_model // n_heads)  # (B, T, d_model) in row-major order


# 3) Scores without the scale ---------------------------------------------------------
def scores_unscaled(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """WRONG: q k^T without dividing by sqrt(d_k); score variance grows like d_k."""
    require_float("q", q)
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    return q @ k.swapaxes(-1, -2)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S), no / sqrt(d_k)


def scores_over_d_k(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """WRONG: q k^T / d_k instead of / sqrt(d_k); scores too small, softmax too flat."""
    require_float("q", q)
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    return (q @ k.swapaxes(-1, -2)) / q.shape[-1]  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)


# 4) Wrong causal masks -------------------------------------------------------------------
def anti_causal_mask(T: int, S: int | None = None) -> np.ndarray:
    """WRONG: np.triu instead of np.tril: each query sees itself and the future, not the past."""
    S = T if S is None else S
    return np.triu(np.ones((T, S), dtype=bool))  # (T, S): the upper-right staircase


def mask_without_diagonal(T: int, S: int | None = None) -> np.ndarray:
    """WRONG: s < t instead of s <= t: no query sees its own token, query 0 sees nothing."""
    S = T if S is None else S
    return np.tril(np.ones((T, S), dtype=bool), k=-1)  # (T, S): diagonal removed


def mask_one_ahead(T: int, S: int | None = None) -> np.ndarray:
    """WRONG: s <= t + 1 instead of s <= t: every query peeks one token into the future."""
    S = T if S is None else S
    return np.tril(np.ones((T, S), dtype=bool), k=1)  # (T, S): one diagonal too many


# 4) Mask applied after softmax ---------------------------------------------------------
def mask_after_softmax(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """WRONG: softmax over all keys, then zero the disallowed weights.

    Same signature as `steps.masked_softmax`. Rows no longer sum to 1, and the
    normaliser of each row still contains exp(score) of future keys, so future
    inputs leak into past outputs.
    """
    weights = _softmax(scores)  # (B, h, T, S), normalised over *all* keys, future included
    return np.where(allowed, weights, np.zeros((), dtype=weights.dtype))  # (B, h, T, S)


# 5) Softmax without the max subtraction ------------------------------------------------
def softmax_no_max(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """WRONG: exp(scores) / sum(exp(scores)) with no row max subtracted.

    Mathematically equal to softmax, but exp overflows to inf for logits above
    ln(max float) = 709.78 (float64) or 88.72 (float32), and inf / inf gives NaN.
    """
    require_float("scores", scores)
    e = np.exp(scores)
    return e / e.sum(axis=axis, keepdims=True)


def softmax_wrong_axis(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """WRONG: normalise over axis -2 (the queries) instead of the keys.

    Each column of the (T, S) weights sums to 1 instead of each row, so a query's
    weights are no longer a probability distribution over the keys.
    """
    return _softmax(scores, axis=-2)  # (B, h, T, S): sums to 1 down each column


# 7) Merge without transposing back -----------------------------------------------------
def merge_no_transpose(x: np.ndarray) -> np.ndarray:
    """WRONG: reshape (B, h, T, d_k) straight to (B, T, d_model), skipping the transpose.

    The shape is right, but each output row now holds pieces of several tokens of one
    head instead of one token's pieces from every head.
    """
    require_shape("x", x, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, T, d_k = x.shape
    return x.reshape(B, T, h * d_k)  # (B, h, T, d_k) read in row-major index order -> (B, T, d_model)


# Swapping a bug into the whole module --------------------------------------------------
def _mask_after_softmax_swaps() -> dict[str, Callable]:
    """Replace apply_mask + softmax so the module zeroes masked weights after normalising."""
    held: list[np.ndarray] = []

    def apply_mask(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        held.append(allowed)  # do not mask now; remember the mask for after softmax
        return scores

    def softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
        if not held:  # no mask was asked for: plain softmax
            return _softmax(scores, axis)
        return mask_after_softmax(scores, held.pop())

    return {"apply_mask": apply_mask, "softmax": softmax}


@dataclass(frozen=True)
class Bug:
    """One planted bug: the `mha.steps` function it imitates, and what is wrong with it."""

    name: str
    step: str  # name of the mha.steps function it replaces (same signature)
    number: int  # the pipeline step (1-7) it breaks
    wrong: str  # one line: what is wrong
    fn: Callable


CATALOGUE: dict[str, Bug] = {b.name: b for b in (
    Bug("weights_transposed", "linear", 1,
        "step 1 with W used as (out, in): x @ W.T + b, silently wrong for square W",
        weights_transposed),
    Bug("split_no_transpose", "split_heads", 2,
        "step 2 reshape straight to (B, h, T, d_k): right shape, tokens and heads mixed",
        split_no_transpose),
    Bug("unscaled_scores", "scaled_scores", 3,
        "step 3 without / sqrt(d_k): scores too large, softmax saturates", scores_unscaled),
    Bug("scores_over_d_k", "scaled_scores", 3,
        "step 3 divided by d_k instead of sqrt(d_k): scores too small, softmax too flat",
        scores_over_d_k),
    Bug("anti_causal_mask", "causal_mask", 4,
        "step 4 with np.triu: queries see the future and not the past", anti_causal_mask),
    Bug("mask_without_diagonal", "causal_mask", 4,
        "step 4 off by one (s < t): no query sees itself, query 0 sees nothing",
        mask_without_diagonal),
    Bug("mask_one_ahead", "causal_mask", 4,
        "step 4 off by one (s <= t + 1): every query peeks one token ahead", mask_one_ahead),
    Bug("mask_after_softmax", "masked_softmax", 4,
        "step 4 after step 5: zeroing weights after softmax breaks causality and rows no "
        "longer sum to 1", mask_after_softmax),
    Bug("softmax_no_max", "softmax", 5,
        "step 5 without subtracting the row max: exp overflows to inf, NaN", softmax_no_max),
    Bug("softmax_wrong_axis", "softmax", 5,
        "step 5 over the wrong axis: columns sum to 1 instead of rows", softmax_wrong_axis),
    Bug("merge_no_transpose", "merge_heads", 7,
        "step 7 reshape without transpose: right shape, wrong values", merge_no_transpose),
)}
"""Every bug `bug(name)` can plant, in pipeline order."""

BUGS: dict[str, str] = {name: b.wrong for name, b in CATALOGUE.items()}
"""Name -> what is wrong, for every bug `bug(name)` can plant."""


def _swaps(name: str) -> dict[str, Callable]:
    """The `mha.steps` attributes to replace for the planted bug `name`."""
    if name not in CATALOGUE:
        raise ValueError(f"unknown planted bug {name!r}; expected one of {sorted(BUGS)}")
    if name == "mask_after_softmax":  # the module calls apply_mask and softmax separately
        return _mask_after_softmax_swaps()
    bug_ = CATALOGUE[name]
    return {bug_.step: bug_.fn}


@contextmanager
def bug(name: str) -> Iterator[None]:
    """Within the `with` block, `mha.steps` (and so MultiHeadAttention) carries bug `name`."""
    swaps = _swaps(name)
    saved = {attr: getattr(steps, attr) for attr in swaps}
    try:
        for attr, fn in swaps.items():
            setattr(steps, attr, fn)
        yield
    finally:
        for attr, fn in saved.items():
            setattr(steps, attr, fn)


def forward_with(module, name: str, **kwargs) -> Callable[[np.ndarray], np.ndarray]:
    """A forward function `x -> module(x, **kwargs)` that runs with bug `name` planted."""
    _swaps(name)  # fail early on an unknown name

    def forward(x: np.ndarray) -> np.ndarray:
        with bug(name):
            return module(x, **kwargs)

    return forward


# Suspects: modules with a hidden bug, for "find the bug" exercises ---------------------------
SUSPECT_FAMILIES: tuple[tuple[str, ...], ...] = (
    ("split_no_transpose", "merge_no_transpose"),  # the causality check fails
    ("mask_after_softmax", "softmax_wrong_axis"),  # rows no longer sum to 1
    ("anti_causal_mask", "mask_without_diagonal", "mask_one_ahead"),  # the heatmap's shape
    ("unscaled_scores", "scores_over_d_k", "softmax_no_max"),  # scale, saturation, overflow
)
"""One suspect's bug is drawn from each family, so every suspect needs a different tool."""


class Suspect(MultiHeadAttention):
    """A MultiHeadAttention whose every forward pass (and trace) runs with one planted bug.

    Which bug is not kept as an attribute: the forward pass and the trace are closures made
    here, so `vars(suspect)` and the repr show a healthy module's fields and nothing else.
    The answer key of an exercise lives with the teacher (A3: in its hidden tests).
    """

    def __init__(self, label: str, bug_name: str, d_model: int = 16, n_heads: int = 4,
                 seed: int = 0):
        _swaps(bug_name)  # fail early on an unknown name
        super().__init__(d_model, n_heads, seed=seed)
        self.label = label
        healthy = MultiHeadAttention

        def forward(x, context=None, causal=False, mask=None) -> np.ndarray:
            """The reference forward pass, run with this suspect's bug planted."""
            with bug(bug_name):
                return healthy.forward(self, x, context=context, causal=causal, mask=mask)

        def trace(x, context=None, causal=False, mask=None) -> list[LedgerRow]:
            """The shape ledger, recorded around the planted step too (nothing gives it away)."""
            with bug(bug_name), ledger.recording(steps, LEDGER_LABELS) as rows:
                healthy.forward(self, x, context=context, causal=causal, mask=mask)
            return ledger.input_rows(x, context) + rows

        self._run = (forward, trace)

    def __repr__(self) -> str:
        return f"Suspect {self.label}: " + super().__repr__()

    def forward(self, x, context=None, causal=False, mask=None) -> np.ndarray:
        """The forward pass, with this suspect's hidden bug."""
        return self._run[0](x, context=context, causal=causal, mask=mask)

    def trace(self, x, context=None, causal=False, mask=None) -> list[LedgerRow]:
        """The shape ledger of the forward pass, with this suspect's hidden bug."""
        return self._run[1](x, context=context, causal=causal, mask=mask)


def _deal(seed: int) -> dict[str, str]:
    """Which bug each suspect A-D carries: one per family, in a seeded order (for the course's
    own tests; graders keep the answer key themselves)."""
    rng = np.random.default_rng(seed)
    picks = [family[int(rng.integers(len(family)))] for family in SUSPECT_FAMILIES]
    order = rng.permutation(len(picks))
    return {"ABCD"[i]: picks[int(j)] for i, j in enumerate(order)}


def suspects(seed: int, d_model: int = 16, n_heads: int = 4) -> dict[str, Suspect]:
    """Four modules A-D, each with the weights of MultiHeadAttention(d_model, n_heads, seed)
    and one hidden planted bug, no two alike (one from each of SUSPECT_FAMILIES)."""
    return {label: Suspect(label, name, d_model, n_heads, seed)
            for label, name in _deal(seed).items()}
