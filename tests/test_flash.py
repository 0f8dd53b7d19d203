"""mha.attention.flash equals steps 3-6 for any T, S, blocks, mask and causal; the online softmax too."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import steps
from mha.attention import flash, masking, numpy_attention


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


# ---- passes over the scores: three, two, one ------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 12), seed=st.integers(0, 2**16),
       masked=st.sampled_from(["none", "some", "all"]))
@pytest.mark.filterwarnings("error")  # no RuntimeWarning from -inf - -inf or 0 / 0
def test_three_two_and_one_pass_give_the_same_attention(n, block, seed, masked):
    rng = np.random.default_rng(seed)
    row, v = 30.0 * rng.normal(size=n), rng.normal(size=(n, 3))
    if masked != "none":
        row[rng.random(n) < (0.5 if masked == "some" else 2.0)] = -np.inf
    want_w = steps.softmax(row)  # (n,); zeros for an all -inf row
    want = np.zeros(3) if not want_w.any() else \
        sum(want_w[s] * v[s] for s in range(n))  # a plain loop, not a matmul
    for fn, passes in ((flash.softmax_three_passes, 3), (flash.softmax_two_passes, 2)):
        stream = flash.ScoreStream(row, block)
        w, m, ell = fn(stream)
        np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-12)
        assert stream.passes == (passes if np.isfinite(row).any() else 1)  # all -inf: stop after the max
        assert stream.reads == stream.passes * n
    stream = flash.ScoreStream(row, block)
    out, m, ell = flash.attend_one_pass(stream, v)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    assert stream.passes == 1 and stream.reads == n
    finite = row[np.isfinite(row)]
    if finite.size:
        assert m == finite.max() and math.isclose(ell, float(np.exp(finite - m).sum()), rel_tol=1e-12)
    else:
        assert (m, ell) == (-np.inf, 0.0)


def test_a_stream_counts_the_ragged_last_block_and_refuses_a_matrix():
    stream = flash.ScoreStream(np.arange(10.0), 4)
    assert [x.size for x in stream] == [4, 4, 2] and stream.reads == 10 and stream.passes == 1
    assert flash.ScoreStream(np.zeros(0), 3).passes == 0.0
    with pytest.raises(ValueError, match=r"row must be one row of scores, shape \(S,\), got shape \(2, 3\)"):
        flash.ScoreStream(np.zeros((2, 3)), 2)
    with pytest.raises(ValueError, match=r"v must be \(S=4, d_v\), got \(5, 2\)"):
        flash.attend_one_pass(flash.ScoreStream(np.zeros(4), 2), np.zeros((5, 2)))


def test_format_schedule_draws_the_grid_and_counts():
    text = flash.format_schedule(flash.tile_schedule(8, 8, 2, 2))
    assert text == ("    k0 k1 k2 k3\n"
                    "q0   P  .  .  .\n"
                    "q1   F  P  .  .\n"
                    "q2   F  F  P  .\n"
                    "q3   F  F  F  P\n"
                    ". SKIPPED: 6  P PARTIAL: 4  F FULL: 6")
    with pytest.raises(ValueError, match="kinds must be a 2-d array of SKIPPED / PARTIAL / FULL"):
        flash.format_schedule(np.array([[0, 3]]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_q=0), "block_q must be >= 1, got 0"),
    (dict(block_k=-2), "block_k must be >= 1, got -2"),
    (dict(mask=np.ones((3, 3))), "mask must be a boolean array"),
])
def test_bad_input_names_what_was_expected(kwargs, match):
    q, k, v = _qkv(np.random.default_rng(5), 1, 1, 3, 3, 2)
    with pytest.raises((ValueError, TypeError), match=match):
        flash.flash_attention(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=r"k must be \(B=1, h_kv, S, d_k=2\), got \(1, 1, 3, 5\)"):
        flash.flash_attention(q, np.zeros((1, 1, 3, 5)), v)


# ---- offset: refused like steps.causal_mask refuses it ----------------------------------------
@pytest.mark.parametrize("offset, match", [(0.5, "offset must be an int, got float 0.5"),
                                           (True, "offset must be an int, got bool True"),
                                           (np.float64(2.0), r"offset must be an int, got float64 np.float64\(2.0\)")])
def test_offset_must_be_an_int_as_in_causal_mask(offset, match):
    q, k, v = _qkv(np.random.default_rng(6), 1, 1, 3, 3, 2)
    with pytest.raises(TypeError, match=match):
        steps.causal_mask(3, 3, offset=offset)  # the contract flash follows
    with pytest.raises(TypeError, match=match):
        flash.flash_attention(q, k, v, causal=True, offset=offset)
    with pytest.raises(TypeError, match=match):
        flash.tile_schedule(3, 3, 2, 2, offset=offset)
    flash.flash_attention(q, k, v, causal=True, offset=np.int64(-1))  # numpy ints stay welcome


# ---- blocks chosen from the shapes ------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(T=st.integers(1, 5000), S=st.integers(1, 5000), d_k=st.sampled_from([8, 64, 128]),
       itemsize=st.sampled_from([4, 8]), budget=st.sampled_from([2**16, 2**20, 4 * 2**20]))
def test_chosen_blocks_fit_the_budget_and_even_out_the_tail(T, S, d_k, itemsize, budget):
    bq, bk = flash.choose_blocks(T, S, d_k, itemsize, budget)
    assert 1 <= bq <= T and 1 <= bk <= S
    floor = (min(T, 16), min(S, 16))  # the smallest blocks it ever proposes
    working_set = itemsize * (bq * bk + 2 * bq * d_k)  # one head's score, q and acc tiles
    assert (bq, bk) <= floor or working_set <= budget, f"{bq} x {bk}: {working_set} B > {budget}"
    for n, b in ((T, bq), (S, bk)):
        blocks = -(-n // b)
        assert blocks * b - n < blocks, f"{n} in blocks of {b}: a ragged tail, not evened out"


def test_chosen_blocks_for_the_benchmark_shape():
    """T = S = 2048, d_k = 64 (benchmarks/flash_blocks.py): large tiles, one head per step."""
    assert flash.TILE_BUDGET_BYTES == 2 * 2**20
    assert flash.choose_blocks(2048, 2048, 64, 4) == (512, 512)  # 1.25 MiB
    assert flash._heads_per_step(8, 512, 512, 64, 4) == 1
    assert flash.choose_blocks(1000, 1000, 64, 4) == (500, 500)  # evened: 2 x 500, not 512 + 488
    assert flash.choose_blocks(5, 9, 4, 8) == (5, 9)  # small inputs: one tile, all heads at once
    assert flash._heads_per_step(6, 5, 9, 4, 8) == 6
    assert flash._heads_per_step(8, 256, 256, 64, 4) == 4  # 5 fit: evened to 4 + 4, not 5 + 3
    assert flash.choose_blocks(1500, 1400, 8, 8) == (250, 467)  # float64: 256 x 512, evened


@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("masked", ["TS", "BTS", "BhTS", "1hTS"])
def test_heads_in_groups_equal_the_steps(g, masked, monkeypatch):
    """h = 3 heads taken 1 or 2 at a time (a ragged last group), each mask shape sliced per group."""
    monkeypatch.setattr(flash, "_heads_per_step", lambda h, *args: g)
    rng = np.random.default_rng(12)
    B, h, T, S = 2, 3, 11, 13
    q, k, v = _qkv(rng, B, h, T, S, 4)
    shape = {"TS": (T, S), "BTS": (B, T, S), "BhTS": (B, h, T, S), "1hTS": (1, h, T, S)}[masked]
    mask = rng.random(shape) < 0.7
    out, lse = flash.flash_attention(q, k, v, causal=True, mask=mask, block_q=4, block_k=5)
    want, want_lse = reference(q, k, v, True, mask)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B, h, T, S", [(1, 2, 1500, 1400), (2, 4, 40, 70)])
def test_default_blocks_equal_the_steps(B, h, T, S, causal):
    """Defaults: one head at a time in 6 x 3 tiles (1500 x 1400), all heads in one (40 x 70)."""
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, B, h, T, S, 8)
    mask = rng.random((B, T, S)) < 0.9
    out, lse = flash.flash_attention(q, k, v, causal=causal, mask=mask, offset=S - T)
    want, want_lse = reference(q, k, v, causal, mask, offset=S - T)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-12)


# ---- split-KV decoding and merging partial results --------------------------------------------
def _split_kv_case(T, S, n_splits, masked, seed, dtype=np.float64):
    """Drawn q, k, v and a mask with a fully masked chunk and a fully masked row, when masked."""
    rng = np.random.default_rng(seed)
    B, h = 2, 3
    q, k, v = _qkv(rng, B, h, T, S, 4, dtype)
    mask = None
    if masked:
        mask = rng.random((B, h, T, S)) < 0.6
        c = int(rng.integers(n_splits))  # one whole chunk hidden (may be empty when n_splits > S)
        mask[..., c * S // n_splits:(c + 1) * S // n_splits] = False
        mask[0, 1, rng.integers(T)] = False  # one query that may see nothing
    return q, k, v, mask


def _split_kv_error(T, S, n_splits, masked, seed):
    """Max difference of split_kv_attention from one-pass steps 3-6 (out and lse), float64."""
    q, k, v, mask = _split_kv_case(T, S, n_splits, masked, seed)
    out, lse = flash.split_kv_attention(q, k, v, mask=mask, n_splits=n_splits)
    want, want_lse = reference(q, k, v, mask=mask)
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse)), "fully masked rows: lse -inf"
    finite = np.isfinite(want_lse)
    return max(float(np.abs(out - want).max()),
               float(np.abs(lse[finite] - want_lse[finite]).max(initial=0.0)))


@settings(max_examples=80, deadline=None)
@given(T=st.integers(1, 3), S=st.integers(1, 40), n_splits=st.integers(1, 48),
       masked=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.filterwarnings("error")  # no RuntimeWarning from -inf - -inf or log(0)
def test_split_kv_equals_one_pass_softmax_attention(T, S, n_splits, masked, seed):
    assert _split_kv_error(T, S, n_splits, masked, seed) <= 1e-12


def _wrong_merge_average(out_a, lse_a, out_b, lse_b):
    """Planted bug: averages the chunks' normalised outputs instead of weighting them by their mass."""
    return (out_a + out_b) / 2, np.logaddexp(lse_a, lse_b)


