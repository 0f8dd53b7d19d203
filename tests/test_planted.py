"""Each planted bug is caught by the check the lessons name, and the correct code passes it.

The backward's planted bugs (end of file) are passed to grad.backward explicitly: none swaps state.
"""

import dataclasses
import warnings

import numpy as np
import pytest

from mha import checks, steps
from mha.modules.numpy_mha import MultiHeadAttention
from mha.training import grad
from mha_course import planted
from mha_course.diagnose.backward import backward_cases, default_module, step_backward
from tests.reference import attention_loops


@pytest.fixture
def setup(rng):
    return MultiHeadAttention(16, 4, seed=0), rng.normal(size=(2, 6, 16))


def test_bug_swaps_and_always_restores_the_steps(setup):
    mha, x = setup
    originals = {n: getattr(steps, n) for n in ("linear", "split_heads", "scaled_scores",
                                                 "causal_mask", "apply_mask", "softmax",
                                                 "merge_heads")}
    for name in planted.BUGS:
        with pytest.raises(RuntimeError), planted.bug(name):
            mha(x, causal=True)
            raise RuntimeError("leave the block by an exception")
        assert {n: getattr(steps, n) for n in originals} == originals
    with pytest.raises(ValueError, match="unknown planted bug 'nope'"):
        planted.forward_with(mha, "nope")


@pytest.mark.parametrize("name", sorted(planted.BUGS))
def test_each_bug_changes_the_module_output(setup, name):
    mha, x = setup
    want = mha(x, causal=True)
    with planted.bug(name):
        got = mha(x, causal=True)
    assert got.shape == want.shape  # right shape ...
    if name == "softmax_no_max":
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)  # harmless at small logits
    else:
        assert not np.allclose(got, want, atol=1e-3)  # ... wrong values


# Causality: mask after softmax ---------------------------------------------------------
def test_check_causal_catches_mask_after_softmax_and_passes_the_real_module(setup):
    mha, x = setup
    checks.check_causal(lambda a: mha(a, causal=True), x, t=2)
    with pytest.raises(AssertionError, match="causality broken"):
        checks.check_causal(planted.forward_with(mha, "mask_after_softmax", causal=True), x, t=2)


def test_rows_sum_to_one_catches_mask_after_softmax(rng):
    scores = rng.normal(size=(1, 2, 5, 5))
    allowed = steps.causal_mask(5)
    checks.check_rows_sum_to_one(steps.masked_softmax(scores, allowed), atol=1e-12)
    with pytest.raises(AssertionError, match="rows must sum to 1"):
        checks.check_rows_sum_to_one(planted.mask_after_softmax(scores, allowed))


def test_mask_after_softmax_without_a_mask_is_plain_softmax(setup):
    mha, x = setup
    want = mha(x, causal=False)
    with planted.bug("mask_after_softmax"):
        np.testing.assert_array_equal(mha(x, causal=False), want)


# Merge order: round trip and per-head loop reference -------------------------------------
def test_round_trip_catches_merge_without_transpose(rng):
    x = rng.normal(size=(2, 5, 12))  # (B, T, d_model)
    np.testing.assert_array_equal(steps.merge_heads(steps.split_heads(x, 3)), x)
    bad = planted.merge_no_transpose(steps.split_heads(x, 3))
    assert bad.shape == x.shape and not np.array_equal(bad, x)


def test_loop_reference_catches_merge_without_transpose(setup):
    mha, x = setup
    want, _ = attention_loops(mha, x)
    np.testing.assert_allclose(mha(x), want, rtol=0, atol=1e-12)
    with planted.bug("merge_no_transpose"):
        got = mha(x)
    assert np.abs(got - want).max() > 1e-2


# Variance of the scores ---------------------------------------------------------------------
def _score_variance(score_fn, d_k: int, rng) -> float:
    q = rng.normal(size=(1, 1, 512, d_k))  # (B, h, T, d_k), unit variance
    k = rng.normal(size=(1, 1, 512, d_k))  # (B, h, S, d_k)
    return float(score_fn(q, k).var())


@pytest.mark.parametrize("d_k", [16, 64, 256])
def test_variance_check_catches_unscaled_scores(rng, d_k):
    # var(q.k) = d_k for unit-variance q, k; ~262k samples give a relative error of ~1%.
    assert abs(_score_variance(steps.scaled_scores, d_k, rng) - 1.0) < 0.1
    assert abs(_score_variance(planted.scores_unscaled, d_k, rng) / d_k - 1.0) < 0.1


