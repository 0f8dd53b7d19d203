"""Positions and variants (mha.attention.positions): RoPE, ALiBi, GQA/MQA, sliding windows, FlexAttention.

References used here, each independent of the code under test:
  * RoPE: complex multiplication, (x1 + i x2) e^{i m theta}, written from the formula;
  * RoPE's direction: unit vectors turned by hand-worked angles (a clockwise RoPE is relative too);
  * ALiBi slopes: the paper's recursive rule, rewritten here, and values worked out by hand;
  * sliding windows: flash-attn's documented window_size rule and Hugging Face's mask function;
  * attention: tests/reference.attention_loops (plain loops), and torch SDPA called directly
    on q, k, v built with einsum from the numpy weights (float64, 1e-12);
  * float32: tolerances derived from the float32 math path's own error (mha.perf.bench).
Every named check is shown failing on the bug it names.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask

from mha import checks, steps
from mha.attention import masks, numpy_attention, posenc, positions, torch_attention
from mha.attention.masking import MaskSpec
from mha.attention.posenc import (
    alibi_bias,
    alibi_slopes,
    rope,
    rope_tables,
    rotate_half,
    rotate_pairs,
)
from mha.attention.positions import (
    attend,
    flex_attend,
    flex_spec,
    gqa_from_mha,
    gqa_param_count,
    rope_scores,
    torch_attend,
    torch_flex_attend,
)
from mha.inference.kv_cache import KVCache, TorchKVCache
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import MultiHeadAttention as TorchMHA
from mha.perf.bench import derived_tolerance
from mha_course.diagnose.positions import ROPE_BUGS, check_relative
from tests.reference import attention_loops

EAGER_FLEX = "ignore:flex_attention called without torch.compile"
BACKENDS = ["numpy", "torch"]


def _as(backend: str, a: np.ndarray):
    return torch.from_numpy(a) if backend == "torch" else a


def _np(a) -> np.ndarray:
    return a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def complex_rope(x: np.ndarray, pos: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Half-split RoPE as complex multiplication: feature i + i * feature(i + d/2), times e^{i p theta_i}."""
    half = x.shape[-1] // 2
    theta = base ** (-2.0 * np.arange(half) / x.shape[-1])
    z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * np.outer(pos, theta))  # (..., T, d/2)
    return np.concatenate([z.real, z.imag], axis=-1)


def adjacent_rope(x: np.ndarray, pos: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """RoFormer / GPT-J / Meta-Llama convention: pairs (2i, 2i+1), as complex numbers."""
    half = x.shape[-1] // 2
    theta = base ** (-2.0 * np.arange(half) / x.shape[-1])
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * np.outer(pos, theta))
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


