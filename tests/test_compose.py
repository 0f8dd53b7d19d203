"""The composed module: GQA, RoPE, ALiBi, windows, padding and the cache meet in one forward.

Each contract is checked against something independent of the code under test: a sequence
run alone (padding), weights repeated or permuted by hand (GQA, RoPE pairings), the dense
window mask of mha.attention.masks (rolling cache), and the torch twin on every backend. float64 to
1e-12: the paths differ only in summation order, so their difference is a few ulps of O(1)
outputs; 1e-12 leaves ~1000x headroom and still catches any real mistake (which moves
outputs by ~1e-2 or more, as the planted cases below show).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mha.attention import masks, numpy_attention, posenc, torch_attention
from mha.inference import generate
from mha.inference.kv_cache import KVCache, TorchKVCache, decode_step
from mha.modules import compose, numpy_mha, torch_mha
from mha.training import train

TOL = 1e-12
D, H = 16, 4  # d_model, heads: d_k = 4
OPTIONS = [
    {},
    {"n_kv_heads": 2},
    {"n_kv_heads": 1, "rope": "half"},
    {"n_kv_heads": 2, "rope": "interleaved", "window": 3},
    {"alibi": True, "window": 4},
    {"rope": "half", "window": 2},
]


def ids(opts: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in opts.items()) or "plain"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def chunks(T: int) -> list[tuple[int, int]]:
    """Prefill 3 tokens, then one at a time, then a chunk of 2 (as decoding mixes them)."""
    cuts = [0, 3] + list(range(4, T - 1)) + [T]
    return list(zip(cuts, cuts[1:], strict=False))


@pytest.mark.parametrize("opts", OPTIONS, ids=ids)
def test_decoding_with_the_cache_equals_one_causal_forward(rng, opts):
    m = numpy_mha.MultiHeadAttention(D, H, seed=1, **opts)
    x = rng.normal(size=(2, 9, D))
    full = m(x, causal=True)
    cache = m.new_cache(2, 9)
    outs = [m(x[:, a:b], causal=True, cache=cache) for a, b in chunks(9)]
    np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=0, atol=TOL)
    assert len(cache) == 9


@pytest.mark.parametrize("opts", OPTIONS, ids=ids)
def test_a_left_padded_batch_equals_each_sequence_run_alone(rng, opts):
    m = numpy_mha.MultiHeadAttention(D, H, seed=2, **opts)
    lengths = np.array([3, 7, 5])
    x = rng.normal(size=(3, 7, D))
    pos = compose.padded_positions(lengths, 7)  # (B, T): -1 on the pads at the left
    batch = m(x, causal=True, positions=pos)
    cache = m.new_cache(3, 10)  # and the same through the cache, then 3 decoded tokens
    m(x, causal=True, positions=pos, cache=cache)
    more = rng.normal(size=(3, 3, D))
    steps = [m(more[:, i:i + 1], causal=True, cache=cache) for i in range(3)]
    for b, L in enumerate(lengths):
        alone = m(np.concatenate([x[b:b + 1, 7 - L:], more[b:b + 1]], 1), causal=True)
        np.testing.assert_allclose(batch[b, 7 - L:], alone[0, :L], rtol=0, atol=TOL)
        np.testing.assert_allclose(np.concatenate(steps, 1)[b], alone[0, L:], rtol=0, atol=TOL)


def test_pads_at_position_zero_instead_of_minus_one_are_caught(rng):
    """The check above can fail: pads given real positions are read and move every output."""
    m = numpy_mha.MultiHeadAttention(D, H, seed=2, rope="half")
    x = rng.normal(size=(2, 5, D))
    pos = compose.padded_positions(np.array([2, 5]), 5)
    wrong = np.maximum(pos, 0)  # the mistake: pads at position 0 look like a first token
    alone = m(x[:1, 3:], causal=True)[0]
    assert np.abs(m(x, causal=True, positions=wrong)[0, 3:] - alone).max() > 1e-2
    np.testing.assert_allclose(m(x, causal=True, positions=pos)[0, 3:], alone, rtol=0, atol=TOL)


@pytest.mark.parametrize("h_kv", [1, 2, 4])
def test_gqa_equals_mha_with_each_kv_head_copied_to_its_group(rng, h_kv):
    g = numpy_mha.MultiHeadAttention(D, H, seed=3, n_kv_heads=h_kv, rope="half")
    m = numpy_mha.MultiHeadAttention(D, H, seed=3, rope="half")
    d_k, group = D // H, H // h_kv
    m.Wq, m.Wo, m.bq, m.bo = g.Wq, g.Wo, g.bq, g.bo
    for name in ("k", "v"):  # query head j reads kv head j // group: copy its columns there
        W, b = getattr(g, f"W{name}"), getattr(g, f"b{name}")
        cols = [c for j in range(H) for c in range((j // group) * d_k, (j // group + 1) * d_k)]
        setattr(m, f"W{name}", W[:, cols])
        setattr(m, f"b{name}", b[cols])
    x = rng.normal(size=(2, 6, D))
    np.testing.assert_allclose(g(x, causal=True), m(x, causal=True), rtol=0, atol=TOL)
    assert g.new_cache(2, 6).nbytes * group == m.new_cache(2, 6).nbytes


def test_interleaved_rope_equals_half_split_with_permuted_weights(rng):
    """The two pairings differ by a fixed permutation of each head's q and k features."""
    inter = numpy_mha.MultiHeadAttention(D, H, seed=4, n_kv_heads=2, rope="interleaved")
    half = numpy_mha.MultiHeadAttention(D, H, seed=4, n_kv_heads=2, rope="half")
    d_k = D // H
    perm = posenc.rope_permutation(d_k)  # half feature i takes interleaved feature perm[i]
    for name, heads in (("q", H), ("k", 2)):
        cols = np.concatenate([j * d_k + perm for j in range(heads)])
        setattr(half, f"W{name}", getattr(inter, f"W{name}")[:, cols])
        setattr(half, f"b{name}", getattr(inter, f"b{name}")[cols])
    x = rng.normal(size=(2, 7, D))
    np.testing.assert_allclose(half(x, causal=True), inter(x, causal=True), rtol=0, atol=TOL)
    unpermuted = numpy_mha.MultiHeadAttention(D, H, seed=4, n_kv_heads=2, rope="half")
    assert np.abs(unpermuted(x, causal=True) - inter(x, causal=True)).max() > 1e-2


