"""The backward pass of multi-head attention, derived by hand: one small function per step.

Shapes as in `mha.steps` (B, T, S, d_model, h, d_k). A backward receives dout = dL/dout
(B, T, d_model) and returns dL/d(everything the forward read); with L = sum(out * dout) any
dout is a valid upstream gradient. Each step has its backward here, a vector-Jacobian product
named `<step>_backward` (numpy or torch, one code path): the gradient of the step's output
first, then what the forward kept. `backward(module, x, dout, ..., *, steps=REFERENCE_STEPS)`
re-runs the forward keeping its intermediates (`record_forward`), then walks 7 -> 1 with the
step backwards in `steps`, a `BackwardSteps` (a planted bug replaces one field) -> `Grads`.
`finite_difference` and `numerical_grads` are the independent reference, `check_gradient`
compares and names the likely mistake, `score_gradient_norms` measures why 1/sqrt(d_k) matters.
Planted wrong gradients live in `mha_course.planted`, the checks that name them in `mha_course.diagnose.backward`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from mha import steps as fwd  # the forward's steps; `steps` below names a BackwardSteps
from mha.attention.numpy_attention import attention
from mha.modules.numpy_mha import MultiHeadAttention
from mha.validate import is_torch, require_float, require_heads, require_shape, shape_of, torch

Array = Any
"""A numpy array or a torch tensor: the step backwards accept either and return the same kind."""

_HEADS = (("B", None), ("h", None), ("T", None), ("d_k", None))  # any (B, h, T, d_k)


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
    if is_torch(dscores):
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
    # One row's Jacobian is diag(w) - w w^T (15_backward_pass.ipynb). Applied to g it needs no (S, S) matrix:
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
@dataclass(frozen=True)
class BackwardSteps:
    """The step backwards `backward` calls, passed explicitly (a planted bug replaces one)."""

    linear_backward: Callable  # 7) and 1)
    split_heads_backward: Callable  # 2)
    scaled_scores_backward: Callable  # 3)
    apply_mask_backward: Callable  # 4)
    softmax_backward: Callable  # 5)
    weighted_sum_backward: Callable  # 6)
    merge_heads_backward: Callable  # 7)


REFERENCE_STEPS = BackwardSteps(linear_backward, split_heads_backward, scaled_scores_backward,
                                apply_mask_backward, softmax_backward, weighted_sum_backward,
                                merge_heads_backward)
"""The step backwards above. A planted bug: dataclasses.replace(REFERENCE_STEPS, softmax_backward=f)."""

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
    if extra := module.options.describe(module.n_heads):  # GQA, RoPE, ALiBi, window: not derived
        raise ValueError(f"grad.backward differentiates plain multi-head attention; this module "
                         f"has {extra} (build it without them)")
    B, T, S = module._check_inputs(x, context, mask)  # the forward's own input errors
    allowed = module.allowed(B, T, S, causal, mask)  # None, or True where query t may see key s
    ctx = x if context is None else context
    h = module.n_heads
    q = fwd.split_heads(fwd.linear(x, module.Wq, module.bq), h)  # 1-2) (B, h, T, d_k)
    k = fwd.split_heads(fwd.linear(ctx, module.Wk, module.bk), h)  # (B, h, S, d_k)
    v = fwd.split_heads(fwd.linear(ctx, module.Wv, module.bv), h)  # (B, h, S, d_k)
    heads, weights = attention(q, k, v, mask=allowed)  # 3-6) (B, h, T, d_k), (B, h, T, S)
    merged = fwd.merge_heads(heads)  # 7) (B, T, d_model)
    out = fwd.linear(merged, module.Wo, module.bo)  # 7) (B, T, d_model)
    return Tape(ctx, q, k, v, allowed, weights, merged, out)


def core_backward(dheads: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  weights: np.ndarray, allowed: np.ndarray | None = None, *,
                  steps: BackwardSteps = REFERENCE_STEPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 6 back to 3 from the forward's saved weights (B, h, T, S): -> (dq, dk, dv) of the core.

    dheads (B, h, T, d_v) is the gradient at the core's output; q (B, h, T, d_k), k (B, h, S, d_k),
    v (B, h, S, d_v) and `allowed` (None or broadcasting to (B, h, T, S)) are the forward's.
    """
    dweights, dv = steps.weighted_sum_backward(dheads, weights, v)  # 6) (B,h,T,S), (B,h,S,d_v)
    dscores = steps.softmax_backward(dweights, weights)  # 5) (B, h, T, S)
    if allowed is not None:
        dscores = steps.apply_mask_backward(dscores, allowed)  # 4) nothing reaches a masked score
    dq, dk = steps.scaled_scores_backward(dscores, q, k)  # 3) (B,h,T,d_k), (B,h,S,d_k)
    return dq, dk, dv