# ---- RoPE ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_equals_complex_multiplication(rng, backend):
    x = rng.normal(size=(2, 3, 7, 16))  # (B, h, T, d_k)
    pos = np.array([0, 1, 2, 5, 40, 300, 4095])
    for p in (None, pos):
        want = complex_rope(x, np.arange(7) if p is None else pos)
        got = _np(rope(_as(backend, x), None if p is None else _as(backend, p)))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_half_split_and_adjacent_pairs_differ_by_a_fixed_permutation(rng):
    q, k = rng.normal(size=(1, 2, 5, 8)), rng.normal(size=(1, 2, 6, 8))
    perm = np.r_[0:8:2, 1:8:2]  # adjacent layout -> half layout: (0, 2, 4, 6, 1, 3, 5, 7)
    inv = np.argsort(perm)
    pq, pk = np.arange(5) + 1, np.arange(6)
    np.testing.assert_allclose(adjacent_rope(q, pq), rope(q[..., perm], pq)[..., inv], atol=1e-12)
    # ... so the scores agree when q and k are permuted alike (what a weight permutation does)
    adj = steps.scaled_scores(adjacent_rope(q, pq), adjacent_rope(k, pk))
    np.testing.assert_allclose(rope_scores(q[..., perm], k[..., perm], pq, pk), adj, atol=1e-12)
    # but the two conventions are NOT interchangeable on the same features
    assert np.abs(adjacent_rope(q, pq) - rope(q, pq)).max() > 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_preserves_norms_of_every_pair(rng, backend):
    x = rng.normal(size=(2, 4, 9, 12))
    y = _np(rope(_as(backend, x), _as(backend, np.arange(9) * 111)))
    pair = lambda a: a[..., :6] ** 2 + a[..., 6:] ** 2  # noqa: E731  (B, h, T, d_k/2)
    np.testing.assert_allclose(pair(y), pair(x), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shift", [1, 100, 1000])
def test_rope_scores_depend_only_on_the_offset(rng, backend, shift):
    q, k = rng.normal(size=(2, 3, 6, 16)), rng.normal(size=(2, 3, 9, 16))
    pq, pk = np.arange(6) + 3, np.arange(9)

    def scores(a, b):
        qq, kk = rope(_as(backend, q), _as(backend, pq + a)), rope(_as(backend, k), _as(backend, pk + b))
        return _np(qq @ kk.swapaxes(-1, -2)) / 4.0  # (B, h, T, S)

    base = scores(0, 0)
    np.testing.assert_allclose(scores(shift, shift), base, rtol=0, atol=1e-12)
    assert np.abs(scores(0, 1) - base).max() > 1e-3  # and they do depend on the offset


def test_rope_numpy_equals_torch_and_keeps_dtype(rng):
    x = rng.normal(size=(2, 2, 5, 8))
    pos = np.array([7, 8, 9, 10, 11])
    np.testing.assert_allclose(_np(rope(torch.from_numpy(x), torch.from_numpy(pos))), rope(x, pos),
                               rtol=0, atol=1e-15)
    x32 = x.astype(np.float32)
    for got in (rope(x32, pos), rope(torch.from_numpy(x32), pos)):
        assert str(got.dtype).endswith("float32")
        # each output is a cos - b sin with float32 a, b and tables rounded once to float32: at most a
        # few ulps of (|a| + |b|); 4 eps * 2 max|x| bounds that with room
        bound = 4 * np.finfo(np.float32).eps * 2 * np.abs(x32).max()
        assert np.abs(_np(got).astype(np.float64) - rope(x32.astype(np.float64), pos)).max() <= bound


def test_rope_of_a_chunk_with_shifted_positions_equals_the_full_sequence_rows(rng):
    x = rng.normal(size=(1, 2, 8, 8))
    np.testing.assert_allclose(rope(x[:, :, 5:], np.arange(5, 8)), rope(x)[:, :, 5:], atol=1e-15)


def test_rope_has_gradients_in_torch():
    x = torch.randn(1, 2, 4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: rope(a, torch.arange(4) + 3), (x,))


@pytest.mark.parametrize(("x", "positions", "error", "words"), [
    (np.zeros((3, 5)), None, ValueError, "d_k must be even, got d_k=5"),
    (np.zeros(4), None, ValueError, "at least 2-D, got (4,)"),
    (np.zeros((3, 4)), np.arange(4), ValueError, "positions must be (T=3,)"),
    (np.zeros((3, 4)), np.array([0.0, 1.0, 2.0]), TypeError, "whole numbers"),
    (np.zeros((3, 4), dtype=int), None, TypeError, "floating-point"),
])
def test_rope_rejects_bad_input_naming_expected_and_got(x, positions, error, words):
    with pytest.raises(error, match=None) as info:
        rope(x, positions)
    assert words in str(info.value)
    with pytest.raises(ValueError, match="base must be a number > 1"):
        rope(np.zeros((3, 4)), base=0.5)


# ---- RoPE's direction: the relative property holds either way, so it is fixed by values ----------
# (position m, pairing, feature set to 1, the two features of its pair, the pair after the turn),
# worked out from the formula (x_i, x_j) -> (x_i cos - x_j sin, x_i sin + x_j cos), angle m * theta_i,
# theta_i = 10000^(-2i/d_k) with d_k = 8: theta_0 = 1, theta_1 = 0.1.
TURNS = [
    (1, "half", 0, (0, 4), (math.cos(1.0), math.sin(1.0))),  # (1, 0) -> (cos, sin): counter-clockwise
    (1, "half", 4, (0, 4), (-math.sin(1.0), math.cos(1.0))),  # (0, 1) -> (-sin, cos)
    (3, "half", 1, (1, 5), (math.cos(0.3), math.sin(0.3))),  # pair 1 at position 3: angle 0.3
    (2, "interleaved", 0, (0, 1), (math.cos(2.0), math.sin(2.0))),  # RoFormer's adjacent pairs
    (5, "interleaved", 3, (2, 3), (-math.sin(0.5), math.cos(0.5))),  # pair 1, (0, 1), angle 0.5
]


def assert_turns_counter_clockwise(rope_fn, backend: str = "numpy") -> None:
    """Each unit vector turns within its own pair to the values worked out above."""
    for m, pairing, i, pair, want in TURNS:
        e = np.zeros((1, 1, 1, 8))  # (B, h, T=1, d_k)
        e[..., i] = 1.0
        got = _np(rope_fn(_as(backend, e), _as(backend, np.array([m])), pairing=pairing))[0, 0, 0]
        assert np.allclose(got[list(pair)], want, rtol=0, atol=1e-15), (m, pairing, i, got)
        assert not np.delete(got, pair).any(), f"the rotation leaked out of pair {pair}: {got}"


def _clockwise(x, positions, pairing="half"):
    """PLANTED: the sign of sin flipped (positions negated), for q and k alike."""
    return rope(x, -np.asarray(positions), pairing=pairing)


def _rotate_half_flipped(x, positions, pairing="half"):
    """PLANTED: the quarter turn written the other way round, cat(x2, -x1): x cos - rotate_half(x) sin."""
    cos, sin = rope_tables(np.asarray(positions), x.shape[-1], pairing=pairing)  # 2 x (T, d_k)
    turn = rotate_half if pairing == "half" else rotate_pairs
    return x * cos - turn(x) * sin


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_turns_each_pair_counter_clockwise(backend):
    assert_turns_counter_clockwise(rope, backend)


@pytest.mark.parametrize("planted", [_clockwise, _rotate_half_flipped])
def test_the_direction_check_fails_on_a_planted_clockwise_rope(planted):
    with pytest.raises(AssertionError):
        assert_turns_counter_clockwise(planted)


def test_a_clockwise_rope_is_relative_too_so_only_values_catch_it(rng):
    # check_relative passes it: the offset property cannot see the direction ...
    assert check_relative(lambda q, k, pq, pk: steps.scaled_scores(_clockwise(q, pq), _clockwise(k, pk)))
    # ... because it is the usual rotation of q and k with the second feature of every pair negated
    flip = np.r_[np.ones(4), -np.ones(4)]  # (d_k,): half split, pair i = (i, i + 4)
    x = rng.normal(size=(1, 2, 5, 8))
    np.testing.assert_allclose(_clockwise(x, np.arange(5)), rope(x * flip, np.arange(5)) * flip, atol=1e-15)


# ---- the named check: check_relative ---------------------------------------------------------
def test_check_relative_passes_rope_and_the_adjacent_pair_convention():
    assert check_relative(rope_scores).startswith("relative: scores unchanged")

    def adjacent(q, k, pq, pk):  # a different but correct RoPE
        return steps.scaled_scores(adjacent_rope(q, pq), adjacent_rope(k, pk))
    assert check_relative(adjacent).startswith("relative:")


@pytest.mark.parametrize("name", list(ROPE_BUGS))
def test_check_relative_catches_and_names_each_planted_bug(name):
    bug, why = ROPE_BUGS[name]
    with pytest.raises(AssertionError) as info:
        check_relative(bug)
    assert f"likely cause ({name}): {why}" in str(info.value)


def test_check_relative_names_a_bug_by_its_numbers_not_by_its_identity():
    def my_q_only(q, k, pq, pk):  # a student's own "rotate q, forget k", via complex numbers
        return np.einsum("bhtd,bhsd->bhts", complex_rope(q, pq), k) / math.sqrt(q.shape[-1])
    with pytest.raises(AssertionError, match=r"absolute positions.*\(q_only\)"):
        check_relative(my_q_only)


def test_check_relative_names_no_cause_when_no_planted_bug_matches():
    with pytest.raises(AssertionError) as info:
        check_relative(lambda q, k, pq, pk: 2.0 * rope_scores(q, k, pq, pk))  # scale doubled
    msg = str(info.value)
    assert "rotations should cancel" in msg and "matches none of the usual mistakes" in msg
    with pytest.raises(AssertionError, match=r"must return scores \(B, h, T, S\) = \(1, 2, 4, 6\)"):
        check_relative(lambda q, k, pq, pk: rope_scores(q, k, pq, pk)[0])


# ---- ALiBi ------------------------------------------------------------------------------------
def paper_slopes(n: int) -> list[float]:
    """The ALiBi paper's rule, rewritten: geometric from 2^(-8/n); else fill in from 2n."""
    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_two(p) + paper_slopes(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("n", range(1, 41))
def test_alibi_slopes_follow_the_paper(n):
    np.testing.assert_allclose(alibi_slopes(n), paper_slopes(n), rtol=1e-14, atol=0)


def test_alibi_slopes_for_eight_heads_are_one_half_to_one_256th():
    np.testing.assert_array_equal(alibi_slopes(8), [2.0**-i for i in range(1, 9)])



# The paper's slopes worked out by hand (not by any rule in code): n a power of two gives
# 2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise the p = 2^floor(log2 n) slopes of p heads, then
# the 2p-head sequence's slopes 1, 3, 5, ... (every other, from its first) until there are n.
PAPER_SLOPES = {
    1: [2**-8],  # 2^(-8/1)
    3: [2**-4, 2**-8, 2**-2],  # p = 2: 1/16, 1/256; the 4-head 2^-2, 2^-4, ... gives 2^-2
    6: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3],  # p = 4; the 8-head 2^-1 .. 2^-8 gives 2^-1, 2^-3
    8: [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8],  # 1/2 .. 1/256
    12: [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8,  # p = 8; the 16-head sequence
         2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5],  # 2^-0.5, 2^-1, ... gives 2^-0.5, 2^-1.5, ...
}


def assert_paper_slopes(slopes_fn) -> None:
    """slopes_fn(n) equals the hand-worked slopes for every n of PAPER_SLOPES."""
    for n, want in PAPER_SLOPES.items():
        got = np.asarray(slopes_fn(n))
        assert got.shape == (n,) and np.allclose(got, want, rtol=1e-15, atol=0), (n, got, want)


def _geometric(n):
    return 2.0 ** (-8.0 * np.arange(1, n + 1) / n)


PLANTED_SLOPES = {
    "exponent from 0": lambda n: 2.0 ** (-8.0 * np.arange(0, n) / n),  # 1, ..., 2^(-8 + 8/n)
    "one head too many": lambda n: 2.0 ** (-8.0 * np.arange(1, n + 1) / (n + 1)),
    "geometric for every n": _geometric,  # ignores the rule for n not a power of two
    "odd slopes of 2p": lambda n: np.concatenate([  # the other half of the 2p-head sequence
        _geometric(2 ** int(math.log2(n))), _geometric(2 ** (int(math.log2(n)) + 1))[1::2]
    ])[:n] if not math.log2(n).is_integer() else _geometric(n),
}


def test_alibi_slopes_equal_the_values_worked_out_by_hand():
    assert_paper_slopes(alibi_slopes)


@pytest.mark.parametrize("name", list(PLANTED_SLOPES))
def test_the_slope_check_fails_on_each_planted_off_by_one(name):
    with pytest.raises(AssertionError):
        assert_paper_slopes(PLANTED_SLOPES[name])

def test_alibi_bias_values_shape_and_offset():
    b = alibi_bias(4, 5)
    assert b.shape == (4, 5, 5) and b.dtype == np.float64
    s = alibi_slopes(4)
    for t in range(5):
        for j in range(5):
            assert b[:, t, j].tolist() == (-s * abs(t - j)).tolist()  # behind and ahead alike
    np.testing.assert_array_equal(np.diagonal(b, axis1=1, axis2=2), 0.0)
    # a chunk of 3 queries after 5 cached keys sees the bottom rows of the full bias
    np.testing.assert_array_equal(alibi_bias(4, 3, 8, offset=5), alibi_bias(4, 8)[:, 5:, :])
    t = posenc.torch_alibi_bias(4, 5, dtype=torch.float64)
    np.testing.assert_array_equal(t.numpy(), b)


@pytest.mark.parametrize("n", [0, -3])
def test_alibi_rejects_non_positive_heads(n):
    with pytest.raises(ValueError, match=f"n_heads must be >= 1, got {n}"):
        alibi_slopes(n)
    with pytest.raises(ValueError, match=f"n_heads must be >= 1, got {n}"):
        alibi_bias(n, 4)
    with pytest.raises(TypeError, match="n_heads must be an int"):
        alibi_bias(2.0, 4)


def test_alibi_attention_equals_sdpa_with_the_float_mask(rng):
    q, k, v = (rng.normal(size=(2, 6, 7, 4)) for _ in range(3))  # (B, h, T, d_k)
    bias = alibi_bias(6, 7)  # (h, T, S)
    tril = steps.causal_mask(7)
    ours = steps.weighted_sum(steps.softmax(steps.apply_mask(steps.scaled_scores(q, k) + bias, tril)), v)
    attn_mask = torch.from_numpy(bias).masked_fill(~torch.from_numpy(tril), float("-inf"))
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=attn_mask)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=0, atol=1e-12)