def test_the_split_kv_check_catches_a_merge_without_reweighting(monkeypatch):
    assert _split_kv_error(2, 37, 4, False, 0) <= 1e-12
    monkeypatch.setattr(flash, "merge_partials", _wrong_merge_average)  # the name split-KV calls
    assert _split_kv_error(2, 37, 4, False, 0) > 1e-3


def test_split_kv_float32_within_a_derived_tolerance():
    q, k, v, mask = _split_kv_case(4, 4096, 8, True, 8, np.float32)
    golden, _ = reference(*(a.astype(np.float64) for a in (q, k, v)), mask=mask)
    plain, _ = reference(q, k, v, mask=mask)  # the whole-matrix float32 path
    out, lse = flash.split_kv_attention(q, k, v, mask=mask, n_splits=8)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    allowed = max(1e-6, 3 * float(np.abs(plain - golden).max()))
    assert float(np.abs(out - golden).max()) <= allowed


def test_both_paths_share_the_one_state_update(monkeypatch):
    """flash_attention and split_kv_attention fold keys in through the same flash._update."""
    calls = []
    real = flash._update
    monkeypatch.setattr(flash, "_update", lambda *a: calls.append(1) or real(*a))
    q, k, v = _qkv(np.random.default_rng(9), 1, 2, 3, 10, 4)
    flash.flash_attention(q, k, v, block_q=2, block_k=4)
    assert len(calls) == 2 * 3
    flash.split_kv_attention(q, k, v, n_splits=5)
    assert len(calls) == 2 * 3 + 5