def test_rope_permutation_maps_one_rotation_onto_the_other(rng):
    x = rng.normal(size=(2, 3, 5, 8))
    perm = posenc.rope_permutation(8)
    p = np.arange(5) + 11
    np.testing.assert_allclose(posenc.rope(x[..., perm], p, pairing="half"),
                               posenc.rope(x, p, pairing="interleaved")[..., perm], rtol=0, atol=TOL)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_the_rolling_cache_keeps_window_keys_and_equals_the_dense_window_mask(rng, window):
    m = numpy_mha.MultiHeadAttention(D, H, seed=5, n_kv_heads=2, rope="half", window=window)
    plain = numpy_mha.MultiHeadAttention(D, H, seed=5, n_kv_heads=2, rope="half")
    x = rng.normal(size=(2, 20, D))
    dense = plain(x, mask=masks.sliding_window_mask(20, window))  # (T, S) band, built apart
    cache = m.new_cache(2, 20)
    outs = [m(x[:, a:b], causal=True, cache=cache) for a, b in chunks(20)]
    np.testing.assert_allclose(np.concatenate(outs, 1), dense, rtol=0, atol=TOL)
    assert cache.K.shape == (2, 2, window, D // H)  # O(window), whatever T
    assert cache.nbytes == 2 * 2 * 2 * window * (D // H) * 8


def test_a_rolling_cache_that_drops_the_wrong_key_is_caught(rng):
    """The check above can fail: a window one key too narrow moves the outputs."""
    x = rng.normal(size=(1, 8, D))
    right = numpy_mha.MultiHeadAttention(D, H, seed=5, window=3)(x, causal=True)
    narrow = numpy_mha.MultiHeadAttention(D, H, seed=5, window=2)(x, causal=True)
    assert np.abs(right - narrow).max() > 1e-2


@pytest.mark.parametrize("backend", [b for b in torch_attention.BACKENDS.names()
                                     if b != "triton"])  # triton takes no padding mask
@pytest.mark.parametrize("opts", OPTIONS, ids=ids)
def test_the_torch_twin_equals_numpy_on_every_backend(rng, opts, backend):
    m = numpy_mha.MultiHeadAttention(D, H, seed=6, **opts)
    tm = torch_mha.MultiHeadAttention.from_numpy(m, backend=backend)
    assert tm.options == m.options
    x = rng.normal(size=(3, 7, D))
    pos = compose.padded_positions(np.array([7, 4, 6]), 7)
    want = m(x, causal=True, positions=pos)
    with torch.no_grad():  # FlexAttention has no CPU backward in torch 2.13
        got = tm(torch.from_numpy(x), causal=True, positions=torch.from_numpy(pos)).numpy()
    real = pos >= 0
    np.testing.assert_allclose(got[real], want[real], rtol=0, atol=TOL)


@pytest.mark.parametrize("opts", OPTIONS, ids=ids)
def test_torch_decoding_equals_numpy_decoding(rng, opts):
    m = numpy_mha.MultiHeadAttention(D, H, seed=7, **opts)
    tm = torch_mha.MultiHeadAttention.from_numpy(m)
    x = rng.normal(size=(2, 8, D))
    c, tc = m.new_cache(2, 8), tm.new_cache(2, 8)
    assert isinstance(tc, TorchKVCache) and tc.nbytes == c.nbytes
    for a, b in chunks(8):
        want = m(x[:, a:b], causal=True, cache=c)
        with torch.no_grad():
            got = tm(torch.from_numpy(x[:, a:b]), causal=True, cache=tc).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_alibi_module_adds_the_papers_bias(rng):
    m = numpy_mha.MultiHeadAttention(D, H, seed=8, alibi=True)
    x = rng.normal(size=(1, 5, D))
    m(x, causal=True)
    plain = numpy_mha.MultiHeadAttention(D, H, seed=8)
    q = plain.Wq.T @ x[0].T  # (d_model, T): recomputed by hand, head by head
    k = plain.Wk.T @ x[0].T
    d_k = D // H
    bias = posenc.alibi_bias(H, 5)  # (h, T, S), the paper's slopes
    for j in range(H):
        s = q[j * d_k:(j + 1) * d_k].T @ k[j * d_k:(j + 1) * d_k] / np.sqrt(d_k) + bias[j]
        s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(m.attn[0, j], w / w.sum(-1, keepdims=True), rtol=0, atol=TOL)


# ---- bad input: clear errors, state unchanged ---------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"n_kv_heads": 3}, ValueError, "n_kv_heads=3 must divide n_heads=4"),
    ({"n_kv_heads": 0}, ValueError, "n_kv_heads must be >= 1"),
    ({"rope": "adjacent"}, ValueError, "rope must be None or one of ('half', 'interleaved')"),
    ({"window": 0}, ValueError, "window must be >= 1"),
    ({"window": 2.5}, TypeError, "window must be an int"),
    ({"alibi": 1}, TypeError, "alibi must be True or False"),
])
def test_bad_options_are_refused(kwargs, error, words):
    for cls in (numpy_mha.MultiHeadAttention, torch_mha.MultiHeadAttention):
        with pytest.raises(error) as info:
            cls(D, H, **kwargs)
        assert words in str(info.value)


