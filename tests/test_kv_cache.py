"""KV cache: decoding token by token or in chunks equals the full causal forward, in numpy and torch.

One contract over every implementation ("numpy", torch "sdpa", torch "manual"): feeding the
tokens through `decode_step` in any chunking gives the output of one causal forward over all
of them. Plus the bug it guards against (top-left alignment), and the cache's own contract:
clear errors that leave it unchanged, reset, and its memory.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

from mha import steps
from mha.inference.kv_cache import (
    KVCache,
    TorchKVCache,
    decode_step,
    decode_step_cost,
    torch_decode_step,
)
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import MultiHeadAttention as TorchMHA
from mha.perf.bench import derived_tolerance

IMPLS = ["numpy", "sdpa", "manual"]


def _module(rng, d_model=24, n_heads=4, dtype=np.float64) -> MultiHeadAttention:
    """A numpy module with nonzero biases (zero biases would hide a bias applied twice or never)."""
    m = MultiHeadAttention(d_model, n_heads, seed=3, dtype=dtype)
    m.bq, m.bk, m.bv, m.bo = (rng.normal(size=d_model).astype(dtype) for _ in range(4))
    return m


def decode(impl: str, m: MultiHeadAttention, x: np.ndarray, chunks, align="bottom_right"):
    """Feed x (B, T, d_model) through implementation `impl` chunk by chunk; return (B, T, d_model) numpy."""
    assert sum(chunks) == x.shape[1]
    bounds = np.cumsum([0, *chunks])
    if impl == "numpy":
        cache = KVCache.for_module(m, x.shape[0], max_len=x.shape[1])
        outs = [decode_step(m, cache, x[:, a:b], align) for a, b in pairwise(bounds)]
        return np.concatenate(outs, axis=1)  # n_chunks x (B, t_new, d_model) -> (B, T, d_model)
    tm = TorchMHA.from_numpy(m, use_sdpa=impl == "sdpa")
    cache = TorchKVCache.for_module(tm, x.shape[0], max_len=x.shape[1])
    xt = torch.from_numpy(x)
    outs = [torch_decode_step(tm, cache, xt[:, a:b], align) for a, b in pairwise(bounds)]
    return torch.cat(outs, dim=1).numpy()  # (B, T, d_model)


# ---- decoding equals the full causal forward ------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_token_by_token_equals_full_causal_forward_float64(rng, impl):
    m = _module(rng)
    x = rng.normal(size=(2, 9, 24))
    full = m(x, causal=True)  # (B, T, d_model)
    out = decode(impl, m, x, [1] * 9)
    np.testing.assert_allclose(out, full, rtol=0, atol=1e-12)
    # Close, but not bit-equal here (300 of 432 outputs differ, by up to ~1.3e-15): the full
    # forward multiplies (T, d_model) @ (d_model, d_model) and (T, d_k) @ (d_k, T) matrices while
    # decoding does (1, d_model) and (1, d_k) @ (d_k, S) rows, and BLAS picks different kernels /
    # summation orders for the two shapes; the softmax sums a row of T terms (zeros past t
    # included) instead of t + 1, which regroups numpy's pairwise sum. Whether the last bits
    # agree depends on the BLAS build, so this compares with a tolerance and asserts nothing
    # about bit-equality.


@pytest.mark.parametrize("impl", IMPLS)
def test_token_by_token_float32_within_derived_tolerance(rng, impl):
    m64 = _module(rng, 32, 4)
    m32 = MultiHeadAttention(32, 4, dtype=np.float32)
    for name in ("Wq", "bq", "Wk", "bk", "Wv", "bv", "Wo", "bo"):  # same (rounded) weights
        setattr(m32, name, getattr(m64, name).astype(np.float32))
        setattr(m64, name, getattr(m32, name).astype(np.float64))
    x32 = rng.normal(size=(2, 11, 32)).astype(np.float32)
    golden = m64(x32.astype(np.float64), causal=True)  # float64 on the same rounded numbers
    # allowed = max(1e-5, 3 x the float32 full forward's own error against float64)
    ref_err, allowed = derived_tolerance(golden, m32(x32, causal=True), torch.float32)
    out = decode(impl, m32, x32, [1] * 11)
    assert out.dtype == np.float32
    err = float(np.abs(out.astype(np.float64) - golden).max())
    assert err <= allowed, f"{impl}: error {err:.3g} > allowed {allowed:.3g} (ref_err {ref_err:.3g})"


CHUNKS = [5, 3, 2, 1, 1]  # prefill 5, then chunks of 3 and 2, then single tokens


@pytest.mark.parametrize("impl", IMPLS)
def test_chunked_prefill_equals_full_forward(rng, impl):
    m = _module(rng)
    x = rng.normal(size=(2, sum(CHUNKS), 24))
    np.testing.assert_allclose(decode(impl, m, x, CHUNKS), m(x, causal=True), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_top_left_alignment_is_wrong_once_the_cache_is_not_empty(rng, impl):
    m = _module(rng)
    x = rng.normal(size=(2, sum(CHUNKS), 24))
    full = m(x, causal=True)
    wrong = decode(impl, m, x, CHUNKS, align="top_left")
    # The first chunk has T == S, where both alignments coincide ...
    np.testing.assert_allclose(wrong[:, :5], full[:, :5], rtol=0, atol=1e-12)
    # ... after it, offset 0 lets query i see only keys 0..i, not 0..S - t_new + i.
    gap = np.abs(wrong[:, 5:] - full[:, 5:]).max(axis=(0, 2))  # (T - 5,): one per position
    assert (gap > 1e-3).all(), f"top-left output should differ at every later position, gaps {gap}"


@settings(max_examples=25, deadline=None)
@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=6), impl=st.sampled_from(IMPLS),
       seed=st.integers(0, 2**16))
def test_any_chunking_equals_full_forward(chunks, impl, seed):
    rng = np.random.default_rng(seed)
    m = _module(rng, 16, 2)
    x = rng.normal(size=(2, sum(chunks), 16))
    np.testing.assert_allclose(decode(impl, m, x, chunks), m(x, causal=True), rtol=0, atol=1e-12)


def test_torch_decode_equals_numpy_decode_and_full_torch_forward(rng):
    m = _module(rng)
    x = rng.normal(size=(2, sum(CHUNKS), 24))
    numpy_out = decode("numpy", m, x, CHUNKS)
    for use_sdpa in (True, False):
        tm = TorchMHA.from_numpy(m, use_sdpa=use_sdpa)
        with torch.no_grad():
            full = tm(torch.from_numpy(x), causal=True).numpy()
        out = decode("sdpa" if use_sdpa else "manual", m, x, CHUNKS)
        np.testing.assert_allclose(out, numpy_out, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out, full, rtol=0, atol=1e-12)


def test_sdpa_is_causal_is_top_left_and_causal_lower_right_is_bottom_right(rng):
    q = torch.from_numpy(rng.normal(size=(1, 2, 3, 4)))  # (B, h, t_new=3, d_k)
    k, v = (torch.from_numpy(rng.normal(size=(1, 2, 8, 4))) for _ in range(2))  # (B, h, S=8, d_k)
    top_left = torch.from_numpy(steps.causal_mask(3, 8))  # (3, 8): query i sees keys 0..i
    bottom_right = torch.from_numpy(steps.causal_mask(3, 8, offset=5))  # keys 0..5+i
    is_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    lower_right = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 8))
    torch.testing.assert_close(is_causal, F.scaled_dot_product_attention(q, k, v, attn_mask=top_left))
    torch.testing.assert_close(lower_right,
                               F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right))
    assert (is_causal - lower_right).abs().max() > 1e-3  # the two alignments really differ


def test_several_layers_take_one_cache_each(rng):
    layers = [_module(rng, 16, 2) for _ in range(2)]
    layers[1].Wq = rng.normal(size=(16, 16)) / 4  # a second, different layer
    x = rng.normal(size=(1, 6, 16))
    full = layers[1](layers[0](x, causal=True), causal=True)
    caches = [KVCache.for_module(m, 1, max_len=6) for m in layers]
    outs = []
    for a, b in [(0, 4), (4, 5), (5, 6)]:
        y = x[:, a:b]
        for m, c in zip(layers, caches, strict=True):
            y = decode_step(m, c, y)
        outs.append(y)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=0, atol=1e-12)


# ---- the cache's contract ---------------------------------------------------------------------
def _caches():
    """A numpy and a torch cache with B=2, h=4, max_len=16, d_k=8, float64."""
    return [KVCache(2, 4, 16, 8, np.float64), TorchKVCache(2, 4, 16, 8, torch.float64)]


def _kv(cache, rng, shape, dtype=None):
    """Random k, v of `shape` in the cache's array type (and dtype unless given)."""
    k, v = rng.normal(size=shape), rng.normal(size=shape)
    if isinstance(cache, KVCache):
        return k.astype(dtype or cache.dtype), v.astype(dtype or cache.dtype)
    return torch.from_numpy(k).to(dtype or cache.dtype), torch.from_numpy(v).to(dtype or cache.dtype)


