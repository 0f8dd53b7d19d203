"""Deliberately wrong versions of the steps, kept in one place for lessons and tests.

Each planted bug is a small function with the same signature as the correct step it
imitates, and a docstring saying what is wrong with it. None of them raises: each
returns arrays of the right shape, which is exactly why they are dangerous.

To run the whole module with one bug swapped in, use the context manager:

    with planted.bug("merge_no_transpose"):
        out = mha(x)            # mha.modules.numpy_mha.MultiHeadAttention calls steps.xxx

It temporarily replaces attributes of the `mha.steps` module (which `numpy_mha` calls
as `steps.xxx(...)`) and always restores them, even if the body raises.
`planted.forward_with(mha, name, causal=True)` wraps that into a callable for checks.

The backward's planted bugs (`BACKWARD_BUGS`, wrong versions of `mha.training.grad`'s step backwards
and two whole-pass mistakes) swap nothing: `backward_steps(name)` is grad.REFERENCE_STEPS with
one field replaced, passed to `grad.backward(..., steps=...)` explicitly, and
`backward_with(name)` returns a function with grad.backward's signature that does so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from mha import ledger, steps
from mha.ledger import LedgerRow
from mha.modules.numpy_mha import LEDGER_LABELS, MultiHeadAttention
from mha.training import grad
from mha.training.grad import Array
from mha.validate import require_float, require_shape, shape_of

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


# The backward's planted bugs (15_backward_pass.ipynb, A5): wrong versions of `mha.training.grad`'s steps ----------
# They call the reference through grad.REFERENCE_STEPS and `_backward`, bound at import, so a
# grader's diagnose.refusing(grad, ...) never reaches them.
_REF = grad.REFERENCE_STEPS
_backward = grad.backward


def linear_dW_transposed(dout: Array, x: Array, W: Array) -> tuple[Array, Array, Array]:
    """WRONG: dW = dout^T @ x, shape (d_out, d_in): the transpose, unnoticed when W is square."""
    dx, _, db = _REF.linear_backward(dout, x, W)
    dW = dout.reshape(-1, W.shape[1]).T @ x.reshape(-1, W.shape[0])  # (d_out, N) @ (N, d_in)
    return dx, dW, db


def linear_dx_no_transpose(dout: Array, x: Array, W: Array) -> tuple[Array, Array, Array]:
    """WRONG: dx = dout @ W instead of dout @ W.T (only runs when W is square)."""
    _, dW, db = _REF.linear_backward(dout, x, W)
    return dout @ W, dW, db  # (..., d_out) @ (d_in, d_out): needs d_in == d_out


def linear_db_mean(dout: Array, x: Array, W: Array) -> tuple[Array, Array, Array]:
    """WRONG: db is the mean of dout over the B*T positions instead of their sum."""
    dx, dW, _ = _REF.linear_backward(dout, x, W)
    return dx, dW, dout.reshape(-1, W.shape[1]).mean(0)  # (d_out,), N times too small


def split_backward_no_transpose(dsplit: Array) -> Array:
    """WRONG: reshape (B, h, T, d_k) straight to (B, T, d_model): right shape, numbers misplaced."""
    B, h, T, d_k = shape_of(dsplit)
    return dsplit.reshape(B, T, h * d_k)  # row-major order mixes heads and tokens


def merge_backward_no_transpose(dmerged: Array, n_heads: int) -> Array:
    """WRONG: reshape (B, T, d_model) straight to (B, h, T, d_k): right shape, numbers misplaced."""
    B, T, d_model = shape_of(dmerged)
    return dmerged.reshape(B, n_heads, T, d_model // n_heads)


def scores_backward_unscaled(dscores: Array, q: Array, k: Array) -> tuple[Array, Array]:
    """WRONG: dq = dscores @ k and dk = dscores^T @ q without the forward's 1/sqrt(d_k)."""
    return dscores @ k, dscores.swapaxes(-1, -2) @ q  # (B,h,T,d_k), (B,h,S,d_k)


