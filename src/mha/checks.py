"""Named properties of multi-head attention that notebooks and tests assert.

Each check raises AssertionError with a message saying what failed, and returns a
one-line summary when it passes, so a notebook can print what was proven.

check_causal, check_rows_sum_to_one and check_param_count are the three assertions of the
first seed article, 《手撕 Multi-Head Attention：纯 Python 从零实现并跑通》 (alishangtian.com).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mha.validate import shape_of


def check_shape(x, expected: Sequence[int | None], name: str = "tensor") -> str:
    """Assert x.shape equals `expected` (None matches any size)."""
    got = shape_of(x)
    ok = len(got) == len(expected) and all(
        e is None or g == e for g, e in zip(got, expected, strict=False)
    )
    shown = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
    if not ok:
        raise AssertionError(f"{name} should have shape {shown}, got {got}")
    return f"{name} has shape {got}"


def expected_param_count(d_model: int) -> int:
    """Parameters of one attention block: four d_model x d_model weights and four biases."""
    return 4 * d_model * d_model + 4 * d_model


def check_param_count(module) -> str:
    """Assert the module holds exactly 4*d_model^2 + 4*d_model numbers, whatever n_heads is.

    The seed article's third assertion (《手撕 Multi-Head Attention》, alishangtian.com).
    """
    n = sum(int(np.prod(shape_of(p))) for p in module.parameters())
    want = expected_param_count(module.d_model)
    if n != want:
        raise AssertionError(
            f"expected 4*{module.d_model}^2 + 4*{module.d_model} = {want:,} parameters, got {n:,}"
        )
    return f"parameters: {n:,} = 4*{module.d_model}^2 + 4*{module.d_model} (n_heads={module.n_heads})"


def check_rows_sum_to_one(weights, atol: float = 1e-6) -> str:
    """Assert every attention row (last axis) sums to 1 within `atol`.

    The seed article's second assertion (《手撕 Multi-Head Attention》, alishangtian.com).
    """
    w = np.asarray(weights, dtype=np.float64)
    sums = w.sum(axis=-1)
    dev = np.abs(sums - 1.0)
    dev = np.where(np.isnan(dev), np.inf, dev)  # a NaN row counts as the worst row
    err = float(dev.max())
    if not err <= atol:
        worst = tuple(int(i) for i in np.unravel_index(np.argmax(dev), sums.shape))
        raise AssertionError(
            f"attention rows must sum to 1 (atol={atol}); row {worst} sums to "
            f"{float(sums[worst]):.6g}"
        )
    return f"rows sum to one: all {sums.size} rows within {atol:g} of 1"


def score_variance(score_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], d_k: int,
                   seed: int = 0) -> float:
    """Variance of score_fn(q, k) for unit-variance q, k of width d_k (262,144 scores)."""
    rng = np.random.default_rng(seed)
    # Many short sequences rather than one long one: 8,192 independent q and k rows, so the
    # estimate is good even at d_k = 1, where each score is a product of two numbers.
    q = rng.normal(size=(1, 256, 32, d_k))  # (B, h, T, d_k)
    k = rng.normal(size=(1, 256, 32, d_k))  # (B, h, S, d_k)
    return float(np.var(score_fn(q, k)))  # over (B, h, T, S) = 256 * 32 * 32 scores


def check_score_scale(score_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], d_k: int = 64,
                      tol: float = 0.1, seed: int = 0) -> str:
    """Assert scaled scores of unit-variance q, k have variance ~1 (q.k alone has variance d_k).

    The estimate is within a few percent of the truth for any d_k, so tol=0.1 does not
    fail a correct function, and it names the two usual mistakes by the variance they give.
    """
    v = score_variance(score_fn, d_k, seed)
    if abs(v - 1.0) <= tol:
        return f"score scale: variance {v:.3f} ~ 1 for unit-variance q, k (d_k={d_k})"
    if abs(v / d_k - 1.0) <= tol:
        why = f"that is d_k = {d_k}: the scores are not divided by sqrt(d_k)"
    elif abs(v * d_k - 1.0) <= tol:
        why = f"that is 1/d_k = 1/{d_k}: the scores are divided by d_k, not sqrt(d_k)"
    else:
        why = "expected about 1; check the scale factor 1/sqrt(d_k)"
    raise AssertionError(f"score scale: variance {v:.3g} for unit-variance q, k (d_k={d_k}); "
                         f"{why}")


def check_answer(name: str, got, expected, why: str, atol: float = 0.0) -> str:
    """A self-check for an exercise: say right, or what was expected and the likely cause.

    `expected` is computed by the notebook from the package, not typed in; `why` is the
    hint shown when the answer is wrong.
    """
    g, e = np.asarray(got), np.asarray(expected)
    right = g.shape == e.shape and bool(np.allclose(g, e, rtol=0.0, atol=atol)
                                        if np.issubdtype(e.dtype, np.number) and e.dtype != bool
                                        else np.array_equal(g, e))
    shown = _plain(got) if g.size <= 8 else f"an array of shape {g.shape}"
    if not right:
        if g.shape != e.shape:
            shown += f" (shape {g.shape}, expected shape {e.shape})"
        raise AssertionError(f"{name}: not yet. You have {shown}; {why}")
    if e.dtype == np.bool_ and g.dtype != np.bool_:
        raise AssertionError(f"{name}: the right values, but as {g.dtype}: a mask must be "
                             f"boolean (True = may attend), e.g. .astype(bool)")
    return f"{name}: right"


def _plain(value) -> str:
    """A value as a student would write it: 3 or 0.25, not np.int64(3) or np.float64(0.25)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        return np.array2string(value, precision=4, suppress_small=True)
    return repr(value) if isinstance(value, str) else str(value)


