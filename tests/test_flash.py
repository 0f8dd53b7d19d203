"""mha.flash equals steps 3-6 for any T, S, blocks, mask and causal; the online softmax too."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import flash, steps


def reference(q, k, v, causal=False, mask=None, offset=0):
    """Steps 3-6 from mha.steps, on the whole (T, S) matrix, and each row's logsumexp."""
    T, S = q.shape[2], k.shape[2]
    allowed = None
    if mask is not None:
        allowed = mask if mask.ndim == 4 else mask.reshape((1, 1) + mask.shape[-2:]) \
            if mask.ndim == 2 else mask[:, None]
    if causal:
        tril = steps.causal_mask(T, S, offset=offset)
        allowed = tril if allowed is None else allowed & tril
    scores = steps.scaled_scores(q, k)  # (B, h, T, S)
    if allowed is not None:
        scores = steps.apply_mask(scores, allowed)
    with np.errstate(divide="ignore"):
        top = np.max(scores, axis=-1, keepdims=True)
        safe = np.where(np.isfinite(top), top, 0.0)
        lse = (safe + np.log(np.exp(scores - safe).sum(-1, keepdims=True)))[..., 0]
    return steps.weighted_sum(steps.softmax(scores), v), lse


def _qkv(rng, B, h, T, S, d, dtype=np.float64):
    return (rng.normal(size=(B, h, T, d)).astype(dtype), rng.normal(size=(B, h, S, d)).astype(dtype),
            rng.normal(size=(B, h, S, d)).astype(dtype))


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 23), S=st.integers(1, 23), bq=st.integers(1, 9), bk=st.integers(1, 9),
       causal=st.booleans(), masked=st.sampled_from([None, "TS", "BTS", "BhTS"]),
       seed=st.integers(0, 2**16))
def test_tiled_equals_the_steps_in_float64(T, S, bq, bk, causal, masked, seed):
    rng = np.random.default_rng(seed)
    B, h = 2, 3
    q, k, v = _qkv(rng, B, h, T, S, 4)
    shape = {"TS": (T, S), "BTS": (B, T, S), "BhTS": (B, h, T, S)}.get(masked)
    mask = None if shape is None else rng.random(shape) < 0.7  # some rows fully masked
    out, lse = flash.flash_attention(q, k, v, causal=causal, mask=mask, block_q=bq, block_k=bk)
    want, want_lse = reference(q, k, v, causal, mask)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-12)  # -inf where fully masked


@pytest.mark.parametrize("T, S", [(5, 9), (9, 5), (16, 16)])
def test_bottom_right_alignment_with_an_offset(T, S):
    q, k, v = _qkv(np.random.default_rng(1), 1, 2, T, S, 8)
    out, _ = flash.flash_attention(q, k, v, causal=True, offset=S - T, block_q=4, block_k=3)
    want, _ = reference(q, k, v, causal=True, offset=S - T)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)


def test_float32_stays_float32_within_a_derived_tolerance():
    q, k, v = _qkv(np.random.default_rng(2), 1, 4, 64, 64, 32, np.float32)
    golden, _ = reference(*(a.astype(np.float64) for a in (q, k, v)), causal=True)
    plain, _ = reference(q, k, v, causal=True)  # the whole-matrix float32 path
    out, _ = flash.flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    assert out.dtype == np.float32
    allowed = max(1e-5, 3 * float(np.abs(plain - golden).max()))
    assert float(np.abs(out - golden).max()) <= allowed


def test_fully_masked_rows_give_zeros_like_steps_softmax():
    q, k, v = _qkv(np.random.default_rng(3), 1, 1, 4, 6, 2)
    mask = np.ones((4, 6), dtype=bool)
    mask[2] = False  # query 2 may see nothing
    out, lse = flash.flash_attention(q, k, v, mask=mask, block_q=2, block_k=4)
    assert np.array_equal(out[0, 0, 2], np.zeros(2)) and lse[0, 0, 2] == -np.inf


def test_causal_skips_the_tiles_above_the_diagonal():
    kinds = flash.tile_schedule(8, 8, 2, 2)
    assert (kinds == flash.SKIPPED).sum() == 6 and (kinds == flash.PARTIAL).sum() == 4
    assert np.array_equal(np.triu(np.ones((4, 4), dtype=bool), 1), kinds == flash.SKIPPED)
    assert (flash.tile_schedule(8, 8, 2, 2, causal=False) == flash.FULL).all()


def test_a_skipped_tile_is_never_computed():
    """Poison the keys the schedule skips: the output must not change (they are never read)."""
    q, k, v = _qkv(np.random.default_rng(4), 1, 1, 8, 8, 4)
    out, _ = flash.flash_attention(q, k, v, causal=True, block_q=4, block_k=4)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, 4:], v2[:, :, 4:] = np.nan, np.nan  # keys 4-7: only query block 1 may read them
    out2, _ = flash.flash_attention(q, k2, v2, causal=True, block_q=4, block_k=4)
    assert np.array_equal(out[:, :, :4], out2[:, :, :4])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 12), seed=st.integers(0, 2**16),
       masked=st.booleans())
def test_online_softmax_equals_steps_softmax(n, block, seed, masked):
    rng = np.random.default_rng(seed)
    row = 30.0 * rng.normal(size=n)
    if masked:
        row[rng.random(n) < 0.5] = -np.inf
    w, m, ell = flash.online_softmax(row, block)
    np.testing.assert_allclose(w, steps.softmax(row), rtol=0, atol=1e-12)
    finite = row[np.isfinite(row)]
    if finite.size:
        assert m == finite.max() and math.isclose(ell, float(np.exp(finite - m).sum()), rel_tol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_q=0), "block_q must be >= 1, got 0"),
    (dict(block_k=-2), "block_k must be >= 1, got -2"),
    (dict(mask=np.ones((3, 3))), "mask must be a boolean array"),
])
def test_bad_input_names_what_was_expected(kwargs, match):
    q, k, v = _qkv(np.random.default_rng(5), 1, 1, 3, 3, 2)
    with pytest.raises((ValueError, TypeError), match=match):
        flash.flash_attention(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=r"k must be \(B=1, h=1, S, d_k=2\), got \(1, 1, 3, 5\)"):
        flash.flash_attention(q, np.zeros((1, 1, 3, 5)), v)
