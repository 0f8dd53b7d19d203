"""The backward pass of multi-head attention, derived by hand: one small function per step.

Shape legend as in `mha.steps`: B batch, T query length, S key length, d_model,
h heads, d_k = d_model // h.

What "the gradient" means here. A backward pass receives dout = dL/dout, shaped like the
output (B, T, d_model), for some scalar loss L, and returns dL/d(everything the forward
read). Every function below is a vector-Jacobian product: with L = sum(out * dout), any dout
is a valid upstream gradient, so the checks use random ones.

Each forward step of `mha.steps` has its backward here, named `<step>_backward`; it takes the
gradient of the step's output first, then what the forward kept. Read bottom-up, as the
backward runs:

    7) linear_backward(dout, merged, Wo)          -> (dmerged, dWo, dbo)  output projection
    7) merge_heads_backward(dmerged, n_heads)     -> (B, h, T, d_k)       the same move as split_heads
    6) weighted_sum_backward(dheads, weights, v)  -> (dweights, dv)
    5) softmax_backward(dweights, weights)        -> dscores              w * (g - sum(w * g))
    4) apply_mask_backward(dscores, allowed)      -> dscores              exactly 0 where masked
    3) scaled_scores_backward(dscores, q, k)      -> (dq, dk)
    2) split_heads_backward(dsplit)               -> (B, T, d_model)      the same move as merge_heads
    1) linear_backward(dq, x, Wq), ... for k, v   -> (dx, dWq, dbq), ...

The step backwards take numpy arrays or torch tensors (one code path). For the numpy module
`mha.numpy_mha.MultiHeadAttention`:

    backward(module, x, dout, context=None, causal=False, mask=None) -> Grads
        re-runs the forward keeping its intermediates (`record_forward`), then walks 7 -> 1.
        Grads holds dx, dWq, dbq, dWk, dbk, dWv, dbv, dWo, dbo and, for cross-attention, dcontext.

Checking gradients:

    finite_difference(f, a, eps=1e-6)          d f() / d a by central differences (float64 only)
    numerical_grads(module, x, dout, ...)      every gradient of the module that way -> Grads
    fd_noise(out, dout, eps=1e-6)              the rounding error of one such difference (an atol)
    relative_error(got, expected)              ||got - expected|| / ||expected||
    check_gradient(name, got, expected, rtol=1e-6, atol=0.0, d_k=None)
        one gradient: a success line, or AssertionError naming the gradient and, where the numbers
        show it (transposed, a constant factor, NaN, all zeros), the likely mistake
    check_step_backward(name, fn, seed=0, own=False)
        a student's step backward on seeded cases (ordinary first, edge cases after) against the
        reference; where it differs, every planted bug of that step runs on the same inputs and
        the one that matches is named: "softmax_backward (step 5): ... [case: ...; matches
        planted bug 'softmax_no_outer_product']". If none matches: "... differs at index (...)
        [case: ...]: yours 0.12, expected 0.43 ...; no known mistake fits."
    check_backward(student_backward, module=None, seed=0)
        a whole backward with backward's signature (returning Grads or a dict with the same
        names) on four cases: plain, causal, a padding mask with fully masked rows, and
        cross-attention with T != S. Names the planted bug whose gradients all match, or the
        first wrong gradient in the order the backward reaches them.
    step_backward(...), backward_diagnosis(...)
        the same verdicts as `mha.diagnose.Diagnosis` objects (.ok, .message, .step, .bug) for
        graders; `.check()` raises AssertionError(message) when not ok.

Why the 1/sqrt(d_k): `score_gradient_norms(d_k, scaled, wrt="scores")` measures ||dL/dscores||
(or ||dL/dq||) per row for unit-variance q and k, with and without the scale (notebook 15 plots it).

Planted wrong gradients, like `mha.planted` for the forward (`BACKWARD_BUGS`: name -> what is
wrong). `with bug(name):` swaps one into `backward`; `backward_with(name)` returns a backward
function carrying it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from . import masks, steps
from .diagnose import Diagnosis
from .numpy_mha import MultiHeadAttention
from .validate import (  # torch is imported lazily
    is_torch,
    require_float,
    require_heads,
    require_shape,
    shape_of,
    torch,
)

Array = Any
"""A numpy array or a torch tensor: the step backwards accept either and return the same kind."""

_REAL_SOFTMAX = steps.softmax  # the cases' weights stay right while a forward bug is planted
_HEADS = (("B", None), ("h", None), ("T", None), ("d_k", None))  # any (B, h, T, d_k)


_is_torch = is_torch


def _like(shape: tuple[int, ...]) -> tuple:
    """An expected shape equal to `shape`, named (B, h, T, S) when it has four dims."""
    return tuple(zip("BhTS", shape, strict=True)) if len(shape) == 4 else shape


# 7) and 1) Linear projection ---------------------------------------------------------------
def linear_backward(dout: Array, x: Array, W: Array) -> tuple[Array, Array, Array]:
    """Gradients of out = x @ W + b: (dx (..., d_in), dW (d_in, d_out), db (d_out,))."""
    require_float("dout", dout)
    require_float("x", x)
    require_shape("W", W, (("d_in", shape_of(x)[-1]), ("d_out", None)))
    d_in, d_out = shape_of(W)
    require_shape("dout", dout, (*shape_of(x)[:-1], ("d_out", d_out)))
    # out_j = sum_i x_i W_ij + b_j: x_i reaches every out_j through W_ij, so the way back is W^T
    dx = dout @ W.T  # (..., d_out) @ (d_out, d_in) -> (..., d_in)
    # One W serves every batch item and token: its gradient sums all of their contributions
    x2 = x.reshape(-1, d_in)  # (N, d_in), N = B * T positions
    g2 = dout.reshape(-1, d_out)  # (N, d_out)
    dW = x2.T @ g2  # (d_in, N) @ (N, d_out) -> (d_in, d_out): the shape of W itself
    db = g2.sum(0)  # (d_out,): b is added at every one of the N positions
    return dx, dW, db


# 2) Split heads -----------------------------------------------------------------------------
def split_heads_backward(dsplit: Array) -> Array:
    """Gradient through split_heads: (B, h, T, d_k) -> (B, T, d_model), the move of merge_heads."""
    require_shape("dsplit", dsplit, _HEADS)
    B, h, T, d_k = shape_of(dsplit)
    # split_heads only moves numbers (reshape, then transpose): each lands in exactly one slot,
    # so its gradient goes back by the inverse move, undone in reverse order
    g = dsplit.swapaxes(1, 2)  # (B, T, h, d_k): undo the transpose first
    return g.reshape(B, T, h * d_k)  # (B, T, d_model): then the reshape


# 3) Scaled scores ---------------------------------------------------------------------------
def scaled_scores_backward(dscores: Array, q: Array, k: Array) -> tuple[Array, Array]:
    """Gradients of scores = q k^T / sqrt(d_k): (dq (B, h, T, d_k), dk (B, h, S, d_k))."""
    require_float("dscores", dscores)
    require_shape("q", q, _HEADS)
    B, h, T, d_k = shape_of(q)
    require_shape("k", k, (("B", B), ("h", h), ("S", None), ("d_k", d_k)))
    S = shape_of(k)[2]
    require_shape("dscores", dscores, (("B", B), ("h", h), ("T", T), ("S", S)))
    # score_ts = q_t . k_s / sqrt(d_k): query t gathers from every key it scored, key s from every
    # query that scored it; the forward's 1/sqrt(d_k) scales both paths back
    dq = (dscores @ k) / math.sqrt(d_k)  # (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
    dk = (dscores.swapaxes(-1, -2) @ q) / math.sqrt(d_k)  # (B,h,S,T) @ (B,h,T,d_k) -> (B,h,S,d_k)
    return dq, dk


# 4) Mask ------------------------------------------------------------------------------------
def apply_mask_backward(dscores: Array, allowed: Array) -> Array:
    """Gradient through apply_mask: dscores where allowed, exactly 0 where masked (B, h, T, S)."""
    require_float("dscores", dscores)
    if str(allowed.dtype) not in ("bool", "torch.bool"):
        raise TypeError(f"allowed must be a boolean array, got dtype {allowed.dtype}")
    try:
        np.broadcast_shapes(shape_of(allowed), shape_of(dscores))
    except ValueError:
        raise ValueError(f"allowed {shape_of(allowed)} must broadcast to dscores "
                         f"{shape_of(dscores)}") from None
    # A masked score was replaced by the constant -inf: the score itself no longer reaches the
    # output, so no gradient flows back to it
    if _is_torch(dscores):
        keep = torch.as_tensor(allowed, device=dscores.device)
        zero = torch.zeros((), dtype=dscores.dtype, device=dscores.device)
        return torch.where(keep, dscores, zero)  # (B, h, T, S)
    return np.where(allowed, dscores, np.zeros((), dtype=dscores.dtype))  # (B, h, T, S)


# 5) Softmax ---------------------------------------------------------------------------------
def softmax_backward(dweights: Array, weights: Array) -> Array:
    """Gradient through softmax over the last axis: w * (g - sum(w * g)), (B, h, T, S)."""
    require_float("weights", weights)
    require_float("dweights", dweights)
    require_shape("dweights", dweights, _like(shape_of(weights)))
    # One row's Jacobian is diag(w) - w w^T (notebook 15). Applied to g it needs no (S, S) matrix:
    # diag(w) g = w * g, and w w^T g = w * (w . g), with w . g one number per row
    wg = (weights * dweights).sum(-1, keepdims=True)  # (B, h, T, 1): w . g of every row
    # A fully masked row has w = 0 everywhere, so it gets 0 (no division, so no NaN)
    return weights * (dweights - wg)  # (B, h, T, S); each row sums to 0


# 6) Weighted sum ----------------------------------------------------------------------------
def weighted_sum_backward(dheads: Array, weights: Array, v: Array) -> tuple[Array, Array]:
    """Gradients of heads = weights @ v: (dweights (B, h, T, S), dv (B, h, S, d_k))."""
    require_float("dheads", dheads)
    require_shape("weights", weights, (("B", None), ("h", None), ("T", None), ("S", None)))
    B, h, T, S = shape_of(weights)
    require_shape("v", v, (("B", B), ("h", h), ("S", S), ("d_k", None)))
    require_shape("dheads", dheads, (("B", B), ("h", h), ("T", T), ("d_k", shape_of(v)[-1])))
    # heads_t = sum_s w_ts v_s: weight w_ts moves heads_t along v_s; value v_s feeds every query t
    dweights = dheads @ v.swapaxes(-1, -2)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    dv = weights.swapaxes(-1, -2) @ dheads  # (B,h,S,T) @ (B,h,T,d_k) -> (B,h,S,d_k)
    return dweights, dv


# 7) Merge heads -----------------------------------------------------------------------------
def merge_heads_backward(dmerged: Array, n_heads: int) -> Array:
    """Gradient through merge_heads: (B, T, d_model) -> (B, h, T, d_k), the move of split_heads."""
    require_shape("dmerged", dmerged, (("B", None), ("T", None), ("d_model", None)))
    B, T, d_model = shape_of(dmerged)
    d_k = require_heads(d_model, n_heads)
    g = dmerged.reshape(B, T, n_heads, d_k)  # (B, T, h, d_k): undo merge's reshape first
    return g.swapaxes(1, 2)  # (B, h, T, d_k): then its transpose


# The whole module ---------------------------------------------------------------------------
GRAD_NAMES = ("dx", "dWq", "dbq", "dWk", "dbk", "dWv", "dbv", "dWo", "dbo", "dcontext")
"""The gradients `backward` returns; dcontext only for cross-attention."""


@dataclass
class Grads:
    """dL/d(every input and weight) of MultiHeadAttention, each shaped like what it differentiates."""

    dx: np.ndarray  # (B, T, d_model)
    dWq: np.ndarray  # (d_model, d_model), numpy's (in, out) layout
    dbq: np.ndarray  # (d_model,)
    dWk: np.ndarray  # (d_model, d_model)
    dbk: np.ndarray  # (d_model,): exactly 0 in exact arithmetic (softmax ignores a row shift)
    dWv: np.ndarray  # (d_model, d_model)
    dbv: np.ndarray  # (d_model,)
    dWo: np.ndarray  # (d_model, d_model)
    dbo: np.ndarray  # (d_model,)
    dcontext: np.ndarray | None = None  # (B, S, d_model), cross-attention only

    def items(self) -> list[tuple[str, np.ndarray]]:
        """(name, array) for every gradient present, in GRAD_NAMES order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) is not None]