def check_causal(
    forward: Callable[[np.ndarray], np.ndarray], x: np.ndarray, t: int, seed: int = 0
) -> str:
    """Assert outputs up to t ignore inputs after t (bit-for-bit), and do depend on input t.

    `forward` maps x (B, T, d_model) to outputs (B, T, d_out) with the causal mask on.
    Bit-equality (np.array_equal) is the right test: masked keys get weight exactly 0.0,
    so they add exact zeros and cannot move any earlier output by even one ulp.
    The control case guards against a check that passes vacuously (e.g. a constant model).
    Bit-exact test and control are the design of 《手撕 Multi-Head Attention》 (alishangtian.com).
    """
    x = np.asarray(x)
    T = x.shape[1]
    if not 0 <= t < T - 1:
        raise ValueError(f"t must be in [0, T-2] = [0, {T - 2}] so some input comes after it, got {t}")
    rng = np.random.default_rng(seed)
    out = np.asarray(forward(x))

    future = x.copy()
    future[:, t + 1 :, :] = rng.normal(0.0, 1.0, future[:, t + 1 :, :].shape)  # change all s > t
    out_future = np.asarray(forward(future))
    if not np.array_equal(out[:, : t + 1], out_future[:, : t + 1]):
        diff = float(np.abs(out[:, : t + 1] - out_future[:, : t + 1]).max())
        raise AssertionError(
            f"causality broken: changing inputs after t={t} moved outputs at <= t "
            f"(max change {diff:.3g}). The outputs alone cannot say why; the usual causes are "
            f"(a) the mask: missing, the wrong triangle, off by one, or applied after softmax, "
            f"and (b) a split or merge reshape without its transpose, which mixes tokens. "
            f"To tell them apart: check_rows_sum_to_one on the weights fails only for a mask "
            f"applied after softmax; diagnose.check_step on causal_mask, split_heads and "
            f"merge_heads names the others"
        )

    present = x.copy()
    present[:, t, :] += 1.0  # control: change input t itself
    out_present = np.asarray(forward(present))
    if np.array_equal(out[:, t], out_present[:, t]):
        raise AssertionError(
            f"control case failed: changing input t={t} left output t unchanged, "
            f"so the causality check above proves nothing"
        )
    return (f"causal: outputs 0..{t} bit-identical when inputs {t + 1}..{T - 1} change; "
            f"output {t} changes when input {t} does")

