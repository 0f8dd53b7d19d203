"""Padding masks end to end (mha.attention.masks), checked against torch and a loop reference.

One contract over every implementation ("numpy", torch "sdpa", torch "manual"): with a
padding mask built from lengths, the outputs equal the loop reference of tests/reference.py,
and every real token's output equals running its sequence alone, unpadded. Then the torch
conventions (SDPA's boolean and float attn_mask, nn.MultiheadAttention's key_padding_mask
with the opposite polarity, attn_mask with is_causal), the fill values measured, the loss
over real tokens, bad lengths, and the named check catching each planted mistake.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from mha.attention import masks
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import MultiHeadAttention as TorchMHA
from mha_course.diagnose import padding as diagnose_padding
from mha_course.tryit.padding_masks import check_decoder_mask
from tests.reference import attention_loops

IMPLS = ["numpy", "sdpa", "manual"]
BACKENDS = ["numpy", "torch"]
LENGTHS = [6, 2, 4, 0]  # one full, two padded, one empty sequence
T = 6


def as_backend(a, backend: str):
    """A list or numpy array as the backend's array type."""
    return torch.as_tensor(np.array(a)) if backend == "torch" else np.asarray(a)


def to_np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _module(rng, d_model=16, n_heads=4) -> MultiHeadAttention:
    """A float64 numpy module with nonzero biases (zero biases would hide a padded row's bias)."""
    m = MultiHeadAttention(d_model, n_heads, seed=5)
    m.bq, m.bk, m.bv, m.bo = (rng.normal(size=d_model) for _ in range(4))
    return m


def run(impl: str, m: MultiHeadAttention, x: np.ndarray, mask, causal=False) -> np.ndarray:
    """Forward through `impl` with a numpy boolean mask; numpy (B, T, d_model) out."""
    if impl == "numpy":
        return m(x, causal=causal, mask=mask)
    tm = TorchMHA.from_numpy(m, use_sdpa=impl == "sdpa")
    with torch.no_grad():
        return tm(torch.from_numpy(x), causal=causal, mask=torch.from_numpy(mask)).numpy()


def loop_mask(lengths, T, S=None, kv_lengths=None, causal=False, queries=True) -> np.ndarray:
    """The padding mask from its definition, one (b, t, s) at a time: (B, 1, T, S)."""
    S = T if S is None else S
    kv = lengths if kv_lengths is None else kv_lengths
    out = np.zeros((len(lengths), 1, T, S), dtype=bool)
    for b in range(len(lengths)):
        for t in range(T):
            for s in range(S):
                out[b, 0, t, s] = (s < kv[b] and (t < lengths[b] or not queries)
                                   and (s <= t or not causal))
    return out


# ---- builders ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_key_and_query_masks_from_lengths(backend):
    lengths = as_backend(LENGTHS, backend)
    keys = masks.key_padding_mask(lengths, 7)
    rows = masks.query_padding_mask(lengths, 6)
    assert type(keys) is type(lengths) and str(keys.dtype) in ("bool", "torch.bool")
    want_k = np.array([[s < n for s in range(7)] for n in LENGTHS])  # (B, S)
    np.testing.assert_array_equal(to_np(keys), want_k)
    np.testing.assert_array_equal(to_np(rows), want_k[:, :6])
    np.testing.assert_array_equal(to_np(masks.to_torch_key_padding_mask(lengths, 7)), ~want_k)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("queries", [False, True])
def test_padding_mask_matches_its_definition(backend, causal, queries):
    got = masks.padding_mask(as_backend(LENGTHS, backend), T, causal=causal, queries=queries)
    assert tuple(got.shape) == (4, 1, T, T)
    np.testing.assert_array_equal(to_np(got), loop_mask(LENGTHS, T, causal=causal, queries=queries))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_attention_mask_uses_the_keys_own_lengths(backend):
    q_len, kv_len = [3, 1], [5, 2]
    got = masks.padding_mask(as_backend(q_len, backend), 4, S=6, kv_lengths=as_backend(kv_len, backend))
    np.testing.assert_array_equal(to_np(got), loop_mask(q_len, 4, 6, kv_len))


def test_torch_masks_from_torch_lengths_equal_numpy_masks():
    for causal in (False, True):
        t = masks.padding_mask(torch.tensor(LENGTHS), T, causal=causal)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.bool
        np.testing.assert_array_equal(t.numpy(), masks.padding_mask(np.array(LENGTHS), T, causal=causal))