@dataclass
class Tape:
    """What the forward made that the backward needs; q (B,h,T,d_k), k and v (B,h,S,d_k)."""

    ctx: np.ndarray  # (B, S, d_model): the context, or x itself for self-attention
    q: np.ndarray  # (B, h, T, d_k)
    k: np.ndarray  # (B, h, S, d_k)
    v: np.ndarray  # (B, h, S, d_k)
    allowed: np.ndarray | None  # broadcasts to (B, h, T, S); None without a mask
    weights: np.ndarray  # (B, h, T, S)
    merged: np.ndarray  # (B, T, d_model)
    out: np.ndarray  # (B, T, d_model)


def record_forward(module: MultiHeadAttention, x: np.ndarray, context: np.ndarray | None = None,
                   causal: bool = False, mask: np.ndarray | None = None) -> Tape:
    """Run module.forward's seven steps again, keeping every intermediate the backward needs."""
    B, T, S = module._check_inputs(x, context)  # the forward's own input errors
    allowed = module.allowed(B, T, S, causal, mask)  # None, or True where query t may see key s
    ctx = x if context is None else context
    h = module.n_heads
    q = steps.split_heads(steps.linear(x, module.Wq, module.bq), h)  # 1-2) (B, h, T, d_k)
    k = steps.split_heads(steps.linear(ctx, module.Wk, module.bk), h)  # (B, h, S, d_k)
    v = steps.split_heads(steps.linear(ctx, module.Wv, module.bv), h)  # (B, h, S, d_k)
    scores = steps.scaled_scores(q, k)  # 3) (B, h, T, S)
    if allowed is not None:
        scores = steps.apply_mask(scores, allowed)  # 4)
    weights = steps.softmax(scores)  # 5) (B, h, T, S)
    merged = steps.merge_heads(steps.weighted_sum(weights, v))  # 6-7) (B, T, d_model)
    out = steps.linear(merged, module.Wo, module.bo)  # 7) (B, T, d_model)
    return Tape(ctx, q, k, v, allowed, weights, merged, out)