def _snapshot(cache):
    """Length and copies of both buffers, as numpy."""
    as_np = (lambda a: a.copy()) if isinstance(cache, KVCache) else (lambda a: a.clone().numpy())
    return cache.length, as_np(cache.K), as_np(cache.V)


@pytest.mark.parametrize("which", [0, 1], ids=["numpy", "torch"])
def test_append_writes_slots_and_returns_views(rng, which):
    cache = _caches()[which]
    k1, v1 = _kv(cache, rng, (2, 4, 5, 8))
    k2, v2 = _kv(cache, rng, (2, 4, 1, 8))
    cache.append(k1, v1)
    K, V = cache.append(k2, v2)
    assert len(cache) == 6 and tuple(K.shape) == (2, 4, 6, 8) and tuple(V.shape) == (2, 4, 6, 8)
    if isinstance(cache, KVCache):
        assert np.shares_memory(K, cache.K) and np.shares_memory(V, cache.V)  # views, no copy
        cat = np.concatenate
    else:
        assert K.data_ptr() == cache.K.data_ptr() and V.data_ptr() == cache.V.data_ptr()
        cat = torch.cat
    assert (K == cat([k1, k2], 2)).all() and (V == cat([v1, v2], 2)).all()
    assert (cache.K[:, :, 6:] == 0).all()  # untouched slots stay empty


