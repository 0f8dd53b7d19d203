"""Named properties of multi-head attention that notebooks and tests assert.

Each check raises AssertionError with a message saying what failed, and returns a
one-line summary when it passes, so a notebook can print what was proven.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .validate import shape_of


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
    """Assert the module holds exactly 4*d_model^2 + 4*d_model numbers, whatever n_heads is."""
    n = sum(int(np.prod(shape_of(p))) for p in module.parameters())
    want = expected_param_count(module.d_model)
    if n != want:
        raise AssertionError(
            f"expected 4*{module.d_model}^2 + 4*{module.d_model} = {want:,} parameters, got {n:,}"
        )
    return f"parameters: {n:,} = 4*{module.d_model}^2 + 4*{module.d_model} (n_heads={module.n_heads})"


def check_rows_sum_to_one(weights, atol: float = 1e-6) -> str:
    """Assert every attention row (last axis) sums to 1 within `atol`."""
    w = np.asarray(weights, dtype=np.float64)
    sums = w.sum(axis=-1)
    dev = np.abs(sums - 1.0)
    dev = np.where(np.isnan(dev), np.inf, dev)  # a NaN row counts as the worst row
    err = float(dev.max())
    if not err <= atol:
        worst = tuple(int(i) for i in np.unravel_index(np.argmax(dev), sums.shape))
        raise AssertionError(
            f"attention rows must sum to 1 (atol={atol}); row {worst} sums to {sums[worst]!r}"
        )
    return f"rows sum to one: all {sums.size} rows within {atol:g} of 1"


def check_causal(
    forward: Callable[[np.ndarray], np.ndarray], x: np.ndarray, t: int, seed: int = 0
) -> str:
    """Assert outputs up to t ignore inputs after t (bit-for-bit), and do depend on input t.

    `forward` maps x (B, T, d_model) to outputs (B, T, d_out) with the causal mask on.
    Bit-equality (np.array_equal) is the right test: masked keys get weight exactly 0.0,
    so they add exact zeros and cannot move any earlier output by even one ulp.
    The control case guards against a check that passes vacuously (e.g. a constant model).
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
            f"(max change {diff:.3g}); is the mask applied before softmax?"
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