# ---- attend / torch_attend: the seven steps with positions --------------------------------------
def _mha(rng, d_model=24, n_heads=4, dtype=np.float64) -> MultiHeadAttention:
    """A module with nonzero biases (zero biases would hide a bias applied twice or never)."""
    m = MultiHeadAttention(d_model, n_heads, seed=3, dtype=dtype)
    m.bq, m.bk, m.bv, m.bo = (rng.normal(size=d_model).astype(dtype) for _ in range(4))
    return m


def _gqa(rng, d_model=24, n_heads=4, n_kv_heads=2, dtype=np.float64) -> MultiHeadAttention:
    g = MultiHeadAttention(d_model, n_heads, seed=3, dtype=dtype, n_kv_heads=n_kv_heads)
    g.bq, g.bo = (rng.normal(size=d_model).astype(dtype) for _ in range(2))
    g.bk, g.bv = (rng.normal(size=g.bk.shape).astype(dtype) for _ in range(2))
    return g


def sdpa_reference(m, x, rope_on=False, bias=None, allowed=None) -> np.ndarray:
    """Independent path: einsum projections, explicit repeat of kv heads, complex RoPE, SDPA core."""
    h, d_k = m.n_heads, m.d_k
    h_kv = getattr(m, "n_kv_heads", h)
    B, T, _ = x.shape
    q = (np.einsum("btd,de->bte", x, m.Wq) + m.bq).reshape(B, T, h, d_k).transpose(0, 2, 1, 3)
    k = (np.einsum("btd,de->bte", x, m.Wk) + m.bk).reshape(B, T, h_kv, d_k).transpose(0, 2, 1, 3)
    v = (np.einsum("btd,de->bte", x, m.Wv) + m.bv).reshape(B, T, h_kv, d_k).transpose(0, 2, 1, 3)
    if rope_on:
        q, k = complex_rope(q, np.arange(T)), complex_rope(k, np.arange(T))
    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    kt, vt = kt.repeat_interleave(h // h_kv, dim=1), vt.repeat_interleave(h // h_kv, dim=1)
    mask = None if bias is None else torch.from_numpy(bias).expand(B, h, T, T).clone()
    if allowed is not None:
        a = torch.from_numpy(np.broadcast_to(allowed, (B, h, T, T)).copy())
        mask = a if mask is None else mask.masked_fill(~a, float("-inf"))
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)  # (B, h, T, d_k)
    merged = out.transpose(1, 2).reshape(B, T, h * d_k).numpy()
    return merged @ m.Wo + m.bo