def backward(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
             context: np.ndarray | None = None, causal: bool = False,
             mask: np.ndarray | None = None) -> Grads:
    """Gradients of L = sum(module(x, context, causal, mask) * dout) for every input and weight."""
    t = record_forward(module, x, context, causal, mask)  # re-run the forward, keep what it made
    require_float("dout", dout)
    require_shape("dout", dout, tuple(zip(("B", "T", "d_model"), shape_of(t.out), strict=True)))
    dmerged, dWo, dbo = linear_backward(dout, t.merged, module.Wo)  # 7) (B, T, d_model)
    dheads = merge_heads_backward(dmerged, module.n_heads)  # 7) -> (B, h, T, d_k)
    dweights, dv = weighted_sum_backward(dheads, t.weights, t.v)  # 6) (B,h,T,S), (B,h,S,d_k)
    dscores = softmax_backward(dweights, t.weights)  # 5) (B, h, T, S)
    if t.allowed is not None:
        dscores = apply_mask_backward(dscores, t.allowed)  # 4) nothing reaches a masked score
    dq, dk = scaled_scores_backward(dscores, t.q, t.k)  # 3) (B,h,T,d_k), (B,h,S,d_k)
    dq, dk, dv = (split_heads_backward(g) for g in (dq, dk, dv))  # 2) -> (B, T|S, d_model)
    dx, dWq, dbq = linear_backward(dq, x, module.Wq)  # 1) q was read from x ...
    dctx_k, dWk, dbk = linear_backward(dk, t.ctx, module.Wk)  # ... k and v from the context
    dctx_v, dWv, dbv = linear_backward(dv, t.ctx, module.Wv)  # (B, S, d_model), (d, d), (d,)
    dctx = dctx_k + dctx_v  # (B, S, d_model): the context fed two projections, so add both paths
    if context is None:  # self-attention: x fed all three projections, so add all three paths
        dx, dctx = dx + dctx, None
    return Grads(dx, dWq, dbq, dWk, dbk, dWv, dbv, dWo, dbo, dcontext=dctx)