def test_rope_needs_an_even_head_width():
    with pytest.raises(ValueError, match=r"d_k = d_model / n_heads must be even, got d_k=3"):
        numpy_mha.MultiHeadAttention(12, 4, rope="half")


def snapshot(cache) -> tuple:
    return len(cache), cache.K.copy(), cache.V.copy(), cache.positions.copy()


def unchanged(cache, before: tuple) -> None:
    assert len(cache) == before[0]
    for a, b in zip((cache.K, cache.V, cache.positions), before[1:], strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_calls_with_a_cache_raise_and_leave_it_unchanged(rng):
    m = numpy_mha.MultiHeadAttention(D, H, seed=9, n_kv_heads=2, rope="half")
    cache = m.new_cache(2, 6)
    m(rng.normal(size=(2, 3, D)), causal=True, cache=cache)
    before = snapshot(cache)
    x1 = rng.normal(size=(2, 1, D))
    cases = [
        (dict(positions=np.array([[3, 4]])), ValueError, "positions must be (T=1,) or (B=2, T=1)"),
        (dict(positions=np.array([[3.0], [3.0]])), TypeError, "whole numbers"),
        (dict(positions=np.array([[1], [3]])), ValueError,
         "positions must come after the cached ones: sequence 0 holds up to position 2"),
        (dict(mask=np.ones((1, 3), bool)), ValueError, "mask must be (T=1, S=4)"),
        (dict(context=rng.normal(size=(2, 4, D))), ValueError, "a KV cache serves self-attention"),
    ]
    for kw, error, words in cases:
        with pytest.raises(error) as info:
            m(x1, causal=True, cache=cache, **kw)
        assert words in str(info.value), str(info.value)
        unchanged(cache, before)
    with pytest.raises(ValueError, match="holds at most max_len=6 positions; 3 are used"):
        m(rng.normal(size=(2, 4, D)), causal=True, cache=cache)
    unchanged(cache, before)


def test_a_cache_from_another_module_is_refused(rng):
    gqa = numpy_mha.MultiHeadAttention(D, H, n_kv_heads=2)
    mha_ = numpy_mha.MultiHeadAttention(D, H)
    x = rng.normal(size=(1, 2, D))
    with pytest.raises(ValueError, match=r"cache must be built for \(B=1, n_kv_heads=4.*got \(B=1, "
                                         r"n_kv_heads=2"):
        mha_(x, causal=True, cache=gqa.new_cache(1, 4))
    with pytest.raises(TypeError, match="cache must be a KVCache for this module, got TorchKVCache"):
        gqa(x, causal=True, cache=torch_mha.MultiHeadAttention(D, H, n_kv_heads=2).new_cache(1, 4))
    windowed = numpy_mha.MultiHeadAttention(D, H, window=2)
    with pytest.raises(ValueError, match="window=None"):
        windowed(x, causal=True, cache=mha_.new_cache(1, 4))


def test_a_window_larger_than_the_cache_takes_max_len_slots(rng):
    """Mistral's window (4,096) on a short generation: the ring never wraps, so max_len slots do."""
    m = numpy_mha.MultiHeadAttention(D, H, window=8, seed=3)
    cache = m.new_cache(2, 4)
    assert (cache.window, cache.slots, cache.K.shape[2]) == (8, 4, 4)
    assert cache.nbytes == 2 * 2 * H * 4 * (D // H) * 8
    x = rng.normal(size=(2, 4, D))
    outs = [m(x[:, t:t + 1], causal=True, cache=cache) for t in range(4)]
    np.testing.assert_allclose(np.concatenate(outs, 1), m(x, causal=True), rtol=0, atol=TOL)
    with pytest.raises(ValueError, match="holds at most max_len=4 positions; 4 are used"):
        m(x[:, :1], causal=True, cache=cache)
    with pytest.raises(ValueError, match="window=3 is a causal band"):
        numpy_mha.MultiHeadAttention(D, H, window=3)(np.zeros((1, 2, D)))


@pytest.mark.parametrize("n_rep", [0, 2.0, True])
def test_repeat_kv_refuses_a_count_that_is_not_a_positive_int(n_rep):
    for twin, x in ((numpy_attention, np.zeros((1, 2, 3, 4))), (torch_attention, torch.zeros(1, 2, 3, 4))):
        with pytest.raises((TypeError, ValueError), match="n_rep must be"):
            twin.repeat_kv(x, n_rep)


def test_decode_step_is_the_module_forward_with_the_cache(rng):
    m = numpy_mha.MultiHeadAttention(D, H, seed=10)
    x = rng.normal(size=(1, 5, D))
    c1, c2 = KVCache.for_module(m, 1, 5), m.new_cache(1, 5)
    for a, b in chunks(5):
        np.testing.assert_array_equal(decode_step(m, c1, x[:, a:b]),
                                      m(x[:, a:b], causal=True, cache=c2))


# ---- generation: the cache gives the recomputed tokens; the twins agree ------------------------
@pytest.mark.parametrize("opts", [{"n_kv_heads": 2, "rope": "half"},
                                  {"n_kv_heads": 1, "rope": "half", "window": 4}], ids=ids)
def test_greedy_generation_with_the_cache_equals_recomputing(opts):
    model = train.TinyTransformer(vocab=12, T=16, d_model=16, n_heads=4, n_layers=2,
                                  causal=True, seed=0, **opts)
    twin = generate.NumpyTinyTransformer(model)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11, 1, 2]]
    tokens = generate.generate(twin, prompts, 10, cache=True)
    np.testing.assert_array_equal(tokens, generate.generate(twin, prompts, 10, cache=False))
    np.testing.assert_array_equal(generate.generate(model, prompts, 10).numpy(), tokens)
    for i, p in enumerate(prompts):  # and each prompt alone (no padding) gives the same tokens
        np.testing.assert_array_equal(generate.generate(twin, [p], 10)[0], tokens[i])