def test_sliding_window_and_combine():
    band = masks.sliding_window_mask(6, 2)
    want = np.array([[t - 2 < s <= t for s in range(6)] for t in range(6)])
    np.testing.assert_array_equal(band, want)
    pad = masks.padding_mask(np.array([6, 3]), 6)  # (B, 1, T, S)
    both = masks.combine(pad, band, None)
    np.testing.assert_array_equal(both, pad & band)
    with pytest.raises(TypeError, match="boolean"):
        masks.combine(pad, band.astype(np.float32))
    with pytest.raises(ValueError, match="broadcast"):
        masks.combine(pad, np.ones((5, 5), dtype=bool))
    with pytest.raises(ValueError, match="at least one"):
        masks.combine(None)


def test_pad_batch_equals_torch_pad_sequence(rng):
    seqs = [rng.normal(size=(n, 3)) for n in (4, 1, 3)]
    x, lengths = masks.pad_batch(seqs)
    assert x.shape == (3, 4, 3) and lengths.tolist() == [4, 1, 3]
    ts = [torch.from_numpy(s) for s in seqs]
    xt, lt = masks.pad_batch(ts, value=-7.0)
    want = torch.nn.utils.rnn.pad_sequence(ts, batch_first=True, padding_value=-7.0)
    assert torch.equal(xt, want) and lt.dtype == torch.int64 and lt.tolist() == [4, 1, 3]
    np.testing.assert_array_equal(x[1, 1:], 0.0)


def test_pad_batch_errors():
    with pytest.raises(ValueError, match="at least one"):
        masks.pad_batch([])
    with pytest.raises(ValueError, match=r"sequence 1 \(2, 4\)"):
        masks.pad_batch([np.zeros((3, 5)), np.zeros((2, 4))])
    with pytest.raises(TypeError, match="mix"):
        masks.pad_batch([np.zeros((3, 5)), torch.zeros(2, 5)])


# ---- bad lengths -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_lengths_give_clear_errors(backend):
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 6\].*lengths\[1\] = 7"):
        masks.padding_mask(as_backend([6, 7], backend), 6)
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1"):
        masks.key_padding_mask(as_backend([-1, 2], backend), 6)
    with pytest.raises(ValueError, match=r"one entry per batch item \(B=3\), got 2"):
        masks.key_padding_mask(as_backend([1, 2], backend), 6, B=3)
    with pytest.raises(ValueError, match=r"one entry per batch item \(B=2\), got 3"):
        masks.padding_mask(as_backend([1, 2, 3], backend), 6, kv_lengths=as_backend([1, 2], backend))
    with pytest.raises(TypeError, match="whole numbers"):
        masks.query_padding_mask(as_backend([1.5, 2.0], backend), 6)
    with pytest.raises(ValueError, match="1-D"):
        masks.query_padding_mask(as_backend([[1, 2]], backend), 6)