# ---- numerical gradients ---------------------------------------------------------------------
def finite_difference(f: Callable[[], float], a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f() / d a by central differences (f(a + eps) - f(a - eps)) / (2 eps), entry by entry.

    `f` takes no arguments and reads `a` itself (a module's weight, or an input it closes
    over); each entry of `a` is nudged in place and restored. float64 only: the error is
    about eps^2 (truncation) plus 1e-16 / eps (rounding), near 1e-10 at eps = 1e-6, while in
    float32 rounding alone would be about 1e-7 / eps.
    """
    if not isinstance(a, np.ndarray) or a.dtype != np.float64:
        kind = a.dtype if hasattr(a, "dtype") else type(a).__name__
        raise TypeError(f"finite_difference needs a float64 numpy array to nudge, got {kind}: "
                        f"in float32 rounding swamps the difference (use .astype(np.float64))")
    if not (isinstance(eps, float | int) and 0 < eps < 1):
        raise ValueError(f"eps must be a small positive number such as 1e-6, got {eps!r}")
    grad = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        old = a[idx]
        a[idx] = old + eps
        up = float(f())
        a[idx] = old - eps
        down = float(f())
        a[idx] = old  # restore exactly: the next entry sees the original array
        grad[idx] = (up - down) / (2 * eps)
    return grad


def numerical_grads(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
                    context: np.ndarray | None = None, causal: bool = False,
                    mask: np.ndarray | None = None, eps: float = 1e-6) -> Grads:
    """Every gradient `backward` returns, by finite differences of L = sum(out * dout) (float64)."""
    if module.dtype != np.float64:
        raise TypeError(f"numerical_grads needs a float64 module, got {module.dtype}: finite "
                        f"differences in float32 are swamped by rounding")
    x = np.array(x, dtype=np.float64)  # own copies: the nudges must not touch the caller's arrays
    ctx = None if context is None else np.array(context, dtype=np.float64)

    def loss() -> float:
        return float((module.forward(x, context=ctx, causal=causal, mask=mask) * dout).sum())

    params = {name: finite_difference(loss, getattr(module, name[1:]), eps)
              for name in GRAD_NAMES[1:-1]}  # dWq ... dbo: nudge the module's own arrays
    dctx = None if ctx is None else finite_difference(loss, ctx, eps)
    return Grads(dx=finite_difference(loss, x, eps), dcontext=dctx, **params)


def fd_noise(out: np.ndarray, dout: np.ndarray, eps: float = 1e-6) -> float:
    """Rounding error of one central difference of L = sum(out * dout): eps_64 * sum|out*dout| / eps.

    L sums terms of size |out * dout|, each rounded to float64, so L itself is off by about
    eps_machine * sum|out * dout|; dividing two such values' difference by 2 eps gives this bound
    per gradient entry. Use it as the atol for a gradient that is (nearly) zero, such as dbk.
    """
    return float(np.finfo(np.float64).eps * np.abs(np.asarray(out) * np.asarray(dout)).sum() / eps)


def relative_error(got: Array, expected: Array) -> float:
    """||got - expected|| / ||expected|| (Frobenius norms); ||got|| itself if expected is all 0."""
    g, e = np.asarray(_to_numpy(got), np.float64), np.asarray(_to_numpy(expected), np.float64)
    if g.shape != e.shape:
        raise ValueError(f"got {g.shape} and expected {e.shape} must have the same shape")
    scale = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(g - e))
    return diff / scale if scale > 0 else diff


# ---- why the scale: the gradient that reaches the scores ------------------------------------
def score_gradient_norms(d_k: int, scaled: bool = True, wrt: str = "scores", n_rows: int = 8192,
                         S: int = 32, seed: int = 0) -> np.ndarray:
    """||dL/dscores|| (or ||dL/dq||) of n_rows query rows, for unit-variance q, k of width d_k.

    The upstream gradient dL/dweights is unit normal, so the result measures how much of it the
    softmax lets through to its input (`wrt="scores"`), or on to the query (`wrt="q"`); with
    `scaled=False` the scores have variance d_k and the softmax saturates. Returns (n_rows,).
    """
    if wrt not in ("scores", "q"):
        raise ValueError(f"wrt must be 'scores' or 'q', got {wrt!r}")
    rng = np.random.default_rng([seed, require_heads(d_k, 1)])
    shape = (1, max(n_rows // S, 1), S, d_k)  # many independent heads of S queries each
    q, k = rng.normal(size=shape), rng.normal(size=shape)  # (1, H, S, d_k): unit variance
    scale = math.sqrt(d_k) if scaled else 1.0
    scores = (q @ k.swapaxes(-1, -2)) / scale  # (1,H,S,d_k) @ (1,H,d_k,S) -> (1,H,S,S)
    weights = _REAL_SOFTMAX(scores)  # (1, H, S, S)
    dscores = _REAL["softmax_backward"](rng.normal(size=weights.shape), weights)  # (1, H, S, S)
    if wrt == "q":
        dscores = (dscores @ k) / scale  # (1,H,S,S) @ (1,H,S,d_k) -> (1,H,S,d_k): dq
    return np.linalg.norm(dscores, axis=-1).reshape(-1)  # (n_rows,)


# ---- checking one gradient ------------------------------------------------------------------
_ORIGIN = {  # where each gradient comes from: the steps to look at when it is the first wrong one
    "dWo": "step 7, the output projection: dWo = merged^T @ dout, summed over B and T",
    "dbo": "step 7, the output projection: dbo = dout summed over B and T",
    "dWv": "steps 7 -> 6 -> 2 -> 1: merge_heads_backward, dv = weights^T @ dheads, "
           "split_heads_backward, then dWv = context^T @ dv",
    "dbv": "steps 7 -> 6 -> 2 -> 1: dv = weights^T @ dheads, then summed over B and S",
    "dWq": "steps 7 -> 3: through the softmax (5), the mask (4) and the scores (3), then "
           "dWq = x^T @ dq",
    "dbq": "steps 7 -> 3: through the softmax (5), the mask (4) and the scores (3)",
    "dWk": "steps 7 -> 3: through the softmax (5), the mask (4) and the scores (3), then "
           "dWk = context^T @ dk",
    "dbk": "steps 7 -> 3; it is exactly 0: bk adds q_t . bk to every score of row t, and softmax "
           "ignores a shift shared by a whole row",
    "dx": "every step; in self-attention x fed q, k and v, so dx adds the three paths",
    "dcontext": "the k and v paths: dcontext = dk @ Wk^T + dv @ Wv^T",
}


def _to_numpy(a: Any) -> Any:
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        return a.detach().cpu().numpy()
    return a


def _fmt(v: float) -> str:
    return f"{float(v) + 0.0:.4g}"  # + 0.0 turns -0.0 into 0


def _worst(out: np.ndarray, ref: np.ndarray) -> str:
    """'at index (0, 1, 2): yours 0.12, expected 0.43 (the largest difference, 0.31)'."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff)
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    how = ("a NaN or inf where a number belongs" if not np.isfinite(out[idx])
           else f"the largest difference, {_fmt(diff[idx])}")
    return f"at index {idx}: yours {_fmt(out[idx])}, expected {_fmt(ref[idx])} ({how})"


def _factor_hint(c: float, d_k: int | None) -> str:
    """A name for a constant factor between a gradient and the right one."""
    if abs(c + 1) < 1e-3:
        return "the sign is flipped: check each minus sign (softmax's -w (w . g) term)"
    if d_k and abs(c - math.sqrt(d_k)) < 1e-3 * c:
        return f"that is sqrt(d_k) = {math.sqrt(d_k):.4g}: the 1/sqrt(d_k) of the scores is missing"
    if d_k and abs(c * math.sqrt(d_k) - 1) < 1e-3:
        return (f"that is 1/sqrt(d_k) = {1 / math.sqrt(d_k):.4g}: divided by d_k instead of "
                f"sqrt(d_k), or the scale applied twice")
    if 0 < c < 1 and abs(1 / c - round(1 / c)) < 1e-3 * (1 / c):
        return (f"that is 1/{round(1 / c)}: a mean over {round(1 / c)} positions where the "
                f"gradient needs their sum")
    if abs(c - round(c)) < 1e-3 * c and round(c) >= 2:
        return f"an integer: a path added {round(c)} times where it should be added once"
    return "a missing or extra scale factor"


def _relation(g: np.ndarray, e: np.ndarray, d_k: int | None) -> str:
    """The likely mistake, where the numbers show it; '' if they show nothing simple."""
    bad = ~np.isfinite(g) & np.isfinite(e)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{int(bad.sum())} value(s) are NaN or inf, first at index {idx}: a fully masked "
                f"row has all weights 0 and must pass back 0; w * (g - sum(w * g)) needs no division")
    e_norm = float(np.linalg.norm(e))
    if e_norm == 0:
        return ""
    if float(np.linalg.norm(g)) <= 1e-12 * e_norm:
        return ("it is all zeros: no gradient reached it (a mask with the wrong polarity, or a "
                "path dropped)")
    if g.ndim == 2 and g.shape[0] == g.shape[1] and \
            np.allclose(g, e.T, rtol=1e-6, atol=1e-9 * e_norm) and not np.allclose(e, e.T):
        return ("it is the transpose of the right gradient: numpy keeps W as (in, out), so "
                "dW = x^T @ dout (in, out), not dout^T @ x")
    c = float(np.vdot(g, e) / np.vdot(e, e))  # best constant factor, got ~ c * expected
    if np.linalg.norm(g - c * e) <= 1e-6 * np.linalg.norm(g):
        return f"it is {c:.4g} times the right gradient; {_factor_hint(c, d_k)}"
    return ""


def check_gradient(name: str, got: Array, expected: Array, rtol: float = 1e-6, atol: float = 0.0,
                   d_k: int | None = None) -> str:
    """Assert ||got - expected|| <= atol + rtol * ||expected||; else name it and the likely mistake.

    `d_k` (optional) lets a factor of sqrt(d_k) be named. Returns a one-line summary.
    """
    __tracebackhide__ = True
    g = np.asarray(_to_numpy(got))
    e = np.asarray(_to_numpy(expected))
    origin = f" It comes from {_ORIGIN[name]}." if name in _ORIGIN else ""
    if g.shape != e.shape:
        hint = (" It is transposed: a gradient has the shape of its parameter, and numpy keeps W "
                "as (in, out): dW = x^T @ dout." if g.shape == e.shape[::-1] else
                " A gradient has the shape of what it is the gradient of.")
        raise AssertionError(f"{name} should have shape {e.shape}, got {g.shape}.{hint}")
    g64, e64 = g.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = float(np.linalg.norm(g64 - e64))
    scale = float(np.linalg.norm(e64))
    if diff <= atol + rtol * scale:  # False for NaN too
        err = relative_error(g64, e64)
        shown = f"relative error {err:.2g}" if scale > 0 else f"|got - expected| {diff:.2g}"
        return f"{name}: {shown} (allowed {rtol:g} relative" + (f" + {atol:g})" if atol else ")")
    why = _relation(g64, e64, d_k)
    err = f"relative error {diff / scale:.3g}" if scale > 0 else f"|got - expected| = {diff:.3g}"
    raise AssertionError(f"{name} differs from the expected gradient: {err} (allowed {rtol:g}), "
                         f"{_worst(g64, e64)}." + (f" Likely mistake: {why}." if why else "")
                         + origin)