BAD = {  # name -> (shape, dtype or None, error type, words the message must contain)
    "overflow": ((2, 4, 4, 8), None, ValueError,
                 "cache holds at most max_len=16 positions; 14 are used and the chunk adds 4"),
    "wrong dtype": ((2, 4, 1, 8), "float32", TypeError, "must be torch.float64|must be float64"),
    "wrong width d_k": ((2, 4, 1, 6), None, ValueError, "k must be (B=2, h=4, t_new, d_k=8)"),
    "wrong batch": ((3, 4, 1, 8), None, ValueError, "k must be (B=2, h=4, t_new, d_k=8)"),
    "wrong heads": ((2, 2, 1, 8), None, ValueError, "got (2, 2, 1, 8)"),
    "empty chunk": ((2, 4, 0, 8), None, ValueError, "at least one position"),
}


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
@pytest.mark.parametrize("which", [0, 1], ids=["numpy", "torch"])
def test_bad_chunk_raises_clearly_and_leaves_cache_unchanged(rng, which, bad):
    cache = _caches()[which]
    cache.append(*_kv(cache, rng, (2, 4, 14, 8)))
    before = _snapshot(cache)
    shape, dtype, error, words = BAD[bad]
    if dtype is not None:
        dtype = np.dtype(dtype) if which == 0 else getattr(torch, dtype)
    with pytest.raises(error, match="|".join(p.replace("(", r"\(").replace(")", r"\)")
                                             for p in words.split("|"))):
        cache.append(*_kv(cache, rng, shape, dtype))
    after = _snapshot(cache)
    assert after[0] == before[0] == 14
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[2], before[2])


