"""The assembled numpy module: values against a loop reference, properties, ledger, demo."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import checks, steps
from mha.attention import numpy_attention
from mha.ledger import format_ledger
from mha.modules.numpy_mha import MultiHeadAttention
from mha.perf.bench import derived_tolerance
from tests.reference import attention_loops


def _x(rng, B, T, d_model, dtype=np.float64):
    return rng.normal(size=(B, T, d_model)).astype(dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_loop_reference_float64(rng, causal):
    mha = MultiHeadAttention(24, 4, seed=3)
    mha.bq, mha.bk, mha.bv, mha.bo = (rng.normal(size=24) for _ in range(4))  # nonzero biases
    x = _x(rng, 2, 5, 24)
    allowed = np.broadcast_to(steps.causal_mask(5), (2, 4, 5, 5)) if causal else None
    want_out, want_w = attention_loops(mha, x, allowed=allowed)
    out = mha(x, causal=causal)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(mha.attn, want_w, rtol=0, atol=1e-12)


def test_forward_with_mask_and_cross_attention_matches_loops(rng):
    mha = MultiHeadAttention(16, 2, seed=5)
    x, ctx = _x(rng, 3, 4, 16), _x(rng, 3, 7, 16)
    mask = rng.random((3, 4, 7)) < 0.6  # (B, T, S), True = may attend
    mask[:, :, 0] = True
    out = mha(x, context=ctx, mask=mask)
    want_out, want_w = attention_loops(mha, x, ctx, np.broadcast_to(mask[:, None], (3, 2, 4, 7)))
    assert out.shape == (3, 4, 16) and mha.attn.shape == (3, 2, 4, 7)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(mha.attn, want_w, rtol=0, atol=1e-12)


def test_mask_and_causal_combine(rng):
    mha = MultiHeadAttention(8, 2)
    x = _x(rng, 1, 4, 8)
    pad = np.array([True, True, True, False])  # last key is padding
    mha(x, causal=True, mask=np.broadcast_to(pad, (4, 4)))
    want = steps.causal_mask(4) & pad
    np.testing.assert_array_equal(mha.attn[0, 0] > 0, want)


def test_fully_masked_rows_give_zero_weights_and_bias_only_output(rng):
    mha = MultiHeadAttention(8, 2)
    mha.bo = rng.normal(size=8)
    x = _x(rng, 2, 3, 8)
    mask = np.ones((2, 3, 3), dtype=bool)
    mask[1, 2, :] = False  # query 2 of item 1 may attend to nothing
    out = mha(x, mask=mask)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(mha.attn[1, :, 2], 0.0)
    np.testing.assert_allclose(out[1, 2], mha.bo, rtol=0, atol=0)  # zero context, then + bo


def test_float32_in_float32_out(rng):
    mha = MultiHeadAttention(32, 4, dtype=np.float32)
    out = mha(_x(rng, 2, 5, 32, np.float32), causal=True)
    assert out.dtype == np.float32 and mha.attn.dtype == np.float32
    assert all(p.dtype == np.float32 for p in mha.parameters())


def test_float32_agrees_with_float64_reference(rng):
    m64 = MultiHeadAttention(64, 8, seed=1)
    m32 = MultiHeadAttention(64, 8, seed=1, dtype=np.float32)
    x = _x(rng, 2, 9, 64)
    np.testing.assert_allclose(m32(x.astype(np.float32)), m64(x), rtol=1e-4, atol=1e-5)


WEIGHTS = ("Wq", "bq", "Wk", "bk", "Wv", "bv", "Wo", "bo")


def _as_float64(module):
    """A float64 copy of a module: the same (rounded) weights, float64 arithmetic from there on."""
    twin = MultiHeadAttention(module.d_model, module.n_heads)
    for name in WEIGHTS:
        setattr(twin, name, getattr(module, name).astype(np.float64))
    return twin


def _float16_storage_reference(module, x, causal):
    """The plain float16 path: float64 maths, rounding to float16 wherever a float16 module stores
    a tensor (q, k, v, the merged heads, the output). Its error is the one no float16 module avoids."""
    r = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731 - one rounding, used 5 times
    W = {n: getattr(module, n).astype(np.float64) for n in WEIGHTS}
    B, T, d_model = x.shape
    h, d_k = module.n_heads, d_model // module.n_heads
    split = lambda a: a.reshape(B, T, h, d_k).transpose(0, 2, 1, 3)  # noqa: E731 - (B, h, T, d_k)
    q, k, v = (split(r(x.astype(np.float64) @ W[f"W{c}"] + W[f"b{c}"])) for c in "qkv")
    s = np.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d_k)  # (B, h, T, S)
    if causal:
        s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)  # (B, h, T, S)
    merged = r(np.einsum("bhts,bhsd->bthd", w, v).reshape(B, T, d_model))  # (B, T, d_model)
    return r(merged @ W["Wo"] + W["bo"]), r(w)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [1.0, 400.0])
def test_float16_stays_within_derived_tolerance_of_float64_even_at_400x(scale, causal):
    # At 400 * x the scores reach ~5e5, past float16's largest number 65504: a core that kept
    # float16 returned NaN there. golden: the loop reference in float64 on the same rounded
    # weights and inputs; allowed: FUDGE x the plain float16 path's error, floored at 1e-3.
    m16 = MultiHeadAttention(16, 4, seed=0, dtype=np.float16)
    x16 = (scale * np.random.default_rng(0).normal(size=(2, 7, 16))).astype(np.float16)
    allowed = np.broadcast_to(steps.causal_mask(7), (2, 4, 7, 7)) if causal else None
    golden, golden_w = attention_loops(_as_float64(m16), x16.astype(np.float64), allowed=allowed)
    plain, plain_w = _float16_storage_reference(m16, x16, causal)
    out = m16(x16, causal=causal)
    assert out.dtype == np.float16 and m16.attn.dtype == np.float16, (out.dtype, m16.attn.dtype)
    assert np.isfinite(out).all() and np.isfinite(m16.attn).all(), (
        f"{int((~np.isfinite(out)).sum())} NaN/inf outputs at {scale} * x in float16: the scores "
        f"overflow 65504 unless steps 3-6 run in float32")
    for name, got, want, ref in (("outputs", out, golden, plain), ("weights", m16.attn, golden_w, plain_w)):
        ref_err, allowed_err = derived_tolerance(want, ref, torch.float16)
        err = float(np.abs(got.astype(np.float64) - want).max())
        assert err <= allowed_err, (f"float16 {name}: error {err:.3g} > {allowed_err:.3g} = "
                                    f"max(1e-3, 3 x the plain float16 path's {ref_err:.3g})")


def test_attention_core_runs_float16_in_float32_and_returns_float16():
    g = np.random.default_rng(3)
    q, k, v = (a.astype(np.float16) for a in (300 * g.normal(size=(1, 2, 5, 8)),
                                              300 * g.normal(size=(1, 2, 5, 8)),
                                              g.normal(size=(1, 2, 5, 8))))  # (B, h, T|S, d_k)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = q64 @ k64.swapaxes(-1, -2) / math.sqrt(8)  # (B, h, T, S), up to ~1e5: inf in float16
    assert np.abs(s).max() > np.finfo(np.float16).max  # the case is the one that overflows
    e = np.exp(s - s.max(-1, keepdims=True))
    w64 = e / e.sum(-1, keepdims=True)
    out, w = numpy_attention.attention(q, k, v)
    assert out.dtype == np.float16 and w.dtype == np.float16
    for got, want in ((out, w64 @ v64), (w, w64)):
        ref_err, allowed_err = derived_tolerance(want, want.astype(np.float16), torch.float16)
        err = float(np.abs(got.astype(np.float64) - want).max())
        assert err <= allowed_err, f"core float16 error {err:.3g} > {allowed_err:.3g}"


def test_weights_are_drawn_with_std_one_over_sqrt_d_model():
    mha = MultiHeadAttention(512, 8, seed=0)
    for W in (mha.Wq, mha.Wk, mha.Wv, mha.Wo):
        # 262,144 draws: the sample std lies within 1% of 1/sqrt(512) with huge margin
        assert abs(W.std() * np.sqrt(512) - 1.0) < 0.01
    assert all((b == 0).all() for b in (mha.bq, mha.bk, mha.bv, mha.bo))


def test_same_seed_same_weights_different_seed_different():
    a, b, c = MultiHeadAttention(16, 2, seed=7), MultiHeadAttention(16, 2, seed=7), MultiHeadAttention(16, 2, seed=8)
    np.testing.assert_array_equal(a.Wq, b.Wq)
    assert not np.array_equal(a.Wq, c.Wq)


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 16])
def test_param_count_is_independent_of_heads(n_heads):
    mha = MultiHeadAttention(512, n_heads)
    assert mha.num_parameters() == 1_050_624
    assert "1,050,624" in checks.check_param_count(mha)


dims = st.tuples(
    st.integers(1, 3),  # B
    st.integers(2, 7),  # T (>= 2 so some input comes after t)
    st.sampled_from([(4, 1), (4, 2), (8, 4), (12, 3), (16, 8), (24, 6)]),  # (d_model, h)
    st.integers(0, 2**16),  # seed
)


@settings(max_examples=25, deadline=None)
@given(dims)
def test_three_properties_hold_for_many_shapes(d):
    B, T, (d_model, h), seed = d
    mha = MultiHeadAttention(d_model, h, seed=seed)
    x = np.random.default_rng(seed).normal(size=(B, T, d_model))
    for t in range(T - 1):
        checks.check_causal(lambda a: mha(a, causal=True), x, t=t, seed=seed)
    for causal in (False, True):
        mha(x, causal=causal)
        checks.check_rows_sum_to_one(mha.attn, atol=1e-12)
    checks.check_param_count(mha)


def test_trace_ledger_records_real_shapes(rng):
    mha = MultiHeadAttention(512, 8)
    x = _x(rng, 2, 6, 512)
    rows = mha.trace(x, causal=True)
    shapes = {(r.step, r.tensor): r.shape for r in rows}
    assert shapes[("2 split heads", "q")] == (2, 8, 6, 64)
    assert shapes[("3 scaled scores", "q k^T / sqrt(d_k)")] == (2, 8, 6, 6)
    assert rows[-1].shape == (2, 6, 512)
    assert [r.step[0] for r in rows if r.step[0].isdigit()] == sorted(
        r.step[0] for r in rows if r.step[0].isdigit()
    )
    assert "4 mask" not in {r.step for r in mha.trace(x, causal=False)}
    table = format_ledger(rows)
    assert "(2, 8, 6, 64)" in table and "(B, h, T, d_k)" in table


def test_trace_shows_S_for_cross_attention(rng):
    mha = MultiHeadAttention(8, 2)
    rows = mha.trace(_x(rng, 1, 3, 8), context=_x(rng, 1, 5, 8))
    assert {r.tensor: r.shape for r in rows}["q k^T / sqrt(d_k)"] == (1, 2, 3, 5)


def test_python_dash_m_mha_demo_runs():
    res = subprocess.run([sys.executable, "-m", "mha"], capture_output=True, text=True, check=True)
    assert res.stdout.count("PASS") == 4
    assert "1,050,624" in res.stdout and "(2, 8, 6, 64)" in res.stdout


def test_the_module_a_student_reads_fits_one_screen():
    from mha_course.source import show_source

    shown = show_source(MultiHeadAttention, "forward")
    assert shown.lines <= 60, f"forward takes {shown.lines} lines"
    assert "ledger" not in shown.text and "attention(q, k, v" in shown.text
    for step in ("linear", "split_heads", "merge_heads"):
        assert f"steps.{step}" in shown.text, step
    core = show_source(numpy_attention.reference_attention)
    for step in ("scaled_scores", "apply_mask", "softmax", "weighted_sum"):
        assert f"steps.{step}" in core.text, step