def _merge_parts(merge, parts_order, seed, empty_part=False):
    """Keys split in three parts, each attended alone (normalised), merged in the given order."""
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, 2, 3, 4, 30, 4)
    mask = np.ones((4, 30), dtype=bool)
    if empty_part:
        mask[:, 10:20] = False  # part 1 holds no allowed key: lse -inf there
    cuts = [(0, 10), (10, 20), (20, 30)]
    parts = [flash.flash_attention(q, k[:, :, a:b], v[:, :, a:b], mask=mask[:, a:b]) for a, b in cuts]
    (i, j), rest = parts_order
    out, lse = merge(*parts[i], *parts[j])
    out, lse = merge(*parts[rest], out, lse) if rest != 1 else merge(out, lse, *parts[rest])
    want, want_lse = reference(q, k, v, mask=mask)
    return max(float(np.abs(out - want).max()), float(np.abs(lse - want_lse).max()))


ORDERS = [((0, 1), 2), ((1, 2), 0), ((2, 0), 1), ((1, 0), 2), ((2, 1), 0)]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("empty_part", [False, True])
@pytest.mark.filterwarnings("error")
def test_merge_partials_is_order_independent_and_equals_one_pass(order, empty_part):
    assert _merge_parts(numpy_attention.merge_partials, order, 10, empty_part) <= 1e-12