# ---- planted wrong gradients -----------------------------------------------------------------
def linear_dW_transposed(dout: Array, x: Array, W: Array) -> tuple[Array, Array, Array]:
    """WRONG: dW = dout^T @ x, shape (d_out, d_in): the transpose, unnoticed when W is square."""
    dx, _, db = _REAL["linear_backward"](dout, x, W)
    dW = dout.reshape(-1, W.shape[1]).T @ x.reshape(-1, W.shape[0])  # (d_out, N) @ (N, d_in)
    return dx, dW, db


def linear_dx_no_transpose(dout: Array, x: Array, W: Array) -> tuple[Array, Array, Array]:
    """WRONG: dx = dout @ W instead of dout @ W.T (only runs when W is square)."""
    _, dW, db = _REAL["linear_backward"](dout, x, W)
    return dout @ W, dW, db  # (..., d_out) @ (d_in, d_out): needs d_in == d_out


def linear_db_mean(dout: Array, x: Array, W: Array) -> tuple[Array, Array, Array]:
    """WRONG: db is the mean of dout over the B*T positions instead of their sum."""
    dx, dW, _ = _REAL["linear_backward"](dout, x, W)
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
    dweights, _ = _REAL["weighted_sum_backward"](dheads, weights, v)
    return dweights, weights @ dheads


def backward_ignores_mask(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
                          context=None, causal=False, mask=None) -> Grads:
    """WRONG: the backward re-runs the forward without the mask, so masked keys get gradient."""
    return _REAL["backward"](module, x, dout, context=context)


def dx_query_path_only(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
                       context=None, causal=False, mask=None) -> Grads:
    """WRONG: in self-attention dx keeps only the query path; the k and v paths are dropped."""
    if context is not None:
        return _REAL["backward"](module, x, dout, context, causal, mask)
    g = _REAL["backward"](module, x, dout, context=x.copy(), causal=causal, mask=mask)
    g.dcontext = None  # x's k and v paths were computed, then dropped
    return g


@dataclass(frozen=True)
class BackwardBug:
    """One planted wrong gradient: the function it replaces, and what is wrong with it."""

    name: str
    step: str  # the grad function it replaces (same signature); "backward" for whole-pass bugs
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
                "w * (g - sum(w * g, axis=-1))", softmax_no_outer_product),
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

_REAL: dict[str, Callable] = {name: globals()[name] for name in (
    "linear_backward", "split_heads_backward", "scaled_scores_backward", "apply_mask_backward",
    "softmax_backward", "weighted_sum_backward", "merge_heads_backward", "backward")}
"""The reference functions, saved at import: references stay right while a bug is planted."""


@contextmanager
def bug(name: str) -> Iterator[None]:
    """Within the `with` block, `backward` runs with the planted step bug `name` swapped in."""
    if name not in BACKWARD_BUGS:
        raise ValueError(f"unknown planted bug {name!r}; expected one of {sorted(BACKWARD_BUGS)}")
    b = BACKWARD_BUGS[name]
    if b.step == "backward":
        raise ValueError(f"{name!r} replaces the whole backward, not a step: call "
                         f"backward_with({name!r}) instead")
    here = sys.modules[__name__]
    saved = getattr(here, b.step)
    try:
        setattr(here, b.step, b.fn)
        yield
    finally:
        setattr(here, b.step, saved)


def backward_with(name: str) -> Callable[..., Grads]:
    """A function with backward's signature that carries the planted bug `name`."""
    if name not in BACKWARD_BUGS:
        raise ValueError(f"unknown planted bug {name!r}; expected one of {sorted(BACKWARD_BUGS)}")
    b = BACKWARD_BUGS[name]
    if b.step == "backward":
        return b.fn

    def planted_backward(module, x, dout, context=None, causal=False, mask=None) -> Grads:
        with bug(name):
            return _REAL["backward"](module, x, dout, context, causal, mask)

    return planted_backward


# ---- checking a step backward ----------------------------------------------------------------
STEPS: dict[str, tuple[int, tuple[str, ...]]] = {
    "linear_backward": (1, ("dx", "dW", "db")),
    "split_heads_backward": (2, ("dx",)),
    "scaled_scores_backward": (3, ("dq", "dk")),
    "apply_mask_backward": (4, ("dscores",)),
    "softmax_backward": (5, ("dscores",)),
    "weighted_sum_backward": (6, ("dweights", "dv")),
    "merge_heads_backward": (7, ("dheads",)),
}
"""Step backwards `check_step_backward` knows: (pipeline step, names of what they return)."""

Case = tuple[str, tuple]  # (what the case is, positional arguments)