VARIANTS = [dict(), dict(rope=True), dict(alibi=True), dict(rope=True, alibi=True)]


@pytest.mark.parametrize("kind", ["mha", "gqa", "mqa"])
@pytest.mark.parametrize("variant", VARIANTS, ids=["plain", "rope", "alibi", "rope+alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_attend_numpy_equals_torch_and_an_independent_sdpa_reference(rng, kind, variant, causal):
    m = _mha(rng) if kind == "mha" else _gqa(rng, n_kv_heads=2 if kind == "gqa" else 1)
    tm = TorchMHA.from_numpy(m)
    x = rng.normal(size=(2, 7, 24))
    out = attend(m, x, causal=causal, **variant)
    with torch.no_grad():
        tout = torch_attend(tm, torch.from_numpy(x), causal=causal, **variant).numpy()
    bias = alibi_bias(m.n_heads, 7) if variant.get("alibi") else None
    ref = sdpa_reference(m, x, variant.get("rope", False), bias, steps.causal_mask(7) if causal else None)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tout, ref, rtol=0, atol=1e-12)
    checks.check_rows_sum_to_one(m.attn, atol=1e-12)
    assert m.attn.shape == (2, 4, 7, 7)


def test_attend_without_positions_is_the_module_and_the_loop_reference(rng):
    m = _mha(rng)
    x, ctx = rng.normal(size=(2, 5, 24)), rng.normal(size=(2, 7, 24))
    mask = rng.random((2, 5, 7)) < 0.7
    mask[:, :, 0] = True
    out = attend(m, x, ctx, mask=mask)
    np.testing.assert_array_equal(out, m(x, ctx, mask=mask))
    ref, w = attention_loops(m, x, ctx, np.broadcast_to(mask[:, None], (2, 4, 5, 7)))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.attn, w, rtol=0, atol=1e-12)


def test_alibi_weights_are_the_softmax_of_scores_plus_bias(rng):
    m = _mha(rng)
    x = rng.normal(size=(1, 6, 24))
    attend(m, x, causal=True, alibi=True)
    q = steps.split_heads(steps.linear(x, m.Wq, m.bq), 4)
    k = steps.split_heads(steps.linear(x, m.Wk, m.bk), 4)
    want = steps.softmax(steps.apply_mask(steps.scaled_scores(q, k) + alibi_bias(4, 6), steps.causal_mask(6)))
    np.testing.assert_allclose(m.attn, want, rtol=0, atol=1e-15)


def test_without_positions_attention_cannot_tell_order_and_rope_can(rng):
    m = _mha(rng)
    x = rng.normal(size=(1, 6, 24))
    perm = np.array([1, 0, 2, 3, 5, 4])
    for use_rope in (False, True):
        out, out_perm = attend(m, x, rope=use_rope), attend(m, x[:, perm], rope=use_rope)
        gap = np.abs(out_perm - out[:, perm]).max()
        if use_rope:
            assert gap > 1e-2, "with RoPE, reordering tokens must change more than the order of outputs"
        else:
            assert gap <= 1e-12, f"without positions the outputs must just reorder, got gap {gap:.3g}"