@pytest.mark.parametrize("which", [0, 1], ids=["numpy", "torch"])
def test_v_must_match_k_and_arrays_must_match_the_backend(rng, which):
    cache = _caches()[which]
    k, v = _kv(cache, rng, (2, 4, 2, 8))
    with pytest.raises(ValueError, match=r"v must have the shape of k \(2, 4, 2, 8\), got \(2, 4, 1, 8\)"):
        cache.append(k, v[:, :, :1])
    other = (lambda a: torch.from_numpy(a)) if which == 0 else (lambda a: a.numpy())
    with pytest.raises(TypeError, match="k must be a"):
        cache.append(other(k), other(v))
    assert len(cache) == 0 and not cache.K.any()


def test_decode_step_errors_leave_the_cache_unchanged(rng):
    m = _module(rng, 16, 2)
    cache = KVCache.for_module(m, 2, max_len=6)
    decode_step(m, cache, rng.normal(size=(2, 5, 16)))
    before = _snapshot(cache)
    with pytest.raises(ValueError, match="cache holds at most max_len=6 positions; 5 are used "
                                         "and the chunk adds 2"):
        decode_step(m, cache, rng.normal(size=(2, 2, 16)))
    with pytest.raises(ValueError, match=r"x must be \(B, T, d_model=16\), got \(2, 1, 12\)"):
        decode_step(m, cache, rng.normal(size=(2, 1, 12)))
    with pytest.raises(TypeError, match="x must be float64 to match the weights, got float32"):
        decode_step(m, cache, rng.normal(size=(2, 1, 16)).astype(np.float32))
    with pytest.raises(ValueError, match="cache must be built for .B=3.* got .B=2"):
        decode_step(m, cache, rng.normal(size=(3, 1, 16)))
    with pytest.raises(TypeError, match="cache must be a KVCache, got TorchKVCache"):
        decode_step(m, TorchKVCache(2, 2, 6, 8, torch.float64), rng.normal(size=(2, 1, 16)))
    after = _snapshot(cache)
    assert after[0] == before[0] == 5
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[2], before[2])


def test_torch_decode_step_rejects_numpy_input_and_wrong_dtype(rng):
    tm = TorchMHA.from_numpy(_module(rng, 16, 2))
    cache = TorchKVCache.for_module(tm, 1, max_len=4)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got a numpy array"):
        torch_decode_step(tm, cache, rng.normal(size=(1, 1, 16)))
    with pytest.raises(TypeError, match="x must be torch.float64 to match the weights"):
        torch_decode_step(tm, cache, torch.zeros(1, 1, 16))
    assert len(cache) == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_reset_empties_the_cache_and_decoding_starts_over(rng, impl):
    m = _module(rng, 16, 2)
    x = rng.normal(size=(1, 4, 16))
    if impl == "numpy":
        cache, step, xs = KVCache.for_module(m, 1, max_len=4), decode_step, x
        tm = m
    else:
        tm = TorchMHA.from_numpy(m, use_sdpa=impl == "sdpa")
        cache, step, xs = TorchKVCache.for_module(tm, 1, max_len=4), torch_decode_step, torch.from_numpy(x)
    first = step(tm, cache, xs[:, :3])
    step(tm, cache, xs[:, 3:])
    assert len(cache) == 4
    cache.reset()
    assert len(cache) == 0 and not cache.K.any() and not cache.V.any()
    again = step(tm, cache, xs[:, :3])  # same input, fresh cache: same output, room again
    assert len(cache) == 3 and (again == first).all()