def _step_cases(name: str, rng: np.random.Generator) -> list[Case]:
    """Named input cases for one step backward, ordinary first, edge cases after."""
    n = rng.normal
    if name == "linear_backward":
        return [("dout (2, 5, 12), x (2, 5, 12), W (12, 12)",
                 (n(size=(2, 5, 12)), n(size=(2, 5, 12)), n(size=(12, 12)) / math.sqrt(12))),
                ("dout (2, 5, 20), x (2, 5, 12), W (12, 20)",
                 (n(size=(2, 5, 20)), n(size=(2, 5, 12)), n(size=(12, 20)) / math.sqrt(12)))]
    if name == "split_heads_backward":
        return [("dsplit (2, 3, 5, 4)", (n(size=(2, 3, 5, 4)),)),
                ("dsplit (1, 2, 4, 3)", (n(size=(1, 2, 4, 3)),))]
    if name == "merge_heads_backward":
        return [("dmerged (2, 5, 12), n_heads=3", (n(size=(2, 5, 12)), 3)),
                ("dmerged (1, 4, 8), n_heads=2", (n(size=(1, 4, 8)), 2))]
    if name == "scaled_scores_backward":
        return [("dscores (2, 3, 5, 5), q (2, 3, 5, 16), k (2, 3, 5, 16)",
                 (n(size=(2, 3, 5, 5)), n(size=(2, 3, 5, 16)), n(size=(2, 3, 5, 16)))),
                ("dscores (2, 3, 5, 7), q (2, 3, 5, 16), k (2, 3, 7, 16): T != S",
                 (n(size=(2, 3, 5, 7)), n(size=(2, 3, 5, 16)), n(size=(2, 3, 7, 16))))]
    if name == "apply_mask_backward":
        return [("dscores (2, 3, 5, 5), causal mask (5, 5)",
                 (n(size=(2, 3, 5, 5)), steps.causal_mask(5))),
                ("dscores (2, 3, 5, 5), padding mask (2, 1, 5, 5) with fully masked rows",
                 (n(size=(2, 3, 5, 5)), masks.padding_mask(np.array([5, 3]), 5)))]
    if name == "softmax_backward":
        causal = np.where(steps.causal_mask(5), n(size=(2, 3, 5, 5)), -np.inf)  # (B, h, T, S)
        dead = causal.copy()
        dead[0, 1, 2, :] = -np.inf  # (batch 0, head 1, query 2): nothing to attend to
        return [("ordinary weights (2, 3, 4, 6)",
                 (n(size=(2, 3, 4, 6)), _REAL_SOFTMAX(n(size=(2, 3, 4, 6))))),
                ("peaked weights (scores in the tens)",
                 (n(size=(2, 3, 4, 6)), _REAL_SOFTMAX(10 * n(size=(2, 3, 4, 6))))),
                ("causal weights: exact zeros above the diagonal",
                 (n(size=(2, 3, 5, 5)), _REAL_SOFTMAX(causal))),
                ("a fully masked row (all its weights 0)", (n(size=(2, 3, 5, 5)), _REAL_SOFTMAX(dead)))]
    if name == "weighted_sum_backward":
        return [("dheads (2, 3, 5, 4), weights (2, 3, 5, 5), v (2, 3, 5, 4)",
                 (n(size=(2, 3, 5, 4)), _REAL_SOFTMAX(n(size=(2, 3, 5, 5))), n(size=(2, 3, 5, 4)))),
                ("dheads (2, 3, 5, 4), weights (2, 3, 5, 7), v (2, 3, 7, 4): T != S",
                 (n(size=(2, 3, 5, 4)), _REAL_SOFTMAX(n(size=(2, 3, 5, 7))), n(size=(2, 3, 7, 4))))]
    raise ValueError(f"unknown step {name!r}; expected one of {sorted(STEPS)}")


_T_NE_S = ("This case has T != S: a product that had the right shape only because T == S "
           "needs a transpose (dk = dscores^T @ q, dv = weights^T @ dheads).")
_CASE_HINTS = {  # what a failure with no matching bug most likely means, where the case says it
    "dscores (2, 3, 5, 7), q (2, 3, 5, 16), k (2, 3, 7, 16): T != S": _T_NE_S,
    "dheads (2, 3, 5, 4), weights (2, 3, 5, 7), v (2, 3, 7, 4): T != S": _T_NE_S,
    "dout (2, 5, 20), x (2, 5, 12), W (12, 20)": "W is (12, 20) here, not square: dx = dout @ W.T "
        "is (..., 12) and dW = x^T @ dout is (12, 20), W's own shape.",
    "a fully masked row (all its weights 0)": "A row with every weight 0 must pass back 0, not "
        "NaN: w * (g - sum(w * g, axis=-1)) needs no division.",
    "dscores (2, 3, 5, 5), padding mask (2, 1, 5, 5) with fully masked rows": "allowed is "
        "(B, 1, T, S) here: let it broadcast over the heads, e.g. np.where(allowed, dscores, 0).",
}


def _outputs(out: Any, n: int) -> tuple[tuple[np.ndarray, ...] | None, str | None]:
    """The student's return value as a tuple of n numpy arrays, or a problem to report."""
    if out is None:
        return None, "returned None: did you forget the `return`?"
    items = tuple(out) if isinstance(out, tuple | list) else (out,)
    if len(items) != n:
        return None, f"returned {len(items)} array(s); it must return {n}"
    return tuple(np.asarray(_to_numpy(a)) for a in items), None


def _tolerance(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    if out.dtype == np.float64 and ref.dtype == np.float64:
        return {"rtol": 1e-6, "atol": 1e-9}
    return {"rtol": 1e-4, "atol": 1e-5}


def _same(out: tuple, ref: tuple) -> bool:
    """Same shapes, and values within tolerance (NaN only where the reference has NaN)."""
    if len(out) != len(ref) or any(o.shape != r.shape for o, r in zip(out, ref, strict=True)):
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        return all(bool(np.allclose(o, r, equal_nan=True, **_tolerance(o, r)))
                   for o, r in zip(out, ref, strict=True))


def _call(fn: Callable, args: tuple, n: int):
    """Run fn on copies of args; return (outputs, None) or (None, problem)."""
    copies = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    try:
        with np.errstate(all="ignore"):
            out = fn(*copies)
    except NotImplementedError:
        return None, ("is not written yet (it raises NotImplementedError): replace that line "
                      "with your code")
    except Exception as e:  # a student's code may raise anything: report it, do not crash
        return None, f"raised {type(e).__name__}: {e}"
    return _outputs(out, n)


def _ratio(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out) / np.linalg.norm(ref))


def _sums(a: np.ndarray) -> str:
    return f"up to {float(np.abs(a).max()):.3g}"