def test_attend_float32_within_a_derived_tolerance(rng):
    m64 = _mha(rng)
    m32 = MultiHeadAttention(24, 4, dtype=np.float32)
    for name in ("Wq", "bq", "Wk", "bk", "Wv", "bv", "Wo", "bo"):  # same rounded weights
        setattr(m32, name, getattr(m64, name).astype(np.float32))
        setattr(m64, name, getattr(m32, name).astype(np.float64))
    x32 = rng.normal(size=(2, 9, 24)).astype(np.float32)
    golden = attend(m64, x32.astype(np.float64), causal=True, rope=True, alibi=True)
    plain32 = m32(x32, causal=True)  # the float32 math path without positions sets the scale
    _, allowed = derived_tolerance(m64(x32.astype(np.float64), causal=True), plain32, torch.float32)
    for out in (attend(m32, x32, causal=True, rope=True, alibi=True),
                torch_attend(TorchMHA.from_numpy(m32), torch.from_numpy(x32), causal=True, rope=True,
                             alibi=True).detach().numpy()):
        assert out.dtype == np.float32
        err = float(np.abs(out.astype(np.float64) - golden).max())
        assert err <= allowed, f"float32 error {err:.3g} > allowed {allowed:.3g}"


# ---- GQA / MQA ----------------------------------------------------------------------------------
def test_gqa_with_as_many_kv_heads_as_heads_is_multi_head_attention(rng):
    x = rng.normal(size=(2, 6, 24))
    mask = masks.padding_mask(np.array([6, 4]), 6, causal=True)
    g, m = MultiHeadAttention(24, 4, seed=5, n_kv_heads=4), MultiHeadAttention(24, 4, seed=5)
    for a, b in zip(g.parameters(), m.parameters(), strict=True):
        np.testing.assert_array_equal(a, b)  # same draws, same order
    np.testing.assert_array_equal(g(x, mask=mask), m(x, mask=mask))
    tg = TorchMHA(24, 4, seed=5, dtype=torch.float64, n_kv_heads=4)
    tm = TorchMHA(24, 4, seed=5, dtype=torch.float64)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        np.testing.assert_allclose(tg(xt, causal=True).numpy(), tm(xt, causal=True).numpy(), atol=1e-12)


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_gqa_equals_sdpa_enable_gqa_and_explicitly_repeated_heads(rng, n_kv):
    g = _gqa(rng, 32, 8, n_kv)
    x = rng.normal(size=(2, 5, 32))
    out = g(x, causal=True)
    ref = sdpa_reference(g, x, allowed=steps.causal_mask(5))  # explicit repeat_interleave + SDPA
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        for use_enable_gqa in (True, False):
            tg = TorchMHA.from_numpy(g, use_enable_gqa=use_enable_gqa)
            np.testing.assert_allclose(tg(xt, causal=True).numpy(), ref, rtol=0, atol=1e-12)
        # SDPA's enable_gqa on the unrepeated heads, called directly
        q = torch.from_numpy(steps.split_heads(steps.linear(x, g.Wq, g.bq), 8))
        k = torch.from_numpy(steps.split_heads(steps.linear(x, g.Wk, g.bk), n_kv))
        v = torch.from_numpy(steps.split_heads(steps.linear(x, g.Wv, g.bv), n_kv))
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        direct = steps.linear(steps.merge_heads(heads.numpy()), g.Wo, g.bo)
    np.testing.assert_allclose(direct, ref, rtol=0, atol=1e-12)