# ---- the contract: loop reference, and each sequence alone ----------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_padded_batch_matches_loop_reference_float64(rng, impl, causal):
    m = _module(rng)
    x = rng.normal(size=(4, T, 16))
    mask = masks.padding_mask(np.array(LENGTHS), T, causal=causal)  # (B, 1, T, T)
    want, weights = attention_loops(m, x, allowed=np.broadcast_to(mask, (4, 4, T, T)))
    np.testing.assert_allclose(run(impl, m, x, mask), want, rtol=0, atol=1e-12)
    # padded queries: zero weights, zero context, so the output is out_proj's bias alone
    rows = masks.query_padding_mask(np.array(LENGTHS), T)
    assert (weights.transpose(0, 2, 1, 3)[~rows] == 0).all()  # (B, T, h, S)[padded] -> (n, h, S)
    padded_out = run(impl, m, x, mask, causal)[~rows]  # (n, d_model)
    np.testing.assert_allclose(padded_out, np.broadcast_to(m.bo, padded_out.shape), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_real_tokens_equal_each_sequence_alone(rng, impl, causal):
    m = _module(rng)
    x = rng.normal(size=(4, T, 16))
    mask = masks.padding_mask(np.array(LENGTHS), T)
    out = run(impl, m, x, mask, causal)
    for b, n in enumerate(LENGTHS):
        if n:
            alone = run(impl, m, x[b : b + 1, :n], np.ones((n, n), dtype=bool), causal)[0]
            np.testing.assert_allclose(out[b, :n], alone, rtol=0, atol=1e-12)
    # the same through the named check, on the module itself (numpy and torch)
    module = m if impl == "numpy" else TorchMHA.from_numpy(m, use_sdpa=impl == "sdpa")
    xs = x if impl == "numpy" else torch.from_numpy(x)
    msk = mask if impl == "numpy" else torch.from_numpy(mask)
    assert "bit-identical" in diagnose_padding.check_real_tokens(module, xs, LENGTHS, msk, causal=causal)


def test_real_tokens_float32_within_stated_tolerance(rng):
    m = _module(rng)
    tm = TorchMHA.from_numpy(m, dtype=torch.float32)
    x = torch.from_numpy(rng.normal(size=(4, T, 16))).float()
    mask = masks.padding_mask(torch.tensor(LENGTHS), T)
    # the two runs add in a different order; the float32 gap is ~1e-7, far inside 1e-5
    assert "atol 1e-05" in diagnose_padding.check_real_tokens(tm, x, torch.tensor(LENGTHS), mask, causal=True)
    # a causal mask given with causal=False: the alone-runs are not causal, and the check says so
    with pytest.raises(AssertionError, match="a causal mask although causal=False"):
        diagnose_padding.check_real_tokens(tm, x, LENGTHS, masks.padding_mask(torch.tensor(LENGTHS), T, causal=True))


# ---- SDPA: boolean and float attn_mask ----------------------------------------------------------
def _qkv(seed=0, B=3, h=2, T=5, d_k=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, T, d_k, generator=g, dtype=torch.float64) for _ in range(3)]


def _manual(q, k, v, add):
    """softmax(q k^T / sqrt(d_k) + add) @ v, written out: what SDPA does with a float mask."""
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, h, T, S)
    return torch.softmax(scores + add, dim=-1) @ v  # (B, h, T, d_k)


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
def test_sdpa_float_mask_is_added_to_the_scores(backend):
    q, k, v = _qkv()
    lengths = torch.tensor([5, 2, 3])
    allowed = masks.padding_mask(lengths, 5, queries=False)  # (B, 1, T, S), no empty row
    with sdpa_kernel(backend):
        by_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        for fill in masks.FILLS:
            add = masks.additive_mask(allowed, torch.float64, float(masks.fill_value(fill, np.float64)))
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=add)
            torch.testing.assert_close(got, by_bool, rtol=0, atol=1e-12)
        # the classic mistake: a 0/1 float mask is added, not selected: padding keeps weight
        f01 = allowed.to(torch.float64)
        wrong = F.scaled_dot_product_attention(q, k, v, attn_mask=f01)
    torch.testing.assert_close(wrong, _manual(q, k, v, f01), rtol=0, atol=1e-12)
    gap = float((wrong - by_bool)[1].abs().max())
    assert gap > 0.1, f"a 0/1 float mask should change padded rows visibly, gap {gap}"
    torch.testing.assert_close(wrong[0], by_bool[0], rtol=0, atol=1e-12)  # no padding, no change


def test_sdpa_fully_masked_row_by_fill():
    q, k, v = _qkv()
    allowed = masks.padding_mask(torch.tensor([5, 2, 3]), 5)  # padded query rows fully masked
    zero = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)[1, :, 2:]
    assert (zero == 0).all()  # boolean mask: SDPA returns zeros for an empty row
    add_inf = masks.additive_mask(allowed, torch.float64)
    assert (F.scaled_dot_product_attention(q, k, v, attn_mask=add_inf)[1, :, 2:] == 0).all()
    # -1e9 in float64 keeps the scores' differences: the empty row attends as if unmasked
    add_1e9 = masks.additive_mask(allowed, torch.float64, -1e9)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=add_1e9)[1, :, 2:]
    unmasked = F.scaled_dot_product_attention(q, k, v)[1, :, 2:]
    torch.testing.assert_close(got, unmasked, rtol=0, atol=1e-6)