def _wrong_merge_sum(out_a, lse_a, out_b, lse_b):
    """Planted bug: adds the normalised outputs, as if each part held all the softmax mass."""
    return out_a + out_b, np.logaddexp(lse_a, lse_b)


def _wrong_merge_mean(out_a, lse_a, out_b, lse_b):
    """Planted bug: averages the normalised outputs, ignoring how much mass each part holds."""
    return (out_a + out_b) / 2, np.logaddexp(lse_a, lse_b)


@pytest.mark.parametrize("wrong", [_wrong_merge_sum, _wrong_merge_mean])
def test_the_merge_check_catches_a_merge_without_reweighting(wrong):
    assert _merge_parts(wrong, ORDERS[0], 10) > 1e-3


def test_merging_two_empty_sides_gives_zeros_and_minus_inf():
    out = np.ones((1, 1, 2, 3))
    lse = np.full((1, 1, 2), -np.inf)
    with np.errstate(all="raise"):
        got, got_lse = numpy_attention.merge_partials(out, lse, out, lse)
    assert np.array_equal(got, np.zeros_like(out)) and np.isneginf(got_lse).all()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_splits=0), ValueError, "n_splits must be >= 1, got 0"),
    (dict(n_splits=2.0), TypeError, "n_splits must be an int, got float 2.0"),
    (dict(mask=np.ones((3, 4), dtype=bool)), ValueError, r"mask must be \(T=1, S=6\)"),
])
def test_split_kv_bad_input_names_what_was_expected(kwargs, error, match):
    q, k, v = _qkv(np.random.default_rng(11), 1, 2, 1, 6, 4)
    with pytest.raises(error, match=match):
        flash.split_kv_attention(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=r"v must be \(B=1, h_kv=2, S=6, d_v\), got \(1, 2, 5, 4\)"):
        flash.split_kv_attention(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match=r"k and v must have a number of heads h_kv that divides q's h=2 .*got h_kv=3"):
        flash.split_kv_attention(q, np.zeros((1, 3, 6, 4)), v)