def test_repeat_kv_numpy_equals_repeat_interleave_and_groups_heads_in_order(rng):
    k = rng.normal(size=(2, 3, 4, 5))  # (B, h_kv, S, d_k)
    r = numpy_attention.repeat_kv(k, 4)
    assert r.shape == (2, 12, 4, 5)
    for j in range(12):
        np.testing.assert_array_equal(r[:, j], k[:, j // 4])  # query head j reads kv head j // g
    np.testing.assert_array_equal(torch_attention.repeat_kv(torch.from_numpy(k), 4).numpy(), r)
    np.testing.assert_array_equal(torch.from_numpy(k).repeat_interleave(4, dim=1).numpy(), r)
    assert numpy_attention.repeat_kv(k, 1) is k


@pytest.mark.parametrize(("d_model", "h", "h_kv"), [(24, 4, 4), (24, 4, 2), (24, 4, 1), (64, 8, 2),
                                                   (48, 12, 3)])
def test_parameter_count_formula(d_model, h, h_kv):
    g = MultiHeadAttention(d_model, h, n_kv_heads=h_kv)
    want = gqa_param_count(d_model, h, h_kv)
    assert g.num_parameters() == want
    assert sum(p.numel() for p in TorchMHA(d_model, h, n_kv_heads=h_kv).parameters()) == want
    if h_kv == h:
        assert want == checks.expected_param_count(d_model) == MultiHeadAttention(d_model, h).num_parameters()


@pytest.mark.parametrize("h_kv", [1, 2, 4, 8])
def test_kv_cache_bytes_shrink_by_the_group_size(h_kv):
    m = MultiHeadAttention(64, 8, dtype=np.float32)
    g = MultiHeadAttention(64, 8, dtype=np.float32, n_kv_heads=h_kv)
    mha_bytes = KVCache.for_module(m, 2, 100).nbytes
    assert g.new_cache(2, 100).nbytes * (8 // h_kv) == mha_bytes == 2 * 2 * 8 * 100 * 8 * 4
    tg = TorchMHA(64, 8, n_kv_heads=h_kv)
    assert tg.new_cache(2, 100).nbytes == g.new_cache(2, 100).nbytes
    assert isinstance(tg.new_cache(2, 100), TorchKVCache)


@pytest.mark.parametrize(("h", "h_kv", "error", "words"), [
    (4, 3, ValueError, "n_kv_heads=3 must divide n_heads=4"),
    (6, 4, ValueError, "n_kv_heads could be one of 1, 2, 3, 6"),
    (4, 8, ValueError, "n_kv_heads=8 must divide n_heads=4"),
    (4, 0, ValueError, "n_kv_heads must be >= 1, got 0"),
    (4, 2.0, TypeError, "n_kv_heads must be an int"),
])
def test_gqa_rejects_bad_kv_heads(h, h_kv, error, words):
    for cls in (MultiHeadAttention, TorchMHA):
        with pytest.raises(error) as info:
            cls(24, h, n_kv_heads=h_kv)
        assert words in str(info.value)
    with pytest.raises(error):
        gqa_param_count(24, h, h_kv)


def test_gqa_checks_inputs_like_mha(rng):
    g = MultiHeadAttention(24, 4, n_kv_heads=2)
    with pytest.raises(ValueError, match=r"x must be \(B, T, d_model=24\), got \(2, 5, 16\)"):
        g(rng.normal(size=(2, 5, 16)))
    with pytest.raises(TypeError, match="must be float64 to match the weights"):
        g(rng.normal(size=(2, 5, 24)).astype(np.float32))


def test_from_mha_mean_pools_and_is_exact_when_the_group_shares_keys(rng):
    m = _mha(rng, 24, 4)
    x0 = rng.normal(size=(1, 3, 24))
    np.testing.assert_array_equal(gqa_from_mha(m, 4)(x0), m(x0))  # groups of one
    # give heads 0-1 and 2-3 the same key/value weights: pooling them into 2 kv heads loses nothing
    for name in ("Wk", "Wv"):
        W = getattr(m, name).reshape(24, 2, 2, 6)
        W[:, :, 1] = W[:, :, 0]
    for name in ("bk", "bv"):
        b = getattr(m, name).reshape(2, 2, 6)
        b[:, 1] = b[:, 0]
    x = rng.normal(size=(2, 5, 24))
    g = gqa_from_mha(m, 2)
    assert isinstance(g, MultiHeadAttention) and g.n_kv_heads == 2
    np.testing.assert_allclose(g(x, causal=True), m(x, causal=True), rtol=0, atol=1e-12)
    np.testing.assert_allclose(g.Wk, m.Wk.reshape(24, 2, 2, 6)[:, :, 0].reshape(24, 12), atol=0)
    tg = gqa_from_mha(TorchMHA.from_numpy(m), 2)  # torch in, torch out: the same pooling
    assert isinstance(tg, TorchMHA) and tg.n_kv_heads == 2 and tg.dtype == torch.float64
    with torch.no_grad():
        np.testing.assert_allclose(tg(torch.from_numpy(x), causal=True).numpy(), g(x, causal=True),
                                   rtol=0, atol=1e-12)


def test_from_mha_pools_by_the_mean_of_each_group(rng):
    m = _mha(rng, 24, 4)
    g = gqa_from_mha(m, 2)
    for name in ("Wk", "Wv"):  # (d, h_kv, g, d_k): heads 2j, 2j+1 -> kv head j
        grouped = getattr(m, name).reshape(24, 2, 2, 6)
        want = ((grouped[:, :, 0] + grouped[:, :, 1]) / 2).reshape(24, 12)
        np.testing.assert_allclose(getattr(g, name), want, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(g.Wq, m.Wq)
    with pytest.raises(ValueError, match="must be plain multi-head attention"):
        gqa_from_mha(g, 1)
    with pytest.raises(TypeError, match="numpy or torch MultiHeadAttention"):
        gqa_from_mha(object(), 2)


# ---- sliding window (+ padding) --------------------------------------------------------------------
def test_sliding_window_with_padding_equals_loops_and_sdpa_with_the_boolean_mask(rng):
    m = _mha(rng)
    x = rng.normal(size=(3, 8, 24))
    lengths = np.array([8, 5, 1])
    allowed = masks.combine(masks.padding_mask(lengths, 8), masks.sliding_window_mask(8, 3))  # (B,1,T,T)
    out = attend(m, x, mask=allowed)
    ref, w = attention_loops(m, x, None, np.broadcast_to(allowed, (3, 4, 8, 8)))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    with torch.no_grad():
        tout = torch_attend(TorchMHA.from_numpy(m), torch.from_numpy(x), mask=torch.from_numpy(allowed))
    np.testing.assert_allclose(tout.numpy(), ref, rtol=0, atol=1e-12)
    assert (m.attn[1, :, 5:] == 0).all(), "padded query rows must get all-zero weights"
    assert ((m.attn > 0).sum(-1)[0] == np.minimum(np.arange(1, 9), 3)).all()  # at most 3 keys


def test_a_window_as_wide_as_the_sequence_is_causal(rng):
    m = _mha(rng)
    x = rng.normal(size=(1, 6, 24))
    np.testing.assert_array_equal(attend(m, x, mask=masks.sliding_window_mask(6, 6)), m(x, causal=True))



def _by_rule(rule, T: int) -> np.ndarray:
    """(T, T) boolean from a rule on (query i, key j), in plain loops."""
    return np.array([[bool(rule(i, j)) for j in range(T)] for i in range(T)])


@pytest.mark.parametrize("W", [1, 3, 5])
def test_window_w_covers_the_w_keys_t_minus_w_plus_1_to_t(W):
    T = 9
    ours = masks.sliding_window_mask(T, W)  # (T, S)
    np.testing.assert_array_equal(ours, _by_rule(lambda i, j: i - W + 1 <= j <= i, T))
    assert (ours.sum(-1) == np.minimum(np.arange(1, T + 1), W)).all()  # W keys once the band is full
    # flash-attn's window_size=(left, right): keys i - left .. i + right inclusive (its docstring):
    # (W - 1, 0) is ours, (W, 0) is one key more, our W + 1
    flash = lambda left, right: _by_rule(lambda i, j: i - left <= j <= i + right, T)  # noqa: E731
    np.testing.assert_array_equal(ours, flash(W - 1, 0))
    np.testing.assert_array_equal(masks.sliding_window_mask(T, W + 1), flash(W, 0))
    assert not np.array_equal(ours, flash(W, 0))  # the off-by-one is visible


@pytest.mark.parametrize("W", [1, 3, 5])
def test_window_w_is_hugging_faces_sliding_window_w(W):
    masking = pytest.importorskip("transformers.masking_utils")
    rule = masking.sliding_window_causal_mask_function(W)  # what Mistral's sliding_window uses
    T = 9
    hf = _by_rule(lambda i, j: rule(torch.tensor(0), torch.tensor(0), torch.tensor(i), torch.tensor(j)), T)
    np.testing.assert_array_equal(masks.sliding_window_mask(T, W), hf)
    with pytest.raises(AssertionError):  # and a window one wider is not
        np.testing.assert_array_equal(masks.sliding_window_mask(T, W + 1), hf)

@pytest.mark.parametrize("window", [0, -2])
def test_window_must_be_positive(window):
    with pytest.raises(ValueError, match=f"window must be >= 1, got {window}"):
        masks.sliding_window_mask(6, window)
    with pytest.raises(ValueError, match=f"window must be >= 1, got {window}"):
        MaskSpec.plain(6, causal=True, window=window)


# ---- FlexAttention -------------------------------------------------------------------------------
def test_mask_mods_equal_the_boolean_masks():
    lengths = torch.tensor([6, 2, 4])
    cases = [
        (flex_spec(6, causal=True), None, 6, 6, steps.causal_mask(6)),
        (flex_spec(6, window=3), None, 6, 6, masks.sliding_window_mask(6, 3)),
        (MaskSpec(4 + torch.arange(3), torch.arange(7), causal=True, window=2), None, 3, 7,
         masks.sliding_window_mask(3, 2, 7, 4)),
        (flex_spec(6, lengths=lengths), 3, 6, 6, masks.padding_mask(lengths.numpy(), 6)[:, 0]),
    ]
    for spec, B, T, S, want in cases:
        got = create_mask(spec.mask_mod(), B, None, T, S, device="cpu")  # (B|1, 1, T, S)
        np.testing.assert_array_equal(got[:, 0].numpy().squeeze(0) if B is None else got[:, 0].numpy(), want)
    with pytest.raises(TypeError, match="lengths must be a torch tensor"):
        flex_spec(6, lengths=np.array([3]))


FLEX_CASES = [
    dict(causal=True),
    dict(window=3, lengths=[7, 4]),
    dict(causal=True, alibi=True),
    dict(causal=True, window=2, alibi=True, rope=True),
    dict(rope=True),
]


@pytest.mark.filterwarnings(EAGER_FLEX)
@pytest.mark.parametrize("kind", ["mha", "gqa"])
@pytest.mark.parametrize("case", FLEX_CASES, ids=lambda c: "+".join(c))
def test_flex_attention_equals_numpy_attend_float64(rng, kind, case):
    m = _mha(rng) if kind == "mha" else _gqa(rng)
    tm = TorchMHA.from_numpy(m)
    x = rng.normal(size=(2, 7, 24))
    allowed = None
    if case.get("causal"):
        allowed = steps.causal_mask(7)
    if case.get("window"):
        allowed = masks.combine(allowed, masks.sliding_window_mask(7, case["window"]))
    lengths = case.get("lengths")
    if lengths is not None:
        allowed = masks.combine(allowed, masks.padding_mask(np.array(lengths), 7))
    want = attend(m, x, mask=allowed, rope=case.get("rope", False), alibi=case.get("alibi", False))
    with torch.no_grad():
        got = torch_flex_attend(tm, torch.from_numpy(x), causal=case.get("causal", False),
                                window=case.get("window"),
                                lengths=None if lengths is None else torch.tensor(lengths),
                                rope=case.get("rope", False), alibi=case.get("alibi", False))
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


@pytest.mark.filterwarnings(EAGER_FLEX)
def test_flex_attention_float32_within_a_derived_tolerance(rng):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 33, 16, generator=g, dtype=torch.float64) for _ in range(3))
    bias = posenc.torch_alibi_bias(4, 33, dtype=torch.float64)
    mask = bias.masked_fill(~torch.ones(33, 33, dtype=torch.bool).tril(), float("-inf"))
    golden = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with torch.no_grad():
        lp_ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
        got = flex_attend(q.float(), k.float(), v.float(), causal=True, alibi=True)
    _, allowed = derived_tolerance(golden, lp_ref, torch.float32)
    assert got.dtype == torch.float32
    err = float((got.double() - golden).abs().max())
    assert err <= allowed, f"flex float32 error {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.filterwarnings(EAGER_FLEX)
def test_flex_attention_has_no_cpu_backward_in_this_torch():
    """The notebook says so; if a later torch adds it, this test says the notebook is out of date."""
    q = torch.randn(1, 1, 4, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attend(q, q, q, causal=True)


# ---- on a CUDA GPU (skipped where there is none, as in CI) ----------------------------------------
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a GPU")


@CUDA
@pytest.mark.parametrize("kind", ["mha", "gqa"])
def test_cuda_torch_attend_equals_numpy_float64(rng, kind):
    m = _mha(rng) if kind == "mha" else _gqa(rng)
    tm = (TorchMHA.from_numpy(m)).cuda()
    x = rng.normal(size=(2, 9, 24))
    allowed = masks.combine(masks.padding_mask(np.array([9, 6]), 9), masks.sliding_window_mask(9, 4))
    want = attend(m, x, mask=allowed, rope=True, alibi=True)
    with torch.no_grad():
        got = torch_attend(tm, torch.from_numpy(x).cuda(), mask=torch.from_numpy(allowed).cuda(),
                           rope=True, alibi=True)
    assert got.device.type == "cuda"
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=0, atol=1e-12)
    xr = torch.from_numpy(rng.normal(size=(2, 3, 5, 8))).cuda()
    r = rope(xr, torch.arange(5, device="cuda") + 7)
    assert r.device.type == "cuda" and r.dtype == torch.float64
    np.testing.assert_allclose(r.cpu().numpy(), rope(xr.cpu().numpy(), np.arange(5) + 7), atol=1e-12)


@CUDA
@pytest.mark.filterwarnings(EAGER_FLEX)
def test_cuda_compiled_flex_attention_matches_and_trains():
    """Compiled FlexAttention on the GPU: window + padding + ALiBi + GQA, forward and backward vs SDPA."""
    from torch.nn.attention.flex_attention import flex_attention
    g = torch.Generator().manual_seed(0)
    B, h, h_kv, T, d_k = 2, 8, 2, 256, 64
    q64 = torch.randn(B, h, T, d_k, generator=g, dtype=torch.float64)
    k64, v64 = (torch.randn(B, h_kv, T, d_k, generator=g, dtype=torch.float64) for _ in range(2))
    lengths = torch.tensor([256, 190])
    allowed = masks.combine(masks.padding_mask(lengths.numpy(), T), masks.sliding_window_mask(T, 48))
    bias = torch.from_numpy(alibi_bias(h, T)).masked_fill(~torch.from_numpy(allowed), float("-inf"))

    def sdpa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    gold = [a.clone().requires_grad_() for a in (q64, k64, v64)]
    golden = sdpa(*gold, bias)  # float64 on the CPU
    lp = [a.float().cuda().requires_grad_() for a in (q64, k64, v64)]
    lp_ref = sdpa(*lp, bias.float().cuda())  # float32 SDPA on the GPU: the error scale
    _, allowed_err = derived_tolerance(golden, lp_ref, torch.float32)
    spec = flex_spec(T, T, causal=True, window=48, lengths=lengths.cuda(), device="cuda")
    block_mask = spec.block_mask(B, h, T, T, "cuda")
    ours = [a.float().cuda().requires_grad_() for a in (q64, k64, v64)]
    out = torch.compile(flex_attention)(*ours, score_mod=positions.alibi_score_mod(h, device="cuda"),
                                        block_mask=block_mask, enable_gqa=True)
    err = float((out.detach().double().cpu() - golden.detach()).abs().max())
    assert err <= allowed_err, f"compiled flex error {err:.3g} > allowed {allowed_err:.3g}"
    # backward on real query rows (padded rows are fully masked: zero output, no gradient)
    w = torch.randn(B, h, T, d_k, generator=g, dtype=torch.float64)
    keep = torch.from_numpy(masks.query_padding_mask(lengths.numpy(), T))[:, None, :, None]
    (golden * w * keep).sum().backward()
    (lp_ref * (w * keep).float().cuda()).sum().backward()
    (out * (w * keep).float().cuda()).sum().backward()
    for name, a, b, c in zip("qkv", ours, lp, gold, strict=True):
        _, allowed_grad = derived_tolerance(c.grad, b.grad, torch.float32)
        gap = float((a.grad.double().cpu() - c.grad).abs().max())
        assert gap <= allowed_grad, f"d{name}: compiled flex gradient error {gap:.3g} > {allowed_grad:.3g}"


# ---- RoPE's table path: pads' negative positions read the table too, bit for bit -------------------
def _fresh_rope(x: torch.Tensor, p: torch.Tensor, pairing: str) -> torch.Tensor:
    """The reference: cos and sin computed afresh for these positions (no table), as numpy's path does."""
    at = p[:, None, :] if p.ndim == 2 else p  # (B, 1, T) or (T,)
    cos, sin = rope_tables(at, x.shape[-1], 10000.0, pairing)  # float64
    return posenc._rotate(x, cos, sin, pairing)  # (B, h, T, d_k)


def rope_table_is_exact() -> None:
    """rope on torch x equals fresh tables bit for bit at real positions and at left pads (negative)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[-3, -2, -1, 0, 1, 2], [-1, 61, 62, 63, 64, 65], [200, 201, 202, 203, 204, 205]])
    for dtype, pairing in ((torch.float32, "half"), (torch.float64, "interleaved")):
        x = torch.randn(3, 2, 6, 8, generator=g, dtype=dtype)
        got, want = rope(x, p, pairing=pairing), _fresh_rope(x, p, pairing)
        real = (p >= 0)[:, None, :, None].expand_as(x)  # (B, h, T, d_k)
        assert torch.equal(got[real], want[real]), f"{dtype} {pairing}: real positions differ"
        assert torch.equal(got, want), f"{dtype} {pairing}: pads (negative positions) differ"
        for q in (p[1], -p[2]):  # (T,) positions: a pad and real ones, or pads only
            y = x[0, :1]  # (1, T, d_k)
            assert torch.equal(rope(y, q, pairing=pairing), _fresh_rope(y, q, pairing)), (dtype, q)


def test_rope_through_the_table_equals_fresh_tables_bit_for_bit_pads_included(monkeypatch):
    rope_table_is_exact()
    made = []  # a left-padded (mixed) call must not compute cos and sin afresh
    monkeypatch.setattr(posenc, "rope_tables", lambda *a, **k: made.append(a) or rope_tables(*a, **k))
    x, p = torch.ones(2, 1, 3, 4), torch.tensor([[-2, -1, 0], [5, 6, 7]])
    rope(x, p)
    rope(x, p)
    assert len(made) <= 1, f"cos, sin computed {len(made)} times for two calls: no table for pads"


@pytest.mark.parametrize("mutant, words", [
    (lambda f: lambda x, p, *a: f(x, p.clamp(min=0), *a), "pads"),  # pads read position 0's row
    (lambda f: lambda x, p, *a: f(x, p.clamp(max=62), *a), "real positions"),  # real ones clamped
])
def test_a_table_lookup_that_clamps_positions_is_caught(monkeypatch, mutant, words):
    monkeypatch.setattr(posenc, "_cached_rotation", mutant(posenc._cached_rotation))
    with pytest.raises(AssertionError, match=words):
        rope_table_is_exact()
