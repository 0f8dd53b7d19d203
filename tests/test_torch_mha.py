"""The torch module itself: weight transfer both ways, fused QKV, attention capture, ledger, errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from mha import checks
from mha.attention.torch_attention import causal_mask, safe_softmax
from mha.modules.numpy_mha import MultiHeadAttention as NumpyMHA
from mha.modules.torch_mha import (
    MultiHeadAttention,
    capture_attention,
    torch_mha_forward,
    torch_mha_mask,
)


def _x(seed: int, *shape: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _raises(exc, msg):
    return pytest.raises(exc, match=re.escape(msg))


# ---- construction and weight transfer ----------------------------------------------------------
def test_same_seed_same_weights_as_numpy_twin():
    npm, tm = NumpyMHA(16, 4, seed=5), MultiHeadAttention(16, 4, seed=5, dtype=torch.float64)
    # numpy keeps (in, out), nn.Linear keeps (out, in): equal after one transpose, not before
    np.testing.assert_array_equal(tm.q_proj.weight.detach().numpy(), npm.Wq.T)
    assert not np.array_equal(tm.q_proj.weight.detach().numpy(), npm.Wq)
    np.testing.assert_array_equal(tm.out_proj.weight.detach().numpy(), npm.Wo.T)
    assert not torch.equal(MultiHeadAttention(16, 4, seed=6).q_proj.weight, tm.q_proj.weight.float())


def test_numpy_round_trip_is_exact():
    npm = NumpyMHA(24, 6, seed=2)
    npm.bq, npm.bo = np.arange(24.0), -np.arange(24.0)
    back = MultiHeadAttention.from_numpy(npm).to_numpy()
    for a, b in zip(npm.parameters(), back.parameters(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fused", [False, True])
def test_nn_mha_round_trip_is_exact(fused):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(16, 4, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_bias.normal_()
    tm = MultiHeadAttention.from_torch_mha(ref, fused_qkv=fused)
    back = tm.to_torch_mha()
    for name in ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"):
        assert torch.equal(ref.get_parameter(name), back.get_parameter(name)), name
    x = _x(1, 2, 5, 16)
    with torch.no_grad():
        want = ref(x, x, x, need_weights=False)[0]
        torch.testing.assert_close(tm(x), want, rtol=0, atol=1e-12)


def test_from_torch_mha_rejects_what_it_cannot_map():
    with _raises(ValueError, "add_bias_kv / add_zero_attn have no equivalent here"):
        MultiHeadAttention.from_torch_mha(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with _raises(ValueError, "need one packed in_proj_weight with bias"):
        MultiHeadAttention.from_torch_mha(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with _raises(ValueError, "build nn.MultiheadAttention with batch_first=True"):
        torch_mha_forward(nn.MultiheadAttention(8, 2), _x(0, 1, 3, 8, dtype=torch.float32))


def test_fused_qkv_equals_three_projections_self_and_cross():
    sep = MultiHeadAttention(32, 4, seed=3, dtype=torch.float64)
    fused = MultiHeadAttention(32, 4, seed=3, dtype=torch.float64, fused_qkv=True)
    W = fused.qkv_proj.weight
    assert W.shape == (96, 32)  # rows: q, then k, then v
    assert torch.equal(W[32:64], sep.k_proj.weight)
    x, ctx = _x(1, 2, 5, 32), _x(2, 2, 7, 32)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, causal=True), sep(x, causal=True), rtol=0, atol=1e-13)
        torch.testing.assert_close(fused(x, context=ctx), sep(x, context=ctx), rtol=0, atol=1e-13)
    assert fused.num_parameters() == sep.num_parameters() == checks.expected_param_count(32)


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8])
def test_param_count_check_accepts_torch_module(n_heads):
    assert "1,050,624" in checks.check_param_count(MultiHeadAttention(512, n_heads))


def test_torch_mha_mask_negates_and_expands():
    allowed = torch.tensor([[True, False], [True, True]])  # (T, S)
    assert torch.equal(torch_mha_mask(allowed, 2, 3, 2, 2), ~allowed)
    per_batch = torch.stack([allowed, ~allowed])[:, None]  # (B=2, 1, T, S)
    got = torch_mha_mask(per_batch, 2, 3, 2, 2)
    assert got.shape == (6, 2, 2)  # (B*h, T, S), batch-major: rows 0-2 item 0, rows 3-5 item 1
    assert torch.equal(got[2], ~allowed) and torch.equal(got[3], allowed)


# ---- manual path, capture, ledger --------------------------------------------------------------
def test_safe_softmax_matches_numpy_steps_including_all_masked_rows():
    from mha import steps

    s = _x(3, 2, 3, 5)
    s[0, 1] = float("-inf")  # a fully masked row
    s[1, 2, :2] = float("-inf")
    np.testing.assert_allclose(safe_softmax(s).numpy(), steps.softmax(s.numpy()), rtol=0, atol=1e-15)
    assert (safe_softmax(s)[0, 1] == 0).all()


def test_manual_path_keeps_weights_sdpa_path_does_not():
    m = MultiHeadAttention(16, 2, seed=1, dtype=torch.float64)
    npm = m.to_numpy()
    x = _x(0, 2, 5, 16)
    m(x, causal=True)
    assert m.attn is None
    m.use_sdpa = False
    m(x, causal=True)
    npm(x.numpy(), causal=True)
    np.testing.assert_allclose(m.attn.numpy(), npm.attn, rtol=0, atol=1e-14)
    checks.check_rows_sum_to_one(m.attn, atol=1e-12)


def test_capture_attention_collects_maps_and_restores_the_module():
    m = MultiHeadAttention(16, 4, seed=1, dtype=torch.float64)
    model = nn.Sequential(m)  # works on any model containing the layer
    x = _x(0, 1, 6, 16)
    with capture_attention(model) as maps:
        model(x)
        m(x, context=_x(1, 1, 3, 16))
    assert [tuple(a.shape) for a in maps] == [(1, 4, 6, 6), (1, 4, 6, 3)]
    npm = m.to_numpy()
    npm(x.numpy())
    np.testing.assert_allclose(maps[0].numpy(), npm.attn, rtol=0, atol=1e-14)
    assert m.use_sdpa and not m._forward_hooks  # switch restored, hook removed
    with _raises(ValueError, "Linear contains no mha.modules.torch_mha.MultiHeadAttention"):
        with capture_attention(nn.Linear(2, 2)):
            pass


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_trace_ledger_matches_numpy_shapes(use_sdpa):
    m = MultiHeadAttention(512, 8, use_sdpa=use_sdpa)
    npm = m.to_numpy()
    x = _x(0, 2, 6, 512, dtype=torch.float32)
    ours = {(r.step, r.symbol): r.shape for r in m.trace(x, causal=True)}
    theirs = {(r.step, r.symbol): r.shape for r in npm.trace(x.double().numpy(), causal=True)}
    shared = set(ours) & set(theirs)
    assert ("2 split heads", "(B, h, T, d_k)") in shared and ("7 project", "(B, T, d_model)") in shared
    assert all(ours[k] == theirs[k] for k in shared)
    assert (("3-6 sdpa", "(B, h, T, d_k)") in ours) == use_sdpa


def test_is_causal_with_fewer_queries_than_keys_is_top_left_like_numpy():
    m = MultiHeadAttention(8, 2, seed=0, dtype=torch.float64, use_sdpa=False)
    m(_x(0, 1, 2, 8), context=_x(1, 1, 4, 8), causal=True)
    assert torch.equal(m.attn[0, 0] > 0, causal_mask(2, 4))  # query 0 sees key 0 only


# ---- errors read like the numpy module's -------------------------------------------------------
@pytest.fixture
def mods():
    return NumpyMHA(512, 8), MultiHeadAttention(512, 8, dtype=torch.float64)


BAD = [
    ("x not 3-D", lambda t: t(_x(0, 6, 512)), ValueError, "x must be (B, T, d_model=512), got (6, 512)"),
    ("wrong width", lambda t: t(_x(0, 2, 6, 256)), ValueError, "x must be (B, T, d_model=512), got (2, 6, 256)"),
    ("empty", lambda t: t(torch.zeros(2, 0, 512, dtype=torch.float64)), ValueError,
     "x must have B >= 1 and T >= 1, got shape (2, 0, 512)"),
    ("mask shape", lambda t: t(_x(0, 2, 6, 512), mask=torch.ones(5, 5, dtype=torch.bool)), ValueError,
     "mask must be (T=6, S=6), (B=2, T=6, S=6) or (B=2 or 1, h=8 or 1, T=6, S=6), got (5, 5)"),
    ("mask heads", lambda t: t(_x(0, 2, 6, 512), mask=torch.ones(2, 4, 6, 6, dtype=torch.bool)),
     ValueError, "got (2, 4, 6, 6)"),
    ("mask dtype", lambda t: t(_x(0, 2, 6, 512), mask=torch.ones(6, 6)), TypeError,
     "mask must be a boolean array (True = may attend), got torch.float32"),
    ("context batch", lambda t: t(_x(0, 2, 6, 512), context=_x(1, 3, 4, 512)), ValueError,
     "context must have the same batch size as x (B=2), got 3"),
    ("context width", lambda t: t(_x(0, 2, 6, 512), context=_x(1, 2, 4, 64)), ValueError,
     "context must be (B, T, d_model=512), got (2, 4, 64)"),
    ("list", lambda t: t([[[0.0] * 512]]), TypeError, "x must be an array, got list"),
]


@pytest.mark.parametrize(("case", "call", "exc", "msg"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_errors(case, call, exc, msg):
    with _raises(exc, msg):
        call(MultiHeadAttention(512, 8, dtype=torch.float64))


def test_errors_match_the_numpy_module_word_for_word(mods):
    npm, tm = mods
    for _, call, exc, _ in BAD[:-1]:
        with pytest.raises(exc) as ours:
            call(tm)
        with pytest.raises(exc) as theirs:
            call(lambda x, **kw: npm(x.numpy(), **{k: v.numpy() for k, v in kw.items()}))
        assert str(ours.value).replace("torch.", "") == str(theirs.value)


def test_torch_only_errors():
    with _raises(ValueError, "d_model=512 must be divisible by n_heads=7"):
        MultiHeadAttention(512, 7)
    with _raises(TypeError, "dtype must be a floating-point torch.dtype, got torch.int64"):
        MultiHeadAttention(8, 2, dtype=torch.int64)
    m = MultiHeadAttention(8, 2)
    with _raises(TypeError, "x must be torch.float32 to match the weights, got torch.float64"):
        m(_x(0, 1, 3, 8))
    with _raises(TypeError, "x must be a torch.Tensor, got a numpy array"):
        m(np.zeros((1, 3, 8), dtype=np.float32))
    with _raises(TypeError, "x must be a floating-point array (float32 or float64), got dtype torch.int64"):
        m(torch.ones(1, 3, 8, dtype=torch.int64))
    x = _x(0, 2, 3, 8, dtype=torch.float32)
    x[1, 2, 5] = float("nan")
    with _raises(ValueError, "x must be finite, got 1 NaN/inf value(s), first at index (1, 2, 5)"):
        m(x)
    with _raises(ValueError, "Wq must be (d_model=8, d_model=8), got (8, 4)"):
        m.load_weights_(*(torch.zeros(8, 4) for _ in range(8)))


def test_input_on_another_device_than_the_weights():
    m = MultiHeadAttention(8, 2, device="meta")  # "meta" stands in for a GPU on CPU-only CI
    with _raises(ValueError, "x is on cpu but the weights are on meta (move it with x.to('meta'))"):
        m(_x(0, 1, 3, 8, dtype=torch.float32))