def scores_backward_over_d_k(dscores: Array, q: Array, k: Array) -> tuple[Array, Array]:
    """WRONG: divides by d_k instead of sqrt(d_k): sqrt(d_k) times too small."""
    d_k = shape_of(q)[-1]
    return (dscores @ k) / d_k, (dscores.swapaxes(-1, -2) @ q) / d_k


def scores_backward_dk_no_transpose(dscores: Array, q: Array, k: Array) -> tuple[Array, Array]:
    """WRONG: dk = dscores @ q instead of dscores^T @ q (only runs when T == S)."""
    d_k = shape_of(q)[-1]
    return (dscores @ k) / math.sqrt(d_k), (dscores @ q) / math.sqrt(d_k)


def mask_backward_skipped(dscores: Array, allowed: Array) -> Array:
    """WRONG: passes dscores through unchanged, so masked positions get gradient."""
    return dscores


def mask_backward_inverted(dscores: Array, allowed: Array) -> Array:
    """WRONG: the mask's polarity flipped: gradient only where masked, none where allowed."""
    return np.where(allowed, np.zeros((), dtype=dscores.dtype), dscores)


def softmax_no_outer_product(dweights: Array, weights: Array) -> Array:
    """WRONG: w * g, the Jacobian's diag(w) only; the -w w^T term is dropped."""
    return weights * dweights


def softmax_sum_wrong_axis(dweights: Array, weights: Array) -> Array:
    """WRONG: sums w * g over axis -2 (the queries) instead of -1 (the keys of each row)."""
    return weights * (dweights - (weights * dweights).sum(-2, keepdims=True))


def weighted_sum_dv_no_transpose(dheads: Array, weights: Array, v: Array) -> tuple[Array, Array]:
    """WRONG: dv = weights @ dheads instead of weights^T @ dheads (only runs when T == S)."""
    dweights, _ = _REF.weighted_sum_backward(dheads, weights, v)
    return dweights, weights @ dheads


def backward_ignores_mask(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
                          context=None, causal=False, mask=None) -> grad.Grads:
    """WRONG: the backward re-runs the forward without the mask, so masked keys get gradient."""
    return _backward(module, x, dout, context=context)


def dx_query_path_only(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
                       context=None, causal=False, mask=None) -> grad.Grads:
    """WRONG: in self-attention dx keeps only the query path; the k and v paths are dropped."""
    if context is not None:
        return _backward(module, x, dout, context, causal, mask)
    g = _backward(module, x, dout, context=x.copy(), causal=causal, mask=mask)
    g.dcontext = None  # x's k and v paths were computed, then dropped
    return g


@dataclass(frozen=True)
class BackwardBug:
    """One planted wrong gradient: the grad function it replaces, and what is wrong with it."""

    name: str
    step: str  # the grad.BackwardSteps field it replaces (same signature); "backward": whole pass
    number: int  # the pipeline step (1-7) it breaks
    wrong: str  # one line: what is wrong, and the fix
    fn: Callable