def test_attn_mask_with_is_causal_raises_in_math_and_is_accepted_by_cpu_flash():
    q, k, v = _qkv()
    allowed = masks.padding_mask(torch.tensor([5, 2, 3]), 5, queries=False)
    with sdpa_kernel(SDPBackend.MATH), pytest.raises(
            RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        both = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=True)
    # measured: the CPU flash kernel applies both, the same as one combined boolean mask
    combined = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed & torch.ones(5, 5).tril().bool())
    torch.testing.assert_close(both, combined, rtol=0, atol=1e-12)



@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
def test_is_causal_with_fewer_queries_is_top_left_on_both_cpu_backends(backend):
    """is_causal=True with T != S runs on CPU, as the top-left mask s <= t (not bottom-right)."""
    q, k, v = _qkv(T=6)
    q = q[:, :, :3]  # T = 3 queries, S = 6 keys
    top_left = torch.ones(3, 6, dtype=torch.bool).tril()
    bottom_right = causal_lower_right(3, 6)
    with sdpa_kernel(backend):
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=top_left),
                               rtol=0, atol=1e-12)
    by_hand = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 6).tril(3).bool())
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right),
                               by_hand, rtol=0, atol=1e-12)
    assert (got - by_hand).abs().max() > 0.1

def test_int_mask_is_rejected_by_sdpa_and_float_mask_by_our_modules(rng):
    q, k, v = _qkv()
    allowed = masks.padding_mask(torch.tensor([5, 2, 3]), 5)
    with pytest.raises(RuntimeError, match="attn_mask dtype to be bool or float"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.long())
    m = _module(rng)
    with pytest.raises(TypeError, match="boolean"):
        m(rng.normal(size=(3, 5, 16)), mask=to_np(allowed).astype(np.float64))


def test_torch_refuses_minus_1e9_in_float16_where_numpy_gives_minus_inf():
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.zeros(3, dtype=torch.float16).masked_fill(torch.tensor([True, False, True]), -1e9)
    assert masks.fill_value("-1e9", np.float16) == -np.inf
    add = masks.additive_mask(torch.tensor([True, False]), torch.float16, -1e9)
    assert add[1].item() == float("-inf")  # torch.full casts without complaint
    assert masks.additive_mask(np.array([True, False]), np.float16, -1e9)[1] == -np.inf


# ---- nn.MultiheadAttention: key_padding_mask, True = ignore ---------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_nn_mha_key_padding_mask_equals_ours(rng, causal):
    m = _module(rng)
    tm = TorchMHA.from_numpy(m)
    ref = tm.to_torch_mha()
    lengths = torch.tensor([6, 2, 4])
    x = torch.from_numpy(rng.normal(size=(3, T, 16)))
    kpm = masks.to_torch_key_padding_mask(lengths, T)  # (B, S), True = padding
    future = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = hide
    with torch.no_grad():
        theirs = ref(x, x, x, key_padding_mask=kpm, attn_mask=future, need_weights=False)[0]
        keys_only = tm(x, causal=causal, mask=masks.padding_mask(lengths, T, queries=False))
        full = tm(x, causal=causal, mask=masks.padding_mask(lengths, T))
    torch.testing.assert_close(theirs, keys_only, rtol=0, atol=1e-12)  # every row
    real = masks.query_padding_mask(lengths, T)
    torch.testing.assert_close(theirs[real], full[real], rtol=0, atol=1e-12)  # real rows
    # and the weights, head by head, against the numpy module's
    _, w = ref(x, x, x, key_padding_mask=kpm, attn_mask=future, average_attn_weights=False)
    m(x.numpy(), causal=causal, mask=masks.padding_mask(lengths.numpy(), T, queries=False))
    np.testing.assert_allclose(w.detach().numpy(), m.attn, rtol=0, atol=1e-12)