def _evidence(bug_name: str, out: tuple, ref: tuple, args: tuple) -> str:
    """One or two sentences: what the student's output shows, measured, and the likely mistake."""
    b = BACKWARD_BUGS[bug_name]
    if bug_name == "softmax_no_outer_product":
        return (f"each row of dscores should sum to 0 (shifting a whole row of scores leaves "
                f"softmax unchanged); yours sum to {_sums(out[0].sum(-1))}. You kept only "
                f"diag(w) of the Jacobian diag(w) - w w^T: return w * (g - sum(w * g, axis=-1, "
                f"keepdims=True)).")
    if bug_name == "softmax_sum_wrong_axis":
        return (f"each row of dscores should sum to 0; yours sum to {_sums(out[0].sum(-1))}. You "
                f"summed w * g over axis -2 (the queries): w . g belongs to one row, so sum over "
                f"the keys, axis=-1.")
    if bug_name == "mask_backward_skipped":
        masked = ~np.broadcast_to(np.asarray(args[1]), out[0].shape)
        got = int((out[0][masked] != 0).sum())
        return (f"{got} masked position(s) (allowed=False) got a gradient. A masked score was "
                f"replaced by -inf and never reaches the output, so its gradient is exactly 0: "
                f"np.where(allowed, dscores, 0).")
    if bug_name == "mask_backward_inverted":
        kept = np.broadcast_to(np.asarray(args[1]), out[0].shape)
        return (f"your gradient is 0 at all {int(kept.sum())} allowed positions and passes "
                f"through at the masked ones: the mask's polarity is flipped. allowed is True "
                f"where a query may attend (nn.MultiheadAttention's masks mean the opposite): "
                f"np.where(allowed, dscores, 0).")
    if bug_name in ("scores_backward_unscaled", "scores_backward_over_d_k"):
        d_k = shape_of(args[1])[-1]
        r = _ratio(out[0], ref[0])
        size = f"{r:.4g} times too large" if r > 1 else f"{1 / r:.4g} times too small"
        why = ("the forward divided q k^T by sqrt(d_k), so both gradients carry 1/sqrt(d_k) too"
               if r > 1 else "divide by sqrt(d_k), not by d_k")
        return f"dq and dk are {size}, and sqrt(d_k) = {math.sqrt(d_k):.4g}: {why}."
    if bug_name == "linear_db_mean":
        n = int(np.prod(shape_of(args[0])[:-1]))
        return (f"db is {1 / _ratio(out[2], ref[2]):.4g} times too small, and B*T = {n}: b is "
                f"added at each of the {n} positions, so db sums dout over them (not the mean).")
    if bug_name == "linear_dW_transposed":
        return ("dW is the transpose of the right gradient: you computed dout^T @ x, shape "
                "(d_out, d_in). numpy keeps W as (d_in, d_out) and a gradient has its "
                "parameter's shape: dW = x^T @ dout, with x and dout flattened to (B*T, d_in) "
                "and (B*T, d_out).")
    if bug_name == "linear_dx_no_transpose":
        return ("dx equals dout @ W. W maps d_in to d_out, so the way back multiplies by its "
                "transpose: dx = dout @ W.T (W is square here, so the shape could not warn you).")
    if bug_name == "scores_backward_dk_no_transpose":
        return ("dk equals dscores @ q, which has the right shape only because T == S here. Key s "
                "collects dscores[t, s] * q_t from every query t that scored it: dk = "
                "dscores.swapaxes(-1, -2) @ q / sqrt(d_k).")
    if bug_name == "weighted_sum_dv_no_transpose":
        return ("dv equals weights @ dheads, which has the right shape only because T == S here. "
                "Value s collects w[t, s] * dheads_t from every query t: dv = "
                "weights.swapaxes(-1, -2) @ dheads.")
    if bug_name == "split_backward_no_transpose":
        return ("right shape, numbers in the wrong places: you reshaped (B, h, T, d_k) straight to "
                "(B, T, d_model). Undo split_heads in reverse order: swapaxes(1, 2) to "
                "(B, T, h, d_k) first, then reshape.")
    if bug_name == "merge_backward_no_transpose":
        return ("right shape, numbers in the wrong places: you reshaped (B, T, d_model) straight to "
                "(B, h, T, d_k). Reshape to (B, T, h, d_k) first, then swapaxes(1, 2).")
    return b.wrong


def _matching_bug(name: str, out: tuple, ref: tuple, args: tuple, passed: list[tuple]) -> str | None:
    """The planted bug of step `name` that gives the student's output here and was right before."""
    n = len(STEPS[name][1])
    for b in BACKWARD_BUGS.values():
        if b.step != name:
            continue
        cand, problem = _call(b.fn, args, n)
        if problem or _same(ref, cand) or not _same(out, cand):
            continue
        earlier = [(_call(b.fn, a, n)[0], _call(_REAL[name], a, n)[0]) for a in passed]
        if all(c is not None and _same(c, r) for c, r in earlier):
            return b.name
    return None


def _shape_problem(name: str, out: tuple, ref: tuple) -> str | None:
    """Which output has the wrong shape, and what the shape says, or None."""
    for label, o, r in zip(STEPS[name][1], out, ref, strict=True):
        if o.shape != r.shape:
            hint = (" It is transposed: a gradient has the shape of its parameter, (d_in, d_out) "
                    "for numpy's W: dW = x^T @ dout." if label == "dW" and o.shape == r.shape[::-1]
                    else " A gradient has the shape of what it is the gradient of.")
            return f"should return {label} of shape {r.shape}, got {o.shape}.{hint}"
    return None


def _judge(name: str, fn: Callable, args: tuple, case: str, passed: list[tuple]) -> Diagnosis | None:
    """None if fn agrees with the reference on args, else the Diagnosis of how it differs."""
    number, labels = STEPS[name]
    where = f"{name} (step {number})"
    ref, _ = _call(_REAL[name], args, len(labels))
    out, problem = _call(fn, args, len(labels))
    if problem:
        if problem.startswith("returned") and "must return" in problem:
            problem += " (" + ", ".join(labels) + ")"
        hint = _CASE_HINTS.get(case, "")
        return Diagnosis(name, False, f"{where} {problem} [case: {case}]" +
                         (f". {hint}" if hint else ""), number)
    shape = _shape_problem(name, out, ref)
    if shape:
        return Diagnosis(name, False, f"{where} {shape} [case: {case}]", number)
    if _same(out, ref):
        return None
    found = _matching_bug(name, out, ref, args, passed)
    if found:
        return Diagnosis(name, False, f"{where}: {_evidence(found, out, ref, args)} "
                         f"[case: {case}; matches planted bug '{found}']", number, found)
    label, o, r = next((lab, o, r) for lab, o, r in zip(labels, out, ref, strict=True)
                       if not _same((o,), (r,)))
    what = f"{label} " if len(labels) > 1 else ""
    hint = _CASE_HINTS.get(case, "")
    return Diagnosis(name, False, f"{where}: {what}differs {_worst(o, r)} [case: {case}]; no known "
                     f"mistake fits." + (f" {hint}" if hint else ""), number)


def _step_name(name: str) -> str:
    """Accept 'softmax' as well as 'softmax_backward'."""
    full = name if name.endswith("_backward") else f"{name}_backward"
    if full not in STEPS:
        raise ValueError(f"unknown step {name!r}; expected one of {sorted(STEPS)}")
    return full


def step_backward(name: str, fn: Callable, seed: int = 0, own: bool = False) -> Diagnosis:
    """Run a student's version of `mha.grad.<name>` on seeded cases and say what is wrong.

    With `own=True`, the package's own function (or an alias of it) does not count.
    """
    name = _step_name(name)
    number = STEPS[name][0]
    module = getattr(fn, "__module__", "") or ""
    if own and (module == "mha" or module.startswith("mha.")):
        return Diagnosis(name, False, f"{name} is {module}.{getattr(fn, '__name__', name)} from "
                         f"the package: write your own version (the reference is what it is "
                         f"checked against)", number)
    cases = _step_cases(name, np.random.default_rng(seed))
    passed: list[tuple] = []
    for case, args in cases:
        verdict = _judge(name, fn, args, case, passed)
        if verdict is not None:
            return verdict
        passed.append(args)
    names = tuple(c for c, _ in cases)
    return Diagnosis(name, True, f"{name} (step {number}) matches the reference on {len(cases)} "
                     f"case(s): " + "; ".join(names), number, cases=names)


def check_step_backward(name: str, fn: Callable, seed: int = 0, own: bool = False) -> str:
    """`step_backward(...).check()`: the success line, or AssertionError naming step and mistake."""
    __tracebackhide__ = True
    return step_backward(name, fn, seed, own).check()


# ---- checking a whole backward ---------------------------------------------------------------
_CHAIN = ("dWo", "dbo", "dWv", "dbv", "dWq", "dbq", "dWk", "dbk", "dx", "dcontext")
"""Gradients in the order the backward reaches them: the first wrong one points at a step."""


