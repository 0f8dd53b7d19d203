"""The on-ramp: attention as a soft dictionary lookup, one head, heads one by one, a running mean.

Small pure numpy functions for the first lesson, before the seven steps. They are built from
`mha.steps`, so what the lesson shows is what the module computes. Besides the package legend
(B batch, T query length, S key length, d_model, h heads, d_k = d_model // h), a lookup uses
    d    width of a query and of a key,        d_v  width of a value,
with  query (d,) or (T, d),  keys (S, d),  values (S,) or (S, d_v).

    on_circle(degrees, radius)               (n, 2)        points on a circle: toy word vectors
    lookup_weights(query, keys, temperature) (S,)|(T, S)   softmax(query . keys / temperature)
    soft_lookup(query, keys, values, ...)    (d_v,)|(T, d_v)  the weighted average of the values
    exact_lookup(query, keys, values)        (d_v,)|(T, d_v)  the value of the best key alone
    single_head(x, Wq, Wk, Wv, ...)          (B, T, d_v), (B, T, T)   one head, own projections
    heads_one_by_one(module, x, causal)      (B, T, d_model), (B, h, T, T)   a loop over heads
    running_mean_weights(T)                  (T, T)        row t: 1/(t+1) on keys 0..t
    check_running_mean(weights)              a named check that names the usual mistakes
    check_permutation_equivariance(forward, x, perm)   shuffled tokens in, shuffled outputs out
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mha import steps
from mha.validate import require_float, require_int, require_shape, require_tokens, shape_of


# ---- toy word vectors --------------------------------------------------------------------------
def on_circle(degrees: Any, radius: float = 1.0) -> np.ndarray:
    """Points at the given angles on a circle of `radius`: (n,) degrees -> (n, 2) float64."""
    deg = np.asarray(degrees, dtype=np.float64)
    if deg.ndim != 1:
        raise ValueError(f"degrees must be a 1-D list of angles (n,), got shape {deg.shape}")
    rad = np.deg2rad(deg)  # (n,)
    return float(radius) * np.stack([np.cos(rad), np.sin(rad)], axis=-1)  # (n, 2)


# ---- the soft dictionary lookup ----------------------------------------------------------------
def _check_temperature(temperature: Any) -> float:
    """The temperature as a float, if it is a finite number > 0."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | np.number):
        raise TypeError(f"temperature must be a number > 0, got {type(temperature).__name__} "
                        f"{temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    return float(temperature)


def _check_lookup(query: Any, keys: Any, values: Any = None) -> None:
    """query (d,) or (T, d), keys (S, d) and values (S,) or (S, d_v), all floating point."""
    require_float("query", query)
    if query.ndim not in (1, 2):
        raise ValueError(f"query must be (d,) or (T, d), got {shape_of(query)}")
    require_float("keys", keys)
    require_shape("keys", keys, (("S", None), ("d", query.shape[-1])))
    if values is not None:
        require_float("values", values)
        if values.ndim not in (1, 2) or values.shape[0] != keys.shape[0]:
            raise ValueError(f"values must be (S={keys.shape[0]},) or (S={keys.shape[0]}, d_v), "
                             f"one row per key, got {shape_of(values)}")


def lookup_weights(query: np.ndarray, keys: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """How much each key answers the query: softmax(query . keys / temperature), (S,) or (T, S)."""
    _check_lookup(query, keys)
    tau = _check_temperature(temperature)
    scores = query @ keys.T  # (T, d) @ (d, S) -> (T, S), or (d,) @ (d, S) -> (S,)
    # Dividing by the temperature before softmax: small tau magnifies the gaps between scores
    # (towards one-hot), large tau shrinks them (towards uniform). Softmax runs over the keys.
    return steps.softmax(scores / tau)  # (T, S) or (S,): each query's weights sum to 1


def soft_lookup(query: np.ndarray, keys: np.ndarray, values: np.ndarray,
                temperature: float = 1.0) -> np.ndarray:
    """Read a blend of the values, weighted by how well each key matches the query."""
    _check_lookup(query, keys, values)
    w = lookup_weights(query, keys, temperature)  # (T, S) or (S,)
    return w @ values  # (T, S) @ (S, d_v) -> (T, d_v); (S,) @ (S,) -> a number


def exact_lookup(query: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Read the value of the single best-matching key (largest query . key), with no blending.

    Ties go to the first of the tied keys (np.argmax); the soft lookup's cold limit splits
    the weight evenly between tied keys instead.
    """
    _check_lookup(query, keys, values)
    scores = query @ keys.T  # (T, S) or (S,)
    best = np.argmax(scores, axis=-1)  # (T,) or (): index of the best key for each query
    return values[best]  # (T, d_v) / (T,) or (d_v,) / a number


# ---- one head, and h heads one at a time -------------------------------------------------------
def single_head(x: np.ndarray, Wq: np.ndarray, Wk: np.ndarray, Wv: np.ndarray,
                bq: np.ndarray | None = None, bk: np.ndarray | None = None,
                bv: np.ndarray | None = None, causal: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
    """One attention head with its own projections: returns (out (B, T, d_v), weights (B, T, T)).

    Wq, Wk are (d_model, d_k), Wv is (d_model, d_v); biases default to zeros.
    """
    require_float("x", x)
    require_shape("x", x, (("B", None), ("T", None), ("d_model", None)))
    d_model, T = x.shape[2], x.shape[1]
    require_shape("Wq", Wq, (("d_model", d_model), ("d_k", None)))
    require_shape("Wk", Wk, (("d_model", d_model), ("d_k", Wq.shape[1])))
    require_shape("Wv", Wv, (("d_model", d_model), ("d_v", None)))

    def bias(b: np.ndarray | None, W: np.ndarray) -> np.ndarray:
        return np.zeros(W.shape[1], dtype=x.dtype) if b is None else b

    q = steps.linear(x, Wq, bias(bq, Wq))  # (B, T, d_k): what each token asks for
    k = steps.linear(x, Wk, bias(bk, Wk))  # (B, T, d_k): what each token can be found by
    v = steps.linear(x, Wv, bias(bv, Wv))  # (B, T, d_v): what each token hands over
    # A head axis of size 1 lets the package steps, written for (B, h, T, d_k), run one head.
    scores = steps.scaled_scores(q[:, None], k[:, None])  # (B,1,T,d_k) @ (B,1,d_k,T) -> (B,1,T,T)
    allowed = steps.causal_mask(T) if causal else None  # (T, T) or None
    weights = steps.masked_softmax(scores, allowed)  # (B, 1, T, T): rows sum to 1
    out = steps.weighted_sum(weights, v[:, None])  # (B, 1, T, T) @ (B, 1, T, d_v) -> (B, 1, T, d_v)
    return out[:, 0], weights[:, 0]  # (B, T, d_v), (B, T, T): drop the single-head axis


def heads_one_by_one(module: Any, x: np.ndarray, causal: bool = False
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention as a Python loop: head j is `single_head` on columns j*d_k:(j+1)*d_k.

    Returns (out (B, T, d_model), weights (B, h, T, T)); equals `module(x, causal=causal)`
    and `module.attn` without ever splitting or merging an array of heads.
    """
    require_tokens("x", x, module.d_model)
    d_k = module.d_k
    outs, maps = [], []
    for j in range(module.n_heads):
        cols = slice(j * d_k, (j + 1) * d_k)  # head j owns these columns of Wq, Wk, Wv and biases
        out_j, w_j = single_head(x, module.Wq[:, cols], module.Wk[:, cols], module.Wv[:, cols],
                                 module.bq[cols], module.bk[cols], module.bv[cols], causal=causal)
        outs.append(out_j)  # (B, T, d_k)
        maps.append(w_j)  # (B, T, T)
    concat = np.concatenate(outs, axis=-1)  # h x (B, T, d_k) -> (B, T, d_model), head j in cols
    out = steps.linear(concat, module.Wo, module.bo)  # (B, T, d_model): mixes the heads
    return out, np.stack(maps, axis=1)  # (B, T, d_model), (B, h, T, T)


# ---- a running mean is attention ---------------------------------------------------------------
def running_mean_weights(T: int) -> np.ndarray:
    """(T, T) float64 weights, row t = 1/(t+1) on keys 0..t: W @ x is the running mean of x."""
    allowed = steps.causal_mask(T)  # (T, T): True where key s <= query t
    counts = allowed.sum(axis=-1, keepdims=True)  # (T, 1): row t may see t + 1 keys
    return allowed / counts  # (T, T): 1/(t+1) where allowed, exactly 0 elsewhere


def _diagnose_running_mean(w: np.ndarray, atol: float) -> str:
    """Name the usual mistake that turns the running-mean weights w (T, T) into what they are."""
    T = w.shape[0]
    tril = np.tril(np.ones((T, T), dtype=bool))  # (T, T): built here, not from mha.steps
    row = np.arange(1, T + 1)[:, None]  # (T, 1): t + 1
    strict = np.tril(np.ones((T, T), dtype=bool), k=-1)  # (T, T): s < t
    n_strict = np.maximum(strict.sum(-1, keepdims=True), 1)  # (T, 1), row 0 has no key
    candidates = [
        (np.full((T, T), 1.0 / T),
         "the causal mask is missing: every row averages all T tokens, later ones included "
         f"(row 0 gives key {T - 1} weight 1/{T} instead of 0); mask the scores before softmax"),
        (np.where(tril, 1.0 / T, 0.0),
         "the mask was applied after the softmax: row t keeps 1/T on each allowed key, so it "
         "sums to (t+1)/T, not 1; set masked scores to -inf before softmax instead"),
        (np.where(tril.T, 1.0 / (T - np.arange(T))[:, None], 0.0),
         "the triangle is flipped (np.triu): row t averages keys t..T-1, the future; "
         "the running mean needs the lower triangle, keys s <= t"),
        (np.where(strict, 1.0 / n_strict, 0.0),
         "the diagonal is masked (s < t instead of s <= t): token t is left out of its own "
         "mean and row 0 sees nothing"),
        (np.tril(np.ones((T, T)), k=1) / np.minimum(row + 1, T),
         "the mask is off by one (s <= t + 1): every token peeks one token ahead, so row t "
         "averages keys 0..t+1"),
        (np.where(tril, 1.0 / (T - np.arange(T))[None, :], 0.0),
         "the softmax ran over the wrong axis (the queries): each column sums to 1 instead "
         "of each row; normalise over the keys, the last axis"),
    ]
    for want, why in candidates:
        if np.allclose(w, want, rtol=0.0, atol=atol):
            return why
    ref = np.where(tril, 1.0 / row, 0.0)  # (T, T)
    t = int(np.argmax(np.abs(w - ref).max(axis=-1)))  # the worst row
    return (f"row {t} should be 1/{t + 1} on keys 0..{t} and 0 after, got "
            f"{np.array2string(w[t], precision=3, suppress_small=True)}")


def check_running_mean(weights: Any, atol: float = 1e-12) -> str:
    """Assert weights (T, T) are a running mean (row t: 1/(t+1) on keys 0..t), else name the bug."""
    __tracebackhide__ = True  # pytest and IPython show the caller's line
    w = np.asarray(weights)
    require_float("weights", w)
    require_shape("weights", w, (("T", None), ("S", w.shape[0] if w.ndim == 2 else None)))
    T = require_int("T", w.shape[0])
    w = w.astype(np.float64)
    ref = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # (T, T), independent of steps
    err = float(np.abs(w - ref).max()) if np.isfinite(w).all() else math.inf
    if not err <= atol:
        raise AssertionError(f"not a running mean (max deviation {err:.3g}, atol {atol:g}): "
                             f"{_diagnose_running_mean(w, 1e-9)}")
    return (f"running mean: row t spreads 1/(t+1) over keys 0..t and gives later keys 0 "
            f"(T={T}, within {atol:g})")


# ---- attention cannot tell order ---------------------------------------------------------------
def check_permutation_equivariance(forward: Callable[[np.ndarray], Any], x: np.ndarray,
                                   perm: Any = None, atol: float = 1e-12, seed: int = 0) -> str:
    """Assert forward(x[:, perm]) == forward(x)[:, perm]: shuffling the tokens shuffles the outputs.

    `forward` maps x (B, T, d_model) to (B, T, d_out). `perm` is an order of 0..T-1 (default:
    a seeded shuffle that moves at least one token). The control case fails the check if
    shuffling the outputs changes nothing, since then it would prove nothing.
    """
    __tracebackhide__ = True
    require_float("x", x)
    require_shape("x", x, (("B", None), ("T", None), ("d_model", None)))
    T = int(x.shape[1])
    if T < 2:
        raise ValueError(f"x must hold T >= 2 tokens so that there is an order to change, "
                         f"got T={T}")
    if perm is None:
        perm = np.random.default_rng(seed).permutation(T)
        if (perm == np.arange(T)).all():
            perm = np.roll(perm, 1)  # a shuffle that moved nothing would test nothing
    perm = np.asarray(perm)
    if perm.shape != (T,) or not np.array_equal(np.sort(perm), np.arange(T)):
        raise ValueError(f"perm must be an order of the T={T} positions 0..{T - 1}, each once, "
                         f"got {perm.tolist()}")
    out = np.asarray(forward(x))  # (B, T, d_out)
    shuffled_then_run = np.asarray(forward(x[:, perm]))  # (B, T, d_out): tokens shuffled first
    run_then_shuffled = out[:, perm]  # (B, T, d_out): outputs shuffled after
    if np.array_equal(run_then_shuffled, out):
        raise AssertionError(
            f"control case failed: shuffling the outputs with perm {perm.tolist()} changed "
            f"nothing (every token gets the same output?), so equivariance would prove nothing")
    gap = np.abs(shuffled_then_run - run_then_shuffled).max(axis=(0, 2))  # (T,): per position
    if not float(gap.max()) <= atol:
        worst = int(np.argmax(gap))
        raise AssertionError(
            f"not permutation-equivariant: with the tokens shuffled by perm {perm.tolist()}, "
            f"the output at position {worst} differs from the shuffled output by "
            f"{float(gap[worst]):.3g} (atol {atol:g}), so the layer depends on where a token "
            f"sits. Likely causes: a causal (or other position-based) mask, positional "
            f"encodings, or a reshape that mixes tokens (split or merge heads without the "
            f"transpose)")
    return (f"permutation-equivariant: forward(x[:, perm]) == forward(x)[:, perm] within "
            f"{atol:g} for perm {perm.tolist()}")