def test_our_polarity_given_to_nn_mha_gives_nan_and_is_named(rng):
    tm = TorchMHA.from_numpy(_module(rng))
    ref = tm.to_torch_mha()
    lengths = torch.tensor([6, 2, 4])
    x = torch.from_numpy(rng.normal(size=(3, T, 16)))
    flipped = masks.key_padding_mask(lengths, T)  # our True = real, read by it as True = ignore
    with torch.no_grad():
        weights_on = ref(x, x, x, key_padding_mask=flipped)[0]  # need_weights=True, the default
        train_path = ref(x, x, x, key_padding_mask=flipped, need_weights=False)[0]
        fast_path = ref.eval()(x, x, x, key_padding_mask=flipped, need_weights=False)[0]
    # the full-length sentence has no key left: NaN, except on the training SDPA path, which
    # gives zero weights and so out_proj's bias alone: finite garbage
    assert torch.isnan(weights_on[0]).all() and torch.isnan(fast_path[0]).all()
    torch.testing.assert_close(train_path[0], ref.out_proj.bias.expand(T, -1), rtol=0, atol=1e-12)
    # the opposite trap: nn.MultiheadAttention's key_padding_mask given to SDPA as (B, 1, 1, S)
    ignore = masks.to_torch_key_padding_mask(lengths, T)[:, None, None, :]  # True = padding
    with pytest.raises(AssertionError, match="polarity flipped"):
        diagnose_padding.check_padding(ignore, lengths)


# ---- the loss over real tokens -----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_mean_counts_real_positions_only(rng, backend):
    vals = rng.normal(size=(3, 5, 2))
    valid = masks.query_padding_mask(np.array([5, 1, 3]), 5)
    want = np.mean([vals[b, t, j] for b in range(3) for t in range(5) for j in range(2) if valid[b, t]])
    nan_pad = vals.copy()
    nan_pad[~valid] = np.nan  # nn.MultiheadAttention's empty rows: NaN must not leak
    got = masks.masked_mean(as_backend(nan_pad, backend), as_backend(valid, backend))
    assert abs(float(got) - want) <= 1e-15
    more_pad = np.concatenate([vals, np.full((3, 4, 2), 99.0)], axis=1)  # 4 more padded steps
    more_valid = np.concatenate([valid, np.zeros((3, 4), dtype=bool)], axis=1)
    got2 = masks.masked_mean(as_backend(more_pad, backend), as_backend(more_valid, backend))
    assert abs(float(got2) - want) <= 1e-15  # more padding, same loss
    naive = float(np.mean(np.where(valid[..., None], vals, 0.0)))  # counts padding in the denominator
    assert abs(naive - want) > 1e-3