def test_the_numpy_twin_gives_the_torch_models_logits():
    model = train.TinyTransformer(vocab=12, T=16, d_model=16, n_heads=4, n_layers=2,
                                  causal=True, seed=1, n_kv_heads=2, rope="half")
    twin = generate.NumpyTinyTransformer(model)
    tokens, pos = generate.left_pad([[1, 2, 3], [4, 5, 6, 7, 8]])
    with torch.no_grad():
        want = model(torch.from_numpy(tokens), torch.from_numpy(pos)).double().numpy()
    real = pos >= 0
    # float32 torch against a float64 twin: ~1e-6 relative through two layers and a LayerNorm
    np.testing.assert_allclose(twin(tokens, pos)[real], want[real], rtol=0, atol=1e-5)


def test_cache_bytes_match_the_formula():
    model = train.TinyTransformer(vocab=12, T=16, d_model=16, n_heads=4, n_layers=2,
                                  causal=True, n_kv_heads=2, rope="half")
    assert generate.cache_bytes(model, 3, 40) == generate.cache_bytes_formula(2, 3, 2, 40, 4, 4)
    windowed = train.TinyTransformer(vocab=12, T=16, d_model=16, n_heads=4, n_layers=2,
                                     causal=True, n_kv_heads=2, rope="half", window=5)
    assert generate.cache_bytes(windowed, 3, 40) == generate.cache_bytes_formula(2, 3, 2, 5, 4, 4)


