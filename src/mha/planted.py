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

import numpy as np

from . import steps
from .validate import require_float, require_shape

# Keep the real steps, so a swapped-in bug can still call them while the swap is active.
_softmax = steps.softmax


# 3) Scores without the scale ---------------------------------------------------------
def scores_unscaled(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """WRONG: q k^T without dividing by sqrt(d_k); score variance grows like d_k."""
    require_float("q", q)
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    return q @ k.swapaxes(-1, -2)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S), no / sqrt(d_k)


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

    Mathematically equal to softmax, but exp overflows to inf for logits above ~709
    (float64) or ~88 (float32), and inf / inf gives NaN.
    """
    require_float("scores", scores)
    e = np.exp(scores)
    return e / e.sum(axis=axis, keepdims=True)


# 7) Merge without transposing back -----------------------------------------------------
def merge_no_transpose(x: np.ndarray) -> np.ndarray:
    """WRONG: reshape (B, h, T, d_k) straight to (B, T, d_model), skipping the transpose.

    The shape is right, but each output row now holds pieces of several tokens of one
    head instead of one token's pieces from every head.
    """
    require_shape("x", x, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, T, d_k = x.shape
    return x.reshape(B, T, h * d_k)  # (B, h, T, d_k) read in memory order -> (B, T, d_model)


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


BUGS: dict[str, str] = {
    "unscaled_scores": "step 3 without / sqrt(d_k): scores too large, softmax saturates",
    "mask_after_softmax": "step 4 after step 5: zeroing weights after softmax breaks "
                          "causality and rows no longer sum to 1",
    "softmax_no_max": "step 5 without subtracting the row max: exp overflows to inf, NaN",
    "merge_no_transpose": "step 7 reshape without transpose: right shape, wrong values",
}
"""Name -> what is wrong, for every bug `bug(name)` can plant."""


def _swaps(name: str) -> dict[str, Callable]:
    """The `mha.steps` attributes to replace for the planted bug `name`."""
    if name == "unscaled_scores":
        return {"scaled_scores": scores_unscaled}
    if name == "mask_after_softmax":
        return _mask_after_softmax_swaps()
    if name == "softmax_no_max":
        return {"softmax": softmax_no_max}
    if name == "merge_no_transpose":
        return {"merge_heads": merge_no_transpose}
    raise ValueError(f"unknown planted bug {name!r}; expected one of {sorted(BUGS)}")


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