def default_module(d_model: int = 8, n_heads: int = 2, seed: int = 0) -> MultiHeadAttention:
    """A small float64 MultiHeadAttention with nonzero biases (zero biases hide bias mistakes)."""
    m = MultiHeadAttention(d_model, n_heads, seed=seed)
    rng = np.random.default_rng(seed + 1)
    m.bq, m.bk, m.bv, m.bo = (rng.normal(0.0, 0.5, d_model) for _ in range(4))
    return m


def backward_cases(module: MultiHeadAttention, seed: int = 0) -> list[tuple[str, dict]]:
    """Named keyword arguments for backward: plain, causal, padding with fully masked rows, cross."""
    rng = np.random.default_rng(seed)
    d = module.d_model

    def arr(*shape):
        return rng.normal(size=shape).astype(module.dtype)

    x, dout = arr(2, 5, d), arr(2, 5, d)
    return [
        ("self-attention, no mask", dict(x=x, dout=dout)),
        ("causal self-attention", dict(x=x, dout=dout, causal=True)),
        ("padding mask, lengths [5, 3]: two fully masked query rows",
         dict(x=x, dout=dout, mask=masks.padding_mask(np.array([5, 3]), 5))),
        ("cross-attention T=5, S=7, key lengths [7, 4]",
         dict(x=x, dout=dout, context=arr(2, 7, d),
              mask=masks.padding_mask(np.array([5, 5]), 5, 7, kv_lengths=np.array([7, 4])))),
    ]


def _as_grads(out: Any) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """The student's Grads or dict as {name: numpy array}, or a problem to report."""
    if out is None:
        return None, "returned None: did you forget the `return`?"
    if isinstance(out, Mapping):
        got = dict(out)
    elif all(hasattr(out, n) for n in GRAD_NAMES[:-1]):
        got = {n: getattr(out, n, None) for n in GRAD_NAMES}
    else:
        return None, (f"returned {type(out).__name__}; return a grad.Grads or a dict with keys "
                      f"{', '.join(GRAD_NAMES[:-1])} (and dcontext for cross-attention)")
    return {k: np.asarray(_to_numpy(v)) for k, v in got.items() if v is not None}, None


def _grads_same(out: dict, ref: Grads) -> bool:
    return all(n in out and _same((out[n],), (r,)) for n, r in ref.items())


def _run(fn: Callable, module, kw: dict) -> tuple[dict | None, str | None]:
    try:
        with np.errstate(all="ignore"):
            out = fn(module, **kw)
    except NotImplementedError:
        return None, "is not written yet (it raises NotImplementedError)"
    except Exception as e:  # a student's code may raise anything: report it, do not crash
        return None, f"raised {type(e).__name__}: {e}"
    return _as_grads(out)


def _matching_backward_bug(out: dict, ref: Grads, module, kw: dict,
                           passed: list[dict]) -> BackwardBug | None:
    """The planted bug whose gradients all equal the student's here, and the reference's before."""
    for b in BACKWARD_BUGS.values():
        planted = backward_with(b.name)
        cand, problem = _run(planted, module, kw)
        if problem or _grads_same(cand, ref) or not all(
                n in cand and _same((out[n],), (cand[n],)) for n, _ in ref.items()):
            continue
        if all(_grads_same(_run(planted, module, p)[0] or {}, _REAL["backward"](module, **p))
               for p in passed):
            return b
    return None


def _judge_backward(student: Callable, module, case: str, kw: dict,
                    passed: list[dict]) -> Diagnosis | None:
    """None if the student's backward agrees with the reference on this case, else why not."""
    ref = _REAL["backward"](module, **kw)
    out, problem = _run(student, module, kw)
    if problem:
        hint = "" if not (passed and "context" in kw) else (
            f" Your backward ran on the self-attention cases; this one has a context (S = "
            f"{shape_of(kw['context'])[1]} keys, T = {shape_of(kw['x'])[1]} queries): read k and "
            f"v from the context, return dcontext, and look for a product that had the right "
            f"shape only while T == S (dk = dscores^T @ q, dv = weights^T @ dheads).")
        return Diagnosis("backward", False, f"backward {problem} [case: {case}].{hint}")
    missing = [n for n, _ in ref.items() if n not in out]
    if missing:
        return Diagnosis("backward", False, f"backward returned no {', '.join(missing)} [case: "
                         f"{case}]: return every gradient of {', '.join(GRAD_NAMES[:-1])}" +
                         (", and dcontext for cross-attention" if "dcontext" in missing else ""))
    if _grads_same(out, ref):
        return None
    refs = dict(ref.items())
    wrong = [n for n in _CHAIN if n in refs and not _same((out[n],), (refs[n],))]
    right = [n for n in _CHAIN if n in refs and n not in wrong]
    first = wrong[0]  # the first wrong one the backward reaches: its steps are the suspects
    if out[first].shape != refs[first].shape:
        try:
            check_gradient(first, out[first], refs[first])
        except AssertionError as e:
            return Diagnosis("backward", False, f"backward [case: {case}]: {e}")
    summary = (f"backward differs from the reference [case: {case}]: wrong {', '.join(wrong)}; "
               f"right {', '.join(right) or 'none'}. The first wrong one the backward reaches is "
               f"{first} (relative error {relative_error(out[first], refs[first]):.3g})")
    b = _matching_backward_bug(out, ref, module, kw, passed)
    if b:
        where = "the whole pass" if b.step == "backward" else b.step
        return Diagnosis("backward", False, f"{summary}. Every gradient equals a backward with a "
                         f"planted mistake in {where} (step {b.number}): {b.wrong} [matches "
                         f"planted bug '{b.name}']", b.number, b.name)
    why = _relation(out[first].astype(np.float64), refs[first], module.d_k)
    return Diagnosis("backward", False, f"{summary}, {_worst(out[first], refs[first])}; no known "
                     f"mistake fits." + (f" The numbers say: {why}." if why else "") +
                     f" {first} comes from {_ORIGIN[first]}: check those steps with "
                     f"grad.check_step_backward.")


def backward_diagnosis(student: Callable, module: MultiHeadAttention | None = None,
                       seed: int = 0) -> Diagnosis:
    """Compare a whole backward (backward's signature) with the reference; name the bug it matches."""
    module = default_module() if module is None else module
    cases = backward_cases(module, seed)
    passed: list[dict] = []
    for case, kw in cases:
        verdict = _judge_backward(student, module, case, kw, passed)
        if verdict is not None:
            return verdict
        passed.append(kw)
    names = tuple(c for c, _ in cases)
    return Diagnosis("backward", True, f"backward matches the reference on {len(cases)} cases: "
                     + "; ".join(names), cases=names)


def check_backward(student: Callable, module: MultiHeadAttention | None = None,
                   seed: int = 0) -> str:
    """`backward_diagnosis(...).check()`: the success line, or AssertionError saying what is wrong."""
    __tracebackhide__ = True
    return backward_diagnosis(student, module, seed).check()