def backward(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
             context: np.ndarray | None = None, causal: bool = False,
             mask: np.ndarray | None = None, *, steps: BackwardSteps = REFERENCE_STEPS) -> Grads:
    """Gradients of L = sum(module(x, context, causal, mask) * dout) for every input and weight."""
    if not isinstance(steps, BackwardSteps):
        raise TypeError(f"steps must be a grad.BackwardSteps, e.g. dataclasses.replace("
                        f"grad.REFERENCE_STEPS, softmax_backward=f), got {type(steps).__name__}")
    t = record_forward(module, x, context, causal, mask)  # re-run the forward, keep what it made
    require_float("dout", dout)
    require_shape("dout", dout, tuple(zip(("B", "T", "d_model"), shape_of(t.out), strict=True)))
    dmerged, dWo, dbo = steps.linear_backward(dout, t.merged, module.Wo)  # 7) (B, T, d_model)
    dheads = steps.merge_heads_backward(dmerged, module.n_heads)  # 7) -> (B, h, T, d_k)
    dq, dk, dv = core_backward(dheads, t.q, t.k, t.v, t.weights, t.allowed, steps=steps)  # 6-3)
    dq, dk, dv = (steps.split_heads_backward(g) for g in (dq, dk, dv))  # 2) -> (B, T|S, d_model)
    dx, dWq, dbq = steps.linear_backward(dq, x, module.Wq)  # 1) q was read from x ...
    dctx_k, dWk, dbk = steps.linear_backward(dk, t.ctx, module.Wk)  # ... k and v from the context
    dctx_v, dWv, dbv = steps.linear_backward(dv, t.ctx, module.Wv)  # (B, S, d_model), (d, d), (d,)
    dctx = dctx_k + dctx_v  # (B, S, d_model): the context fed two projections, so add both paths
    if context is None:  # self-attention: x fed all three projections, so add all three paths
        dx, dctx = dx + dctx, None
    return Grads(dx, dWq, dbq, dWk, dbk, dWv, dbv, dWo, dbo, dcontext=dctx)


# ---- numerical gradients ---------------------------------------------------------------------
def finite_difference(f: Callable[[], float], a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f() / d a by central differences (f(a + eps) - f(a - eps)) / (2 eps), entry by entry.

    `f` takes no arguments and reads `a` itself (a module's weight, or an input it closes
    over); each entry is nudged in place and restored, even when f raises. float64 only: the
    error is about eps^2 + 1e-16 / eps (near 1e-10 at eps = 1e-6); float32 rounds to 1e-7 / eps.
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
        try:
            a[idx] = old + eps
            up = float(f())
            a[idx] = old - eps
            down = float(f())
        finally:
            a[idx] = old  # restore exactly: the next entry (and the caller) sees the original
        grad[idx] = (up - down) / (2 * eps)
    return grad


def numerical_grads(module: MultiHeadAttention, x: np.ndarray, dout: np.ndarray,
                    context: np.ndarray | None = None, causal: bool = False,
                    mask: np.ndarray | None = None, eps: float = 1e-6) -> Grads:
    """Every gradient `backward` returns, by finite differences of L = sum(out * dout) (float64)."""
    if module.dtype != np.float64:
        raise TypeError(f"numerical_grads needs a float64 module, got {module.dtype}: finite "
                        f"differences in float32 are swamped by rounding")
    B, T, _ = module._check_inputs(x, context, mask)  # before any weight is nudged
    require_float("dout", dout)
    require_shape("dout", dout, (("B", B), ("T", T), ("d_model", module.d_model)))
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

    L itself is off by about eps_machine * sum|out * dout|; dividing by 2 eps gives this bound per
    entry. Use it as the atol for a gradient that is (nearly) zero, such as dbk.
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

    dL/dweights is unit normal, so this measures how much of it the softmax lets through to its
    input (`wrt="scores"`) or on to q (`wrt="q"`); unscaled, the scores have variance d_k.
    """
    if wrt not in ("scores", "q"):
        raise ValueError(f"wrt must be 'scores' or 'q', got {wrt!r}")
    rng = np.random.default_rng([seed, require_heads(d_k, 1)])
    shape = (1, max(n_rows // S, 1), S, d_k)  # many independent heads of S queries each
    q, k = rng.normal(size=shape), rng.normal(size=shape)  # (1, H, S, d_k): unit variance
    scale = math.sqrt(d_k) if scaled else 1.0
    scores = (q @ k.swapaxes(-1, -2)) / scale  # (1,H,S,d_k) @ (1,H,d_k,S) -> (1,H,S,S)
    weights = fwd.softmax(scores)  # (1, H, S, S)
    dscores = softmax_backward(rng.normal(size=weights.shape), weights)  # (1, H, S, S)
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
    """A torch tensor as a numpy array; anything else unchanged."""
    return a.detach().cpu().numpy() if is_torch(a) else a


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
    """Assert ||got - expected|| <= atol + rtol * ||expected||, else name the likely mistake.

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