def test_merge_partials_bad_input_names_what_was_expected():
    out, lse = np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3))
    with pytest.raises(ValueError, match=r"out_b must be \(1, 2, 3, 4\), got \(1, 2, 3, 5\)"):
        numpy_attention.merge_partials(out, lse, np.zeros((1, 2, 3, 5)), lse)
    with pytest.raises(ValueError, match=r"lse_b must be \(1, 2, 3\), got \(1, 2, 4\)"):
        numpy_attention.merge_partials(out, lse, out, np.zeros((1, 2, 4)))
    with pytest.raises(TypeError, match="lse_a must be a floating-point array"):
        numpy_attention.merge_partials(out, np.zeros((1, 2, 3), dtype=int), out, lse)


# ---- float16: the running state, the accumulator and lse in float32 ---------------------------
HALF_ROUNDING = 2.0**-11  # one float16 rounding: at most half an ulp, 2^-11 of the value (10 bits kept)


def _golden(q, k, v, causal=False, offset=0):
    """Steps 3-6 and lse in float64 from the float16 inputs (exact there): the exact answer."""
    return reference(*(a.astype(np.float64) for a in (q, k, v)), causal=causal, offset=offset)


def _within_one_half_rounding(got, exact, work_err):
    """|got - exact| <= one float16 rounding of exact, plus the float32 work's error (elementwise)."""
    err = np.abs(got.astype(np.float64) - exact)
    bound = HALF_ROUNDING * (np.abs(exact) + work_err) + work_err + 2.0**-24  # 2^-24: float16's subnormal step
    return float((err / bound).max(initial=0.0))


def test_float16_large_scores_give_the_right_answer_not_nan():
    """q = k = 100 at d_k = 64: q.k / 8 = 80000 is past float16's 65504; the core gives 1, so must flash."""
    q = np.full((1, 1, 4, 64), 100, np.float16)
    k, v = np.full((1, 1, 16, 64), 100, np.float16), np.ones((1, 1, 16, 64), np.float16)
    with np.errstate(all="raise"):  # no overflow anywhere: the scores are float32
        out, lse = flash.flash_attention(q, k, v, block_q=2, block_k=4)
        split, split_lse = flash.split_kv_attention(q, k, v, n_splits=3)
    for o, ls in ((out, lse), (split, split_lse)):
        assert np.array_equal(o, np.ones_like(o)), f"expected all ones (v = 1), got {np.unique(o)}"
        np.testing.assert_allclose(ls, 80000 + math.log(16), rtol=2**-22)
        assert o.dtype == np.float16 and ls.dtype == np.float32


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 40), S=st.integers(1, 300), bq=st.integers(1, 48), bk=st.integers(1, 96),
       d_k=st.sampled_from([8, 64]), size=st.sampled_from([1.0, 4.0, 30.0]), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_float16_is_within_one_rounding_of_the_exact_answer(T, S, bq, bk, d_k, size, causal, seed):
    """out within one float16 rounding of the exact (float64) answer, lse within float32's error.

    Computed in float16 the running sum ell and the accumulator lose 2^-11 of themselves at every
    block and the scores overflow past 65504 (size 30 at d_k = 64: 7200 x 8); in float32 the only
    float16 error left is the final rounding of out. The float32 work's own error is bounded by
    d_k + S roundings of 2^-24 of the largest |q||k| product sum and |v|.
    """
    rng = np.random.default_rng(seed)
    q = (size * rng.normal(size=(1, 2, T, d_k))).astype(np.float16)
    k = (size * rng.normal(size=(1, 2, S, d_k))).astype(np.float16)
    v = rng.normal(size=(1, 2, S, d_k)).astype(np.float16)
    with np.errstate(over="raise", invalid="raise"):
        out, lse = flash.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    want, want_lse = _golden(q, k, v, causal)
    scores_abs = np.abs(q.astype(np.float64)) @ np.abs(k.astype(np.float64)).swapaxes(-1, -2) / math.sqrt(d_k)
    # float32's error: a score off by (d_k + 4) 2^-24 of its |q||k| sum moves out by twice that
    # times |v|; the sums over S keys add S roundings of 2^-24 of |v|
    work_err = 2.0**-24 * float(np.abs(v).max()) * (S + 4 + 2 * (d_k + 4) * float(scores_abs.max()))
    ratio = _within_one_half_rounding(out, want, work_err)
    assert ratio <= 1, f"out is {ratio:.2f} x one float16 rounding (+ float32 work) from the exact answer"
    finite = np.isfinite(want_lse)
    lse_bound = (d_k + S + 4) * 2.0**-24 * (float(scores_abs.max()) + 1) + math.log(S + 1) * 2.0**-23
    lse_err = float(np.abs(lse[finite] - want_lse[finite]).max(initial=0.0))
    assert lse_err <= lse_bound, f"lse off by {lse_err:.3g}, float32 allows {lse_bound:.3g}"
    assert out.dtype == np.float16 and lse.dtype == np.float32  # out rounded once, lse kept in float32