def test_masked_mean_errors():
    with pytest.raises(TypeError, match="boolean"):
        masks.masked_mean(np.zeros((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="leading axes"):
        masks.masked_mean(np.zeros((2, 3)), np.ones((3, 2), dtype=bool))
    with pytest.raises(ValueError, match="zero real positions"):
        masks.masked_mean(np.zeros((2, 3)), np.zeros((2, 3), dtype=bool))


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_padded_tokens_get_exactly_zero_gradient(rng, use_sdpa):
    tm = TorchMHA.from_numpy(_module(rng), use_sdpa=use_sdpa)
    lengths = torch.tensor([6, 2, 4])
    x = torch.from_numpy(rng.normal(size=(3, T, 16))).requires_grad_()
    out = tm(x, causal=True, mask=masks.padding_mask(lengths, T))
    real = masks.query_padding_mask(lengths, T)
    masks.masked_mean((out ** 2).sum(-1), real).backward()
    assert torch.isfinite(x.grad).all() and (x.grad[~real] == 0).all()
    assert (x.grad[real].abs().sum(-1) > 0).all()
    assert all(torch.isfinite(p.grad).all() for p in tm.parameters())


# ---- the fill value, measured --------------------------------------------------------------------
FILL_TABLE = {  # (fill, dtype): (stored, masked score - row max, empty row plain, empty row guarded)
    ("-inf", "float16"): (-np.inf, -np.inf, "NaN", "zeros"),
    ("-inf", "float32"): (-np.inf, -np.inf, "NaN", "zeros"),
    ("-inf", "float64"): (-np.inf, -np.inf, "NaN", "zeros"),
    ("-1e9", "float16"): (-np.inf, -np.inf, "NaN", "zeros"),  # float16 cannot hold -1e9
    ("-1e9", "float32"): (-1e9, -1e9, "uniform 1/4", "uniform 1/4"),  # 18 is lost in rounding
    ("-1e9", "float64"): (-1e9, -1e9 - 18, "uniform 1/4", "uniform 1/4"),
    ("finfo.min", "float16"): (-65504.0, -np.inf, "uniform 1/4", "uniform 1/4"),  # overflow
    ("finfo.min", "float32"): (float(np.finfo(np.float32).min), float(np.finfo(np.float32).min),
                               "uniform 1/4", "uniform 1/4"),
    ("finfo.min", "float64"): (float(np.finfo(np.float64).min), float(np.finfo(np.float64).min),
                               "uniform 1/4", "uniform 1/4"),
}


@pytest.mark.parametrize(("fill", "dtype"), list(FILL_TABLE))
def test_fill_value_effects_table(fill, dtype):
    got = masks.fill_value_effects(fill, dtype)
    stored, shift, plain, guarded = FILL_TABLE[fill, dtype]
    assert got["masked_weight"] == 0.0  # every fill: a masked key in a normal row gets exactly 0
    assert (got["stored"], got["fill_minus_max"]) == (stored, shift)
    assert (got["full_row_plain"], got["full_row_guarded"]) == (plain, guarded)


def test_two_finite_fills_added_overflow_to_minus_inf():
    with np.errstate(over="ignore"):
        for dt in (np.float16, np.float32, np.float64):
            assert masks.fill_value("finfo.min", dt) * 2 == -np.inf  # e.g. padding + causal, added


def test_fill_value_names_and_row_words():
    with pytest.raises(ValueError, match="one of -inf, -1e9, finfo.min"):
        masks.fill_value("-1e4")
    assert masks.describe_row(np.array([np.nan, 0.0])) == "NaN"
    assert masks.describe_row(np.zeros(3)) == "zeros"
    assert masks.describe_row(np.full(4, 0.25)) == "uniform 1/4"
    assert masks.describe_row(np.array([0.9, 0.1])) == "[0.9 0.1]"


# ---- the named check -----------------------------------------------------------------------------
L3 = np.array([6, 2, 4])


def planted(name: str, causal: bool = False) -> np.ndarray:
    """A wrong padding mask for L3, T = 6, as a student might write it."""
    keys = masks.key_padding_mask(L3, T)  # (B, S)
    rows = masks.query_padding_mask(L3, T)  # (B, T)
    tril = np.tril(np.ones((T, T), dtype=bool)) if causal else np.ones((T, T), dtype=bool)
    s = np.arange(T)
    return {
        "flipped": ~masks.padding_mask(L3, T, causal=causal),
        "flipped_keys": np.broadcast_to(~keys[:, None, None, :], (3, 1, T, T)) & tril,
        "queries_only": rows[:, None, :, None] & tril,
        "no_padding": np.broadcast_to(tril, (3, 1, T, T)),
        "off_by_one": (s[None, :] <= L3[:, None])[:, None, None, :] & rows[:, None, :, None] & tril,
        "too_strict": (s[None, :] < L3[:, None] - 1)[:, None, None, :] & rows[:, None, :, None] & tril,
        "keys_only": masks.padding_mask(L3, T, causal=causal, queries=False),
        "no_causal": masks.padding_mask(L3, T),
        "transposed": masks.padding_mask(L3, T, causal=True).swapaxes(-1, -2),
        "causal_unasked": masks.padding_mask(L3, T, causal=True),
        "key_mask_2d": keys,
        "float01": masks.padding_mask(L3, T, causal=causal).astype(np.float32),
        "int01": masks.padding_mask(L3, T, causal=causal).astype(np.int64),
    }[name]


CAUGHT = [  # (planted mistake, causal, words the message must contain)
    ("flipped", False, "polarity flipped"),
    ("flipped", True, "polarity flipped"),
    ("flipped_keys", False, "polarity flipped"),
    ("flipped_keys", True, "polarity flipped"),
    ("queries_only", False, "padding applied to queries only"),
    ("no_padding", False, "padded keys still attended"),
    ("no_padding", True, "padded query rows are not masked"),
    ("off_by_one", False, "off by one"),
    ("too_strict", False, "real keys masked out"),
    ("keys_only", False, "padded query rows are not masked"),
    ("no_causal", True, "causal part missing"),
    ("transposed", True, "query and key axes swapped"),
    ("causal_unasked", False, "a causal mask although causal=False"),
    ("key_mask_2d", False, "Reshape it to (B, 1, 1, S)"),
    ("float01", False, "must be boolean"),
    ("int01", False, "SDPA refuses an integer attn_mask"),
]


@pytest.mark.parametrize(("name", "causal", "words"), CAUGHT, ids=[f"{n}-{c}" for n, c, _ in CAUGHT])
@pytest.mark.parametrize("backend", BACKENDS)
def test_check_padding_names_each_planted_mistake(name, causal, words, backend):
    wrong = as_backend(planted(name, causal), backend)
    with pytest.raises(AssertionError, match="padding mask wrong: .*" + re.escape(words)):
        diagnose_padding.check_padding(wrong, as_backend(L3, backend), causal=causal)


@pytest.mark.parametrize("name", ["queries_only", "off_by_one"])
def test_with_causal_right_padding_the_key_side_is_redundant(name):
    """Causal + right padding: a real query's past keys are all real, so these masks are right."""
    assert np.array_equal(planted(name, causal=True), masks.padding_mask(L3, T, causal=True))
    diagnose_padding.check_padding(planted(name, causal=True), L3, causal=True)


def test_the_try_it_check_agrees_the_key_term_is_redundant_under_causal():
    """14's Try it: dropping the key term, or writing it with <=, is the same mask, so 'right'."""

    def student(key_term: str):
        def my_decoder_mask(lengths, T):
            s = np.arange(T)
            real, le, tri = s < lengths[:, None], s <= lengths[:, None], s[None, :] <= s[:, None]
            if key_term == "none":
                return real[:, None, :, None] & tri
            return le[:, None, None, :] & real[:, None, :, None] & tri
        return my_decoder_mask

    lengths = np.array([5, 3, 1])
    for fn in (student("none"), student("<=")):
        assert check_decoder_mask(fn).startswith("right")
        assert "right" in diagnose_padding.check_padding(fn(lengths, 5), lengths, causal=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_check_padding_passes_right_masks(backend, causal):
    lengths = as_backend(L3, backend)
    assert "right" in diagnose_padding.check_padding(masks.padding_mask(lengths, T, causal=causal), lengths, causal)
    keys_only = masks.padding_mask(lengths, T, causal=causal, queries=False)
    assert "left free" in diagnose_padding.check_padding(keys_only, lengths, causal, queries=False)
    per_head = masks.padding_mask(lengths, T, causal=causal).expand(-1, 4, -1, -1) \
        if backend == "torch" else np.broadcast_to(masks.padding_mask(lengths, T, causal=causal), (3, 4, T, T))
    diagnose_padding.check_padding(per_head, lengths, causal)  # (B, h, T, S) is fine too



def test_check_padding_names_an_off_by_one_on_the_query_side():
    """With causal masking s <= L only shows in the query rows: the first padded one is open."""
    s = np.arange(T)
    le = s[None, :] <= L3[:, None]  # (B, T): counts position L_b as real
    tril = np.tril(np.ones((T, T), dtype=bool))
    for wrong in (le[:, None, None, :] & le[:, None, :, None] & tril,  # on both terms
                  masks.key_padding_mask(L3, T)[:, None, None, :] & le[:, None, :, None] & tril):
        with pytest.raises(AssertionError, match="off by one on the query side: in sequence 1 "
                                                 r"\(length 2\), query 2, the first padded one"):
            diagnose_padding.check_padding(wrong, L3, causal=True)
    keys_only = masks.padding_mask(L3, T, causal=True, queries=False)  # every padded row open
    with pytest.raises(AssertionError, match="padded query rows are not masked"):
        diagnose_padding.check_padding(keys_only, L3, causal=True)


def test_a_3d_mask_is_right_for_our_modules_and_says_what_sdpa_needs(rng):
    right4 = masks.padding_mask(L3, T, causal=True)  # (B, 1, T, S)
    said = diagnose_padding.check_padding(right4[:, 0], L3, causal=True)  # (B, T, S)
    assert "right" in said and "give it (B, 1, T, S): mask[:, None]" in said, said
    assert "(B, T, S)" not in diagnose_padding.check_padding(right4, L3, causal=True)
    m = _module(rng)
    x = rng.normal(size=(3, T, 16))
    np.testing.assert_array_equal(m(x, mask=right4[:, 0]), m(x, mask=right4))  # modules insert h
    # what the message claims of SDPA: B lines up with the heads (error if h != B, wrong if h == B)
    m3, m4 = torch.from_numpy(right4[:, 0]), torch.from_numpy(right4)
    q4, q3 = _qkv(B=3, h=4, T=T)[0], _qkv(B=3, h=3, T=T)[0]
    with pytest.raises(RuntimeError, match="must match the size"):
        F.scaled_dot_product_attention(q4, q4, q4, attn_mask=m3)
    gap = (F.scaled_dot_product_attention(q3, q3, q3, attn_mask=m3)
           - F.scaled_dot_product_attention(q3, q3, q3, attn_mask=m4)).abs().max()
    assert gap > 0.1

def test_check_padding_cross_attention_and_per_head():
    q_len, kv_len = np.array([3, 1]), np.array([5, 2])
    right = masks.padding_mask(q_len, 4, S=6, kv_lengths=kv_len)
    diagnose_padding.check_padding(right, q_len, kv_lengths=kv_len)
    with pytest.raises(AssertionError, match="padded keys still attended"):
        diagnose_padding.check_padding(masks.padding_mask(q_len, 4, S=6, kv_lengths=np.array([5, 4])), q_len,
                            kv_lengths=kv_len)
    heads = np.broadcast_to(right, (2, 3, 4, 6)).copy()
    heads[:, 2] = ~heads[:, 2]
    with pytest.raises(AssertionError, match="head 2: polarity flipped"):
        diagnose_padding.check_padding(heads, q_len, kv_lengths=kv_len)


REAL_TOKEN_CASES = [("queries_only", False, "padding applied to queries only"),
                    ("flipped_keys", False, "polarity flipped"),
                    ("flipped_keys", True, "polarity flipped"),
                    ("off_by_one", False, "off by one"),
                    ("no_padding", False, "padded keys still attended")]


@pytest.mark.parametrize(("name", "causal", "words"), REAL_TOKEN_CASES)
def test_check_real_tokens_fails_on_planted_masks_and_names_them(rng, name, causal, words):
    m = _module(rng)
    x = rng.normal(size=(3, T, 16))
    with pytest.raises(AssertionError, match="real tokens changed by padding.*" + words):
        diagnose_padding.check_real_tokens(m, x, L3, planted(name, causal), causal=causal)


def test_check_real_tokens_blames_the_module_when_the_mask_is_right(rng):
    m = _module(rng)
    x = rng.normal(size=(3, T, 16))

    def ignores_mask(x, causal=False, mask=None):  # a module that drops the mask
        return m(x, causal=causal)

    with pytest.raises(AssertionError, match="the mask itself is right"):
        diagnose_padding.check_real_tokens(ignores_mask, x, L3, masks.padding_mask(L3, T))


def test_check_real_tokens_catches_a_tiny_leak_and_a_constant_module(rng):
    m = _module(rng)
    x = rng.normal(size=(3, T, 16))

    def leaky(x, causal=False, mask=None):  # within atol of the alone-run, but not bit-identical
        return m(x, causal=causal, mask=mask) + 1e-15 * x.sum(axis=1, keepdims=True)

    with pytest.raises(AssertionError, match="padded inputs leak into real outputs"):
        diagnose_padding.check_real_tokens(leaky, x, L3, masks.padding_mask(L3, T), atol=1e-12)

    def constant(x, causal=False, mask=None):
        return np.zeros_like(x)

    with pytest.raises(AssertionError, match="control case failed"):
        diagnose_padding.check_real_tokens(constant, x, L3, masks.padding_mask(L3, T))


# ---- on the GPU --------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: masks and modules on the GPU")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_cuda_masks_follow_the_lengths_device_and_keep_real_tokens(dtype):
    lengths = torch.tensor(LENGTHS, device="cuda")
    mask = masks.padding_mask(lengths, T, causal=True)
    assert mask.device.type == "cuda" and mask.dtype == torch.bool
    np.testing.assert_array_equal(mask.cpu().numpy(), loop_mask(LENGTHS, T, causal=True))
    m = _module(np.random.default_rng(0))
    tm = TorchMHA.from_numpy(m, dtype=dtype, device="cuda")
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(4, T, 16))).to("cuda", dtype)
    # float64 runs SDPA's math kernel, float16 a fused one; either way padding must not leak
    assert "bit-identical" in diagnose_padding.check_real_tokens(tm, x, lengths, masks.padding_mask(lengths, T),
                                                      causal=True)
    if dtype == torch.float64:
        with torch.no_grad():
            got = tm(x, mask=mask).cpu().numpy()
        np.testing.assert_allclose(got, m(x.cpu().numpy(), mask=mask.cpu().numpy()), rtol=0, atol=1e-12)