# Overflow: softmax without the max subtraction ------------------------------------------------
@pytest.mark.parametrize("dtype, big", [(np.float64, 800.0), (np.float32, 100.0)])
def test_nan_check_catches_softmax_without_max(dtype, big):
    scores = np.array([[big, 0.0, -big], [1.0, 2.0, 3.0]], dtype=dtype)
    good = steps.softmax(scores)
    assert np.isfinite(good).all()
    checks.check_rows_sum_to_one(good, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the overflow is the point
        bad = planted.softmax_no_max(scores)
    assert np.isnan(bad[0]).any()
    with pytest.raises(AssertionError, match="rows must sum to 1"):
        checks.check_rows_sum_to_one(bad)


def test_module_with_softmax_without_max_gives_nan_on_large_inputs(setup):
    mha, x = setup
    big = 400.0 * x  # scores ~ 400^2 * O(1): far past exp's float64 range
    assert np.isfinite(mha(big)).all()
    with warnings.catch_warnings(), planted.bug("softmax_no_max"):
        warnings.simplefilter("ignore", RuntimeWarning)
        mha(big)
    with pytest.raises(AssertionError, match="rows must sum to 1"):
        checks.check_rows_sum_to_one(mha.attn)


def test_a_suspects_trace_looks_like_a_healthy_modules(rng):
    x = rng.normal(size=(2, 5, 16))
    healthy = MultiHeadAttention(16, 4, seed=2026).trace(x, causal=True)
    for suspect in planted.suspects(2026).values():
        rows = suspect.trace(x, causal=True)
        assert [(r.step, r.tensor) for r in rows] == [(r.step, r.tensor) for r in healthy]


# The backward's planted bugs: passed explicitly, never swapped in ------------------------------
BACKWARD_CASES = backward_cases(default_module())


@pytest.mark.parametrize("name", sorted(planted.BACKWARD_BUGS))
def test_each_backward_bug_runs_and_changes_a_gradient(name):
    """Right shapes, no error, and some gradient moves (but for the mask skip, see below)."""
    m = default_module()
    kw = dict(BACKWARD_CASES)["causal self-attention"]
    ref, got = grad.backward(m, **kw), planted.backward_with(name)(m, **kw)
    assert [(n, a.shape) for n, a in got.items()] == [(n, a.shape) for n, a in ref.items()]
    moved = [n for n, a in got.items() if not np.allclose(a, getattr(ref, n), rtol=1e-9, atol=1e-12)]
    assert bool(moved) == (name != "mask_backward_skipped"), moved


def test_a_planted_step_is_passed_explicitly_and_changes_no_state():
    m = default_module()
    kw = dict(BACKWARD_CASES)["causal self-attention"]
    before = {f.name: getattr(grad, f.name) for f in dataclasses.fields(grad.BackwardSteps)}
    wrong = planted.backward_steps("softmax_no_outer_product")
    assert wrong.softmax_backward is planted.softmax_no_outer_product
    assert dataclasses.replace(wrong, softmax_backward=grad.softmax_backward) == grad.REFERENCE_STEPS
    explicit = grad.backward(m, **kw, steps=wrong)
    via = planted.backward_with("softmax_no_outer_product")(m, **kw)
    assert all(np.array_equal(a, getattr(via, n)) for n, a in explicit.items())
    assert {n: getattr(grad, n) for n in before} == before  # nothing in mha.training.grad was replaced
    assert all(getattr(grad.REFERENCE_STEPS, n) is f for n, f in before.items())


def test_a_skipped_mask_backward_cannot_be_seen_from_the_module():
    """softmax_backward already gives 0 where w = 0, so only the step check can see it."""
    m = default_module()
    for _, kw in BACKWARD_CASES:
        wrong = grad.backward(m, **kw, steps=planted.backward_steps("mask_backward_skipped"))
        ref = grad.backward(m, **kw)
        assert all(np.array_equal(g, getattr(ref, n)) for n, g in wrong.items())
    verdict = step_backward("apply_mask", planted.mask_backward_skipped)
    assert verdict.bug == "mask_backward_skipped", verdict.message


def test_unknown_and_whole_pass_backward_bugs_are_refused_clearly():
    with pytest.raises(ValueError, match="replaces the whole backward, not a step: call "
                                         "backward_with"):
        planted.backward_steps("dx_query_path_only")
    assert planted.backward_with("dx_query_path_only") is planted.dx_query_path_only
    for fn in (planted.backward_with, planted.backward_steps):
        with pytest.raises(ValueError, match="unknown planted bug 'softmax_typo'; expected one of"):
            fn("softmax_typo")
