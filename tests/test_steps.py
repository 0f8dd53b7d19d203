"""Each of the seven steps against an independent formulation (loops or explicit formulas)."""

import math
import warnings

import numpy as np
import pytest

from mha import steps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_matches_einsum_and_keeps_dtype(rng, dtype):
    x = rng.normal(size=(2, 5, 8)).astype(dtype)
    W = rng.normal(size=(8, 3)).astype(dtype)
    b = rng.normal(size=3).astype(dtype)
    want = np.einsum("btd,de->bte", x.astype(np.float64), W.astype(np.float64)) + b
    got = steps.linear(x, W, b)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_split_heads_gives_each_head_its_own_columns(rng):
    B, T, d_model, h = 2, 5, 12, 3
    d_k = d_model // h
    x = rng.normal(size=(B, T, d_model))
    out = steps.split_heads(x, h)
    assert out.shape == (B, h, T, d_k)
    for j in range(h):  # head j must see exactly columns j*d_k .. (j+1)*d_k - 1
        np.testing.assert_array_equal(out[:, j], x[:, :, j * d_k : (j + 1) * d_k])


def test_merge_heads_concatenates_heads_along_features(rng):
    B, h, T, d_k = 2, 4, 3, 5
    x = rng.normal(size=(B, h, T, d_k))
    want = np.concatenate([x[:, j] for j in range(h)], axis=-1)  # (B, T, h*d_k)
    np.testing.assert_array_equal(steps.merge_heads(x), want)


def test_merge_inverts_split(rng):
    x = rng.normal(size=(3, 7, 16))
    np.testing.assert_array_equal(steps.merge_heads(steps.split_heads(x, 4)), x)


def test_round_trip_check_catches_the_merge_order_trap(rng):
    """Reshaping (B, h, T, d_k) straight to (B, T, d_model) has the right shape, wrong values."""

    def merge_without_transpose(x):
        B, h, T, d_k = x.shape
        return x.reshape(B, T, h * d_k)

    x = rng.normal(size=(2, 6, 16))
    wrong = merge_without_transpose(steps.split_heads(x, 4))
    assert wrong.shape == x.shape  # the trap: the shape check passes ...
    assert not np.array_equal(wrong, x)  # ... but the round trip exposes it


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scaled_scores_match_dot_products(rng, dtype):
    B, h, T, S, d_k = 2, 3, 4, 5, 8
    q = rng.normal(size=(B, h, T, d_k)).astype(dtype)
    k = rng.normal(size=(B, h, S, d_k)).astype(dtype)
    got = steps.scaled_scores(q, k)
    assert got.dtype == dtype, "NumPy 2 promotes f32 / np.sqrt(d) to float64; must stay f32"
    want = np.empty((B, h, T, S))
    for b, j, t, s in np.ndindex(B, h, T, S):
        want[b, j, t, s] = sum(float(q[b, j, t, i]) * float(k[b, j, s, i]) for i in range(d_k))
    np.testing.assert_allclose(got, want / math.sqrt(d_k), rtol=1e-5, atol=1e-6)


def test_causal_mask_is_the_lower_staircase():
    for T, S in [(1, 1), (4, 4), (3, 5), (5, 3)]:
        want = np.array([[s <= t for s in range(S)] for t in range(T)])
        np.testing.assert_array_equal(steps.causal_mask(T, S), want)
    assert steps.causal_mask(6).shape == (6, 6)


def test_apply_mask_puts_minus_inf_where_disallowed(rng):
    scores = rng.normal(size=(1, 1, 3, 3)).astype(np.float32)
    out = steps.apply_mask(scores, steps.causal_mask(3))
    assert out.dtype == np.float32
    assert np.isneginf(out[0, 0][np.triu_indices(3, k=1)]).all()
    np.testing.assert_array_equal(out[0, 0][np.tril_indices(3)], scores[0, 0][np.tril_indices(3)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_matches_formula(rng, dtype):
    z = rng.normal(size=(3, 4, 6)).astype(dtype)
    want = np.exp(z.astype(np.float64)) / np.exp(z.astype(np.float64)).sum(-1, keepdims=True)
    got = steps.softmax(z)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-14)


def test_softmax_survives_huge_logits_where_naive_overflows():
    z = np.array([[1000.0, 1001.0, 1002.0]])
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    assert np.isnan(naive).all()  # the failure the max subtraction prevents
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = steps.softmax(z)
    want = steps.softmax(z - 1000.0)  # shift invariance: same answer from small logits
    np.testing.assert_allclose(got, want, rtol=1e-15)
    np.testing.assert_allclose(got, [[0.09003057, 0.24472847, 0.66524096]], rtol=1e-7)


def test_softmax_gives_exact_zeros_for_minus_inf_and_zero_rows_when_all_masked():
    z = np.array([[0.5, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value" RuntimeWarning either
        p = steps.softmax(z)
    assert p[0, 1] == 0.0
    np.testing.assert_allclose(p[0].sum(), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(p[1], np.zeros(3, np.float32))
    assert p.dtype == np.float32


def test_masked_softmax_masks_before_normalising(rng):
    scores = rng.normal(size=(1, 1, 4, 4))
    p = steps.masked_softmax(scores, steps.causal_mask(4))
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-14)
    assert (p[0, 0][np.triu_indices(4, k=1)] == 0.0).all()
    np.testing.assert_array_equal(steps.masked_softmax(scores, None), steps.softmax(scores))


def test_weighted_sum_is_a_loop_over_value_rows(rng):
    B, h, T, S, d_k = 2, 2, 3, 4, 5
    w = steps.softmax(rng.normal(size=(B, h, T, S)))
    v = rng.normal(size=(B, h, S, d_k))
    want = np.zeros((B, h, T, d_k))
    for b, j, t in np.ndindex(B, h, T):
        for s in range(S):
            want[b, j, t] += w[b, j, t, s] * v[b, j, s]
    np.testing.assert_allclose(steps.weighted_sum(w, v), want, rtol=1e-12, atol=1e-14)


def test_causal_mask_offset_aligns_the_staircase_bottom_right():
    m = steps.causal_mask(2, 5, offset=3)  # 2 new queries after 3 cached keys
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert np.array_equal(steps.causal_mask(4, 4, offset=0), steps.causal_mask(4))
    with pytest.raises(TypeError, match="offset must be an int"):
        steps.causal_mask(2, 5, offset=1.5)
