"""The named checks pass on correct code and fail on the bug each one names."""

import numpy as np
import pytest

from mha import checks, planted, steps
from mha.numpy_mha import MultiHeadAttention


@pytest.fixture
def setup(rng):
    mha = MultiHeadAttention(16, 4, seed=0)
    return mha, rng.normal(size=(2, 6, 16))


def test_check_shape_passes_and_fails():
    a = np.zeros((2, 8, 6, 64))
    assert "(2, 8, 6, 64)" in checks.check_shape(a, (2, 8, 6, 64), "q")
    checks.check_shape(a, (2, None, 6, None))
    with pytest.raises(AssertionError, match=r"q should have shape \(2, 6, 8, 64\), got \(2, 8, 6, 64\)"):
        checks.check_shape(a, (2, 6, 8, 64), "q")
    with pytest.raises(AssertionError):
        checks.check_shape(a, (2, 8, 6), "q")


def test_check_causal_passes_on_the_real_module(setup):
    mha, x = setup
    for t in range(5):
        assert "bit-identical" in checks.check_causal(lambda a: mha(a, causal=True), x, t)


def test_check_causal_catches_a_missing_mask(setup):
    mha, x = setup
    with pytest.raises(AssertionError, match="causality broken"):
        checks.check_causal(lambda a: mha(a, causal=False), x, t=2)


def test_check_causal_catches_mask_applied_after_softmax(setup):
    mha, x = setup
    # Softmax sees unmasked scores, then masked weights are zeroed: future inputs leak in
    # through the normaliser of every row.
    buggy = planted.forward_with(mha, "mask_after_softmax", causal=True)
    with pytest.raises(AssertionError, match="causality broken"):
        checks.check_causal(buggy, x, t=2)


def test_check_causal_control_catches_a_constant_model(setup):
    _, x = setup
    with pytest.raises(AssertionError, match="control case failed"):
        checks.check_causal(lambda a: np.zeros_like(a), x, t=2)


def test_check_causal_rejects_t_without_a_future(setup):
    mha, x = setup
    with pytest.raises(ValueError, match=r"t must be in \[0, T-2\]"):
        checks.check_causal(lambda a: mha(a, causal=True), x, t=5)


def test_check_rows_sum_to_one_catches_zeroing_after_softmax(rng):
    scores = rng.normal(size=(1, 2, 5, 5))
    good = steps.masked_softmax(scores, steps.causal_mask(5))
    checks.check_rows_sum_to_one(good, atol=1e-12)
    bad = steps.softmax(scores) * steps.causal_mask(5)  # zeroing after softmax
    with pytest.raises(AssertionError, match="rows must sum to 1"):
        checks.check_rows_sum_to_one(bad)


def test_check_rows_sum_to_one_catches_nan():
    w = np.full((1, 3), np.nan)
    with pytest.raises(AssertionError):
        checks.check_rows_sum_to_one(w)


class _ExtraBias:
    """A module with one parameter too many, as if a bias were duplicated per head."""

    d_model, n_heads = 8, 2

    def parameters(self):
        return [np.zeros((8, 8))] * 4 + [np.zeros(8)] * 4 + [np.zeros(4)]


def test_check_param_count_passes_and_catches_an_extra_parameter():
    assert checks.expected_param_count(512) == 1_050_624
    checks.check_param_count(MultiHeadAttention(8, 2))
    with pytest.raises(AssertionError, match="expected 4\\*8\\^2 \\+ 4\\*8 = 288 parameters, got 292"):
        checks.check_param_count(_ExtraBias())