def test_float16_split_kv_and_the_one_pass_row_within_one_rounding():
    """Flash decoding and attend_one_pass keep their states in float32 too."""
    rng = np.random.default_rng(13)
    q = (4 * rng.normal(size=(1, 2, 1, 64))).astype(np.float16)  # one new token
    k = (4 * rng.normal(size=(1, 2, 2048, 64))).astype(np.float16)
    v = rng.normal(size=(1, 2, 2048, 64)).astype(np.float16)
    want, want_lse = _golden(q, k, v)
    work_err = (64 + 2048) * 2.0**-24 * float(np.abs(v).max())
    out, lse = flash.split_kv_attention(q, k, v, n_splits=8)
    assert _within_one_half_rounding(out, want, work_err) <= 1
    assert float(np.abs(lse - want_lse).max()) <= 1e-3
    assert out.dtype == np.float16 and lse.dtype == np.float32
    row = (q[0, 0, 0].astype(np.float32) @ k[0, 0].astype(np.float32).T / 8).astype(np.float16)  # (S,)
    one, m, ell = flash.attend_one_pass(flash.ScoreStream(row, 64), v[0, 0])
    w = np.exp(row.astype(np.float64) - row.max())
    exact = (w / w.sum()) @ v[0, 0].astype(np.float64)  # (d_v,)
    assert _within_one_half_rounding(one, exact, work_err) <= 1 and one.dtype == np.float16


def test_float16_partials_merge_in_float32():
    """Two float16 halves merged: the weights exp(lse_i - lse) in float32, out rounded once."""
    rng = np.random.default_rng(14)
    q, k, v = (rng.normal(size=(1, 2, n, 64)) for n in (8, 16, 16))  # (B, h, T|S, d_k)
    k[:, :, 8:] *= 4  # the second half holds most of the softmax mass
    q, k, v = (a.astype(np.float16) for a in (q, k, v))
    halves = [flash.flash_attention(q, k[:, :, a:a + 8], v[:, :, a:a + 8]) for a in (0, 8)]
    out, lse = numpy_attention.merge_partials(*halves[0], *halves[1])
    want, want_lse = _golden(q, k, v)
    work_err = 64 * 2.0**-24 * float(np.abs(v).max())
    # each half was rounded to float16 once already: allow its rounding and the merged one's
    assert _within_one_half_rounding(out, want, work_err + HALF_ROUNDING * float(np.abs(v).max())) <= 1
    assert float(np.abs(lse - want_lse).max()) <= 1e-4
    assert out.dtype == np.float16 and lse.dtype == np.float32