@pytest.mark.parametrize("cache", [KVCache(2, 4, 16, 8, np.float64), KVCache(3, 2, 10, 4, np.float32),
                                   TorchKVCache(2, 4, 16, 8, torch.float64),
                                   TorchKVCache(3, 2, 10, 4, torch.float32)],
                         ids=["numpy64", "numpy32", "torch64", "torch32"])
def test_nbytes_matches_the_arrays(cache):
    B, h, max_len, d_k = cache.B, cache.n_heads, cache.max_len, cache.d_k
    assert tuple(cache.K.shape) == tuple(cache.V.shape) == (B, h, max_len, d_k)
    assert cache.nbytes == cache.K.nbytes + cache.V.nbytes
    assert cache.nbytes == 2 * B * h * max_len * d_k * cache.dtype.itemsize


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        KVCache(1, 2, 0, 4)
    with pytest.raises(TypeError, match="dtype must be a floating-point type, got int64"):
        KVCache(1, 2, 4, 4, np.int64)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        TorchKVCache(1, 2, 4, 4, np.float64)


# ---- what a decoding step costs on an accelerator ---------------------------------------------
def test_decode_step_cost_of_a_7b_layer_is_memory_bound_on_an_h100():
    c = decode_step_cost(1, 32, 4096, 128, 2)  # bf16, 32 heads of 128, 4096 cached positions
    assert c.flops == 67_108_864  # 4 * 32 * 4096 * 128, by hand
    assert c.bytes == 67_108_864  # 2 (K and V) * 32 * 4096 * 128 * 2 bytes, by hand
    assert c.intensity == 1.0 and c.bound == "memory"
    assert round(c.ridge) == 295  # 989e12 / 3.35e12
    assert abs(c.memory_s - 67_108_864 / 3.35e12) < 1e-15 and c.memory_s / c.compute_s > 290


@pytest.mark.parametrize("B, h, h_kv, itemsize, want", [(1, 8, None, 2, 1.0), (16, 8, None, 2, 1.0),
                                                        (1, 8, None, 4, 0.5), (1, 8, 2, 2, 4.0),
                                                        (4, 8, 1, 1, 16.0)])
def test_intensity_is_two_over_itemsize_times_the_group_size(B, h, h_kv, itemsize, want):
    """Batching adds work and cache alike (intensity unchanged); sharing K, V heads (GQA) raises it."""
    c = decode_step_cost(B, h, 100, 64, itemsize, n_kv_heads=h_kv)
    assert c.intensity == want


@pytest.mark.parametrize("h_kv, dtype", [(8, np.float16), (2, np.float16), (8, np.float32)])
def test_decode_step_reads_exactly_the_bytes_a_cache_allocates(h_kv, dtype):
    cache = KVCache(3, h_kv, 100, 64, dtype)  # full: S = max_len = 100
    assert decode_step_cost(3, 8, 100, 64, np.dtype(dtype).itemsize, n_kv_heads=h_kv).bytes == cache.nbytes


def test_a_slow_enough_accelerator_makes_decoding_compute_bound():
    c = decode_step_cost(1, 8, 100, 64, 2, peak_flops=1e9, bandwidth=1e12)  # ridge 0.001 FLOP/byte
    assert c.bound == "compute" and c.compute_s > c.memory_s


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(S=0), ValueError, "S must be >= 1, got 0"),
    (dict(itemsize=2.0), TypeError, "itemsize must be an int, got float 2.0"),
    (dict(n_kv_heads=3), ValueError, "h=8 must be a multiple of n_kv_heads=3"),
    (dict(bandwidth=0), ValueError, "bandwidth must be a positive number, got 0"),
    (dict(peak_flops="989e12"), ValueError, "peak_flops must be a positive number, got '989e12'"),
])
def test_decode_step_cost_rejects_bad_arguments(kwargs, error, match):
    args = dict(B=1, h=8, S=16, d_k=64, itemsize=2) | kwargs
    with pytest.raises(error, match=match):
        decode_step_cost(**args)

