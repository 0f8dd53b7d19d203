"""The named checks pass on correct code and fail on the bug each one names."""

import numpy as np
import pytest

from mha import checks, steps
from mha.modules.numpy_mha import MultiHeadAttention
from mha_course import planted
from mha_course.tryit.generation import judge_padded_positions


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


# The score scale, by name ---------------------------------------------------------------------
@pytest.mark.parametrize("d_k", [1, 4, 16, 64, 256])
def test_check_score_scale_passes_the_real_scores_at_any_width(d_k):
    for seed in range(5):
        assert "~ 1" in checks.check_score_scale(steps.scaled_scores, d_k=d_k, seed=seed)


@pytest.mark.parametrize("bug, says", [(planted.scores_unscaled, "not divided by sqrt"),
                                       (planted.scores_over_d_k, "divided by d_k, not sqrt")])
def test_check_score_scale_names_the_missing_or_wrong_scale(bug, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_score_scale(bug, d_k=64)


def test_check_score_scale_does_not_guess_when_the_variance_fits_neither():
    with pytest.raises(AssertionError, match="expected about 1"):
        checks.check_score_scale(lambda q, k: 3.0 * steps.scaled_scores(q, k), d_k=64)


# Messages a student reads --------------------------------------------------------------------
def test_check_causal_names_both_candidates_when_it_cannot_tell(setup):
    mha, x = setup
    for bug in ("mask_after_softmax", "merge_no_transpose"):
        with pytest.raises(AssertionError) as e:
            checks.check_causal(planted.forward_with(mha, bug, causal=True), x, t=2)
        assert "applied after softmax" in str(e.value) and "without its transpose" in str(e.value)


def test_messages_print_plain_numbers():
    with pytest.raises(AssertionError) as e:
        checks.check_rows_sum_to_one(np.full((2, 3), 0.3))
    assert "np.float64" not in str(e.value) and "sums to 0.9" in str(e.value)
    with pytest.raises(AssertionError) as e:
        checks.check_answer("zeros", np.int64(14), 15, "count the weights above the diagonal")
    assert str(e.value) == "zeros: not yet. You have 14; count the weights above the diagonal"


def test_check_answer_accepts_right_answers_within_atol():
    assert checks.check_answer("entropy", 0.6931, np.log(2), "why", atol=1e-3) == "entropy: right"
    assert checks.check_answer("mask", np.eye(2, dtype=bool), np.eye(2, dtype=bool), "w")
    with pytest.raises(AssertionError, match="shape"):
        checks.check_answer("mask", np.ones((3, 3, 3)), np.ones((2, 2)), "w")


def test_check_answer_wants_a_boolean_mask_and_shows_big_arrays_plainly():
    mask = np.tril(np.ones((6, 6), dtype=bool))
    with pytest.raises(AssertionError, match="as int64: a mask must be boolean"):
        checks.check_answer("mask", mask.astype(int), mask, "w")
    with pytest.raises(AssertionError, match=r"You have an array of shape \(6, 6\); w"):
        checks.check_answer("mask", ~mask, mask, "w")


# ---- lesson 17's Try it: positions of a left-padded batch ---------------------------------------
_LENGTHS, _T = [2, 5, 3], 5
_RIGHT = np.array([[-1, -1, -1, 0, 1], [0, 1, 2, 3, 4], [-1, -1, 0, 1, 2]])


@pytest.mark.parametrize(("answer", "words"), [
    (np.array([[0, 1, -1, -1, -1], [0, 1, 2, 3, 4], [0, 1, 2, -1, -1]]), "the pads are on the right"),
    (np.maximum(_RIGHT, 0), "the pads are at position 0"),
    (np.where(_RIGHT >= 0, _RIGHT + 1, -1), "off by one"),
    (np.where(_RIGHT >= 0, np.arange(5), -1), "count from the first column"),
    (np.tile(np.arange(5), (3, 1)), "every row is 0..T-1"),
    (np.where(_RIGHT >= 0, _RIGHT, -2) * np.array([[1], [1], [1]]) + (_RIGHT == 4), "first that differs"),
    (np.zeros((3, 4), dtype=int), "must be (B=3, T=5)"),
    (_RIGHT + 0.5, "whole numbers"),
])
def test_padded_positions_check_names_each_mistake(answer, words):
    with pytest.raises(AssertionError) as info:
        judge_padded_positions(answer, _LENGTHS, _T)
    assert words in str(info.value)
    assert str(_RIGHT.tolist()) not in str(info.value)  # never prints the answer


def test_padded_positions_check_says_right_and_not_tried():
    assert judge_padded_positions(_RIGHT, _LENGTHS, _T).startswith("right")
    assert judge_padded_positions(_RIGHT.astype(float), _LENGTHS, _T).startswith("right")
    pads_count_up = np.arange(_T) - (_T - np.array(_LENGTHS))[:, None]  # pads ..., -3, -2, -1
    assert judge_padded_positions(pads_count_up, _LENGTHS, _T).startswith("right")
    assert judge_padded_positions(None, _LENGTHS, _T).startswith("not tried yet")