# ---- the causal tile skip at its edge ---------------------------------------------------------
@st.composite
def causal_edges(draw):
    """(T, S, offset, block_q, block_k, dead): a key block's first key is a query block's last visible key.

    Query t sees keys s <= t + offset. A query block is drawn, and a key block whose first key s0 is
    exactly what the block's last query t may still see (offset = s0 - t): a skip rule off by one
    towards skipping drops that tile. Keys from `dead` on (whole key blocks after T + offset) are
    seen by no query: a rule off by one the other way reads them.
    """
    bq, bk = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    T = draw(st.integers(1, 4 * bq))
    t_last = min(draw(st.integers(0, (T - 1) // bq)) * bq + bq, T) - 1  # a query block's last query
    s0 = draw(st.integers(0, 4)) * bk  # a key block's first key
    offset = s0 - t_last
    dead = -(-(T + offset) // bk) * bk  # the first whole key block no query may see
    S = max(s0 + draw(st.integers(1, 2 * bk)), dead + draw(st.integers(0, 2 * bk)))
    return T, S, offset, bq, bk, min(dead, S)


def edge_case(T, S, offset, dead, seed=0, d=4):
    """q, k, v drawn, and k, v with the keys no query may see set to NaN (a kernel must not read them)."""
    q, k, v = _qkv(np.random.default_rng(seed), 2, 2, T, S, d)
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[:, :, dead:], v_nan[:, :, dead:] = np.nan, np.nan  # (B, h, S - dead, d): never visible
    return q, k, v, k_nan, v_nan


def _forward_edge_error(T, S, offset, bq, bk, dead, seed=0):
    """Max error of the tiled forward (unseen keys NaN) against the steps (clean keys); inf for NaN."""
    q, k, v, k_nan, v_nan = edge_case(T, S, offset, dead, seed)
    out, lse = flash.flash_attention(q, k_nan, v_nan, causal=True, block_q=bq, block_k=bk, offset=offset)
    want, want_lse = reference(q, k, v, causal=True, offset=offset)
    if not (np.isfinite(out).all() and np.array_equal(np.isneginf(lse), np.isneginf(want_lse))):
        return math.inf  # a key no query may see was read
    finite = np.isfinite(want_lse)
    return max(float(np.abs(out - want).max(initial=0.0)),
               float(np.abs(lse[finite] - want_lse[finite]).max(initial=0.0)))


@settings(max_examples=80, deadline=None)
@given(case=causal_edges(), seed=st.integers(0, 2**16))
@pytest.mark.filterwarnings("ignore:invalid value")  # NaN keys, read only by a wrong skip
def test_the_forward_tile_skip_at_its_edge(case, seed):
    T, S, offset, bq, bk, dead = case
    kinds = flash.tile_schedule(T, S, bq, bk, offset=offset)
    edge = [(i, j) for i in range(kinds.shape[0]) for j in range(kinds.shape[1])
            if j * bk == min((i + 1) * bq, T) - 1 + offset]  # first key == the block's last visible
    assert edge and all(kinds[i, j] != flash.SKIPPED for i, j in edge), "the draw reaches the edge"
    assert (kinds[:, dead // bk:] == flash.SKIPPED).all()  # the NaN keys: whole skipped blocks
    assert _forward_edge_error(T, S, offset, bq, bk, dead, seed) <= 1e-12


def planted(fn, old: str, new: str, module=flash):
    """A copy of a function of `module` with one piece of its source replaced: a planted bug."""
    import inspect
    import textwrap
    src = textwrap.dedent(inspect.getsource(fn))
    assert src.count(old) == 1, f"{old!r} is not (once) in {fn.__name__}"
    namespace = dict(vars(module))
    exec(compile(src.replace(old, new), f"<planted {fn.__name__}>", "exec"), namespace)
    return namespace[fn.__name__]


FORWARD_SKIP = "none = none | (k_lo > q_hi)"  # MaskSpec.tile_kinds' causal rule: tile_schedule lowers to it
FORWARD_OFF_BY_ONE = {"drops the tile whose first key is the last visible": "none = none | (k_lo >= q_hi)",
                      "reads a tile no query of the block may see": "none = none | (k_lo > q_hi + 1)"}
EDGE = (29, 45, 7, 8, 6, 36)  # T, S, offset, blocks 8 x 6; keys 36.. unseen (lesson 15's case)


@pytest.mark.parametrize("wrong", list(FORWARD_OFF_BY_ONE))
@pytest.mark.filterwarnings("ignore:invalid value")
def test_the_edge_check_catches_a_forward_skip_off_by_one(wrong, monkeypatch):
    assert _forward_edge_error(*EDGE) <= 1e-12
    monkeypatch.setattr(masking.MaskSpec, "_position_tiles", planted(
        masking.MaskSpec._position_tiles, FORWARD_SKIP, FORWARD_OFF_BY_ONE[wrong], masking))
    assert _forward_edge_error(*EDGE) > 1e-3, f"the edge case could not tell: {wrong}"


# ---- bad input: a clear error naming what was expected and what arrived ----------------------
def _bad_calls():
    q, k, v = _qkv(np.random.default_rng(15), 1, 2, 5, 7, 4)
    out, lse = flash.flash_attention(q, k, v)
    mask = np.ones((5, 7), dtype=bool)
    torch = pytest.importorskip("torch")
    return [
        ("mask where causal goes", lambda: flash.flash_attention(q, k, v, mask), TypeError,
         r"causal must be True or False, got ndarray of shape \(5, 7\) \(a mask\? pass it as mask=...\)"),
        ("causal a string", lambda: flash.tile_schedule(4, 4, 2, 2, causal="no"), TypeError,
         "causal must be True or False, got str 'no'"),
        ("backward: mask where causal goes", lambda: flash.flash_attention_backward(q, k, v, out, lse, out, mask),
         TypeError, "causal must be True or False"),
        ("torch tensors", lambda: flash.flash_attention(*(torch.tensor(a) for a in (q, k, v))), TypeError,
         r"q must be a numpy array, got Tensor \(for tensors use mha.attention.triton_flash, or .numpy\(\)\)"),
        ("split-KV torch", lambda: flash.split_kv_attention(q, torch.tensor(k), v), TypeError,
         "k must be a numpy array, got Tensor"),
        ("backward torch dout", lambda: flash.flash_attention_backward(q, k, v, out, lse, torch.tensor(out)),
         TypeError, "dout must be a numpy array, got Tensor"),
        ("mixed dtypes", lambda: flash.flash_attention(q.astype(np.float16), k, v), TypeError,
         "q, k, v must share one dtype .*, got float16, float64, float64"),
        ("backward dout of another dtype", lambda: flash.flash_attention_backward(
            q, k, v, out, lse, out.astype(np.float32)), TypeError,
         r"dout must have the dtype of q, k, v \(float64\), got float32"),
        ("block_q a bool", lambda: flash.flash_attention(q, k, v, block_q=True), TypeError,
         "block_q must be an int, got bool True"),
        ("block_k a float", lambda: flash.flash_attention_backward(q, k, v, out, lse, out, block_k=2.0),
         TypeError, "block_k must be an int, got float 2.0"),
        ("empty_state of ints", lambda: flash.empty_state((2,), 3, 4, np.int64), TypeError,
         "dtype must be a floating-point dtype .*, got int64"),
        ("empty_state negative rows", lambda: flash.empty_state((2,), -1, 4, np.float64), ValueError,
         "rows must be >= 0, got -1"),
        ("three passes over an array", lambda: flash.softmax_three_passes(np.ones(3)), TypeError,
         r"scores must be a ScoreStream \(flash.ScoreStream\(row, block\)\), got ndarray"),
        ("one pass over an array", lambda: flash.attend_one_pass(np.ones(3), np.ones((3, 2))), TypeError,
         "scores must be a ScoreStream"),
    ]


@pytest.mark.parametrize("name", [c[0] for c in _bad_calls()])
def test_bad_input_in_any_public_function_names_what_was_expected(name):
    [(call, error, match)] = [c[1:] for c in _bad_calls() if c[0] == name]
    with pytest.raises(error, match=match):
        call()