def test_token_ids_outside_the_vocabulary_are_refused():
    model = train.TinyTransformer(vocab=12, T=16, d_model=16, n_heads=4, causal=True)
    twin = generate.NumpyTinyTransformer(model)
    with pytest.raises(ValueError, match=r"ids in 0..11 \(vocab=12\)"):
        twin(np.array([[3, 12]]))
    with pytest.raises(ValueError, match=r"ids in 0..11 \(vocab=12\), got 12"):
        model(torch.tensor([[3, 12]]))


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_torch_rope_from_the_cached_table_equals_the_numpy_rotation(rng, pairing):
    """Decoding's torch path looks rows up in a cached table; the numbers are numpy's (float64)."""
    x = rng.normal(size=(2, 3, 4, 8))  # (B, h, T, d_k)
    for pos in (np.array([0, 1, 2, 3]), np.array([[5, 6, 7, 8], [-1, -1, 0, 1]]), np.array([900, 3, 70, 1])):
        want = posenc.rope(x, pos, pairing=pairing)
        got = posenc.rope(torch.from_numpy(x), torch.from_numpy(pos), pairing=pairing).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    x32 = torch.from_numpy(x).float()
    ref = posenc.rope(x, np.array([0, 1, 2, 3]), pairing=pairing)  # float64 truth
    assert np.abs(posenc.rope(x32, None, pairing=pairing).double().numpy() - ref).max() < 1e-6