BACKWARD_BUGS: dict[str, BackwardBug] = {b.name: b for b in (
    BackwardBug("linear_dW_transposed", "linear_backward", 1,
                "dW = dout^T @ x is the transpose (d_out, d_in); numpy's W is (d_in, d_out): "
                "dW = x^T @ dout", linear_dW_transposed),
    BackwardBug("linear_dx_no_transpose", "linear_backward", 1,
                "dx = dout @ W; the way back through W is its transpose: dx = dout @ W.T",
                linear_dx_no_transpose),
    BackwardBug("linear_db_mean", "linear_backward", 1,
                "db averaged over the B*T positions; b is added at each of them, so db is "
                "their sum", linear_db_mean),
    BackwardBug("split_backward_no_transpose", "split_heads_backward", 2,
                "split_heads_backward reshapes without swapping h and T back first: "
                "swapaxes(1, 2), then reshape", split_backward_no_transpose),
    BackwardBug("scores_backward_unscaled", "scaled_scores_backward", 3,
                "dq and dk without the forward's 1/sqrt(d_k): sqrt(d_k) times too large",
                scores_backward_unscaled),
    BackwardBug("scores_backward_over_d_k", "scaled_scores_backward", 3,
                "dq and dk divided by d_k instead of sqrt(d_k): sqrt(d_k) times too small",
                scores_backward_over_d_k),
    BackwardBug("scores_backward_dk_no_transpose", "scaled_scores_backward", 3,
                "dk = dscores @ q; key s collects from every query that scored it: "
                "dk = dscores^T @ q", scores_backward_dk_no_transpose),
    BackwardBug("mask_backward_skipped", "apply_mask_backward", 4,
                "masked positions pass gradient; a score replaced by -inf never reaches the "
                "output, so its gradient is 0", mask_backward_skipped),
    BackwardBug("mask_backward_inverted", "apply_mask_backward", 4,
                "the mask's polarity flipped: allowed scores get 0 and masked ones the gradient; "
                "allowed is True where a query may attend (nn.MultiheadAttention's masks are the "
                "opposite)", mask_backward_inverted),
    BackwardBug("softmax_no_outer_product", "softmax_backward", 5,
                "w * g keeps only diag(w) of the Jacobian diag(w) - w w^T; the fix: "
                "w * (g - sum(w * g, axis=-1, keepdims=True))", softmax_no_outer_product),
    BackwardBug("softmax_sum_wrong_axis", "softmax_backward", 5,
                "sum(w * g) taken over axis -2 (the queries); it runs over the keys of each "
                "row: axis=-1", softmax_sum_wrong_axis),
    BackwardBug("weighted_sum_dv_no_transpose", "weighted_sum_backward", 6,
                "dv = weights @ dheads; value s collects from every query that used it: "
                "dv = weights^T @ dheads", weighted_sum_dv_no_transpose),
    BackwardBug("merge_backward_no_transpose", "merge_heads_backward", 7,
                "merge_heads_backward reshapes straight to (B, h, T, d_k): reshape to "
                "(B, T, h, d_k), then swapaxes(1, 2)", merge_backward_no_transpose),
    BackwardBug("backward_ignores_mask", "backward", 4,
                "the backward re-runs the forward without the mask, so masked keys get "
                "weight and gradient: use the forward's mask in the backward too",
                backward_ignores_mask),
    BackwardBug("dx_query_path_only", "backward", 1,
                "dx keeps only the query path; in self-attention x also made k and v: "
                "dx = dx_q + dx_k + dx_v", dx_query_path_only),
)}
"""Every planted wrong gradient, in pipeline order."""


def _backward_bug(name: str) -> BackwardBug:
    """The planted backward bug `name`, or ValueError listing the known ones."""
    if name not in BACKWARD_BUGS:
        raise ValueError(f"unknown planted bug {name!r}; expected one of {sorted(BACKWARD_BUGS)}")
    return BACKWARD_BUGS[name]


def backward_steps(name: str) -> grad.BackwardSteps:
    """grad.REFERENCE_STEPS with the planted step bug `name` in its step's place."""
    b = _backward_bug(name)
    if b.step == "backward":
        raise ValueError(f"{name!r} replaces the whole backward, not a step: call "
                         f"backward_with({name!r}) instead")
    return dataclasses.replace(_REF, **{b.step: b.fn})


def backward_with(name: str) -> Callable[..., grad.Grads]:
    """A function with grad.backward's signature that carries the planted bug `name`."""
    b = _backward_bug(name)
    if b.step == "backward":
        return b.fn
    planted_steps = backward_steps(name)

    def planted_backward(module, x, dout, context=None, causal=False, mask=None) -> grad.Grads:
        """grad.backward with one planted step backward, passed explicitly."""
        return _backward(module, x, dout, context, causal, mask, steps=planted_steps)

    return planted_backward
