"""mha.attention.numpy_attention: every numpy backend equals an independent float64 reference on drawn cases.

The reference here is written from the definition (positions -> allowed pairs, np.repeat for the
shared heads, a softmax over the allowed keys), not from MaskSpec.dense or repeat_kv, so a bug in
a lowering cannot hide in the reference too. Tolerances are derived from the score magnitudes.
"""

import dataclasses
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha.attention import flash, numpy_attention
from mha.attention.backends import Backend
from mha.attention.masking import MaskSpec
from mha.attention.numpy_attention import BACKENDS, attention, call_needs
from mha.modules import compose
from mha.modules.numpy_mha import MultiHeadAttention


# ---- the independent reference --------------------------------------------------------------
def allowed_pairs(q_pos, k_pos, causal, window, q_doc=None, k_doc=None, user=None):
    """(B, h|1, T, S) bool from (B, T) / (B, S) positions and ids, by the definitions."""
    q, k = q_pos[:, :, None], k_pos[:, None, :]  # (B, T, 1), (B, 1, S)
    ok = np.broadcast_to(k >= 0, (q_pos.shape[0], q_pos.shape[1], k_pos.shape[1])).copy()  # (B, T, S)
    if causal:
        ok &= k <= q
    if window is not None:
        ok &= q - k < window
    if q_doc is not None:
        ok &= (q_doc[:, :, None] == k_doc[:, None, :]) & (q_doc[:, :, None] >= 0)
    ok = ok[:, None]  # (B, 1, T, S)
    return ok if user is None else ok & user


def expected(q, k, v, ok, bias):
    """softmax over the allowed keys of q k^T / sqrt(d_k) + bias, times v; rows with none give 0."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # query head i reads kv head i // g
    s = np.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.shape[-1])  # (B, h, T, S)
    if bias is not None:
        s = s + bias
    s = np.where(ok, s, -np.inf)
    top = s.max(-1, keepdims=True)  # (B, h, T, 1)
    e = np.where(ok, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    den = e.sum(-1, keepdims=True)
    w = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    return np.einsum("bhts,bhsd->bhtd", w, v)  # (B, h, T, d_k)


def tolerance(q, k, v, bias):
    """Float64 error bound: a score is d_k products (+ the bias); S terms in each weighted sum."""
    eps, d_k, S = np.finfo(np.float64).eps, q.shape[-1], k.shape[2]
    dot = float(np.abs(q).max() * np.abs(k).max()) * math.sqrt(d_k)  # |q . k| / sqrt(d_k) at most
    b = 0.0 if bias is None else float(np.abs(bias).max())
    return 8 * eps * (d_k * dot + b + S + 4) * float(np.abs(v).max(initial=1.0))


@st.composite
def cases(draw):
    """q, k, v, a MaskSpec over left-padded positions (causal, window, documents, user) and a bias."""
    B, h_kv, g = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    T, S, d = draw(st.integers(1, 10)), draw(st.integers(1, 14)), draw(st.integers(1, 5))
    causal = draw(st.booleans())
    window = draw(st.one_of(st.none(), st.integers(1, 6))) if causal else None
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    pads = rng.integers(0, S, size=B) if draw(st.booleans()) else np.zeros(B, dtype=int)
    k_pos = np.arange(S)[None, :] - pads[:, None]  # (B, S): left padding at -1..
    k_pos = np.where(k_pos >= 0, k_pos, -1)
    shift = draw(st.integers(0, 2))
    q_pos = np.maximum(S - pads[:, None] - T + np.arange(T)[None, :] + shift, 0)  # (B, T)
    q_doc = k_doc = user = None
    if draw(st.booleans()):  # packed documents: sorted ids, the queries' a suffix of the keys'
        k_doc = np.sort(rng.integers(0, 3, size=(B, S)), axis=1)
        q_doc = np.sort(rng.integers(0, 3, size=(B, T)), axis=1)
    h = h_kv * g
    if draw(st.booleans()):
        user = rng.random((B, draw(st.sampled_from([1, h])), T, S)) < 0.8
    bias_kind = draw(st.sampled_from([None, "alibi", "random"]))
    q, k, v = rng.normal(size=(B, h, T, d)), rng.normal(size=(B, h_kv, S, d)), rng.normal(size=(B, h_kv, S, d))
    bias = None
    if bias_kind == "alibi":
        slopes = 2.0 ** -np.arange(1, h + 1)  # (h,)
        bias = -slopes[None, :, None, None] * np.abs(q_pos[:, None, :, None] - k_pos[:, None, None, :])
    elif bias_kind == "random":
        bias = rng.normal(size=(1, h, T, S))
    spec = MaskSpec(q_pos, k_pos, causal=causal, window=window, q_doc=q_doc, k_doc=k_doc, user=user)
    ok = allowed_pairs(q_pos, k_pos, causal, window, q_doc, k_doc, user)
    blocks = dict(block_q=draw(st.integers(1, 8)), block_k=draw(st.integers(1, 8)))
    return q, k, v, spec, ok, bias, blocks, draw(st.integers(1, 5))


def run_all(q, k, v, spec, bias, blocks, n_splits):
    """{backend: out} for every numpy backend on one call."""
    options = {"reference": {}, "flash": blocks, "split_kv": {"n_splits": n_splits}}
    assert set(options) == set(BACKENDS.names()), "a new backend must join this test"
    return {name: attention(q, k, v, spec, bias, backend=name, **options[name])[0] for name in options}


@settings(max_examples=120, deadline=None)
@given(case=cases())
@pytest.mark.filterwarnings("error")  # no -inf - -inf, no log(0) warnings in any backend
def test_every_backend_equals_the_reference_on_drawn_cases(case):
    q, k, v, spec, ok, bias, blocks, n_splits = case
    want, tol = expected(q, k, v, ok, bias), tolerance(q, k, v, bias)
    for name, out in run_all(q, k, v, spec, bias, blocks, n_splits).items():
        assert out.shape == want.shape and out.dtype == q.dtype, name
        err = float(np.abs(out - want).max(initial=0.0))
        assert err <= tol, f"{name}: {err:.3g} > {tol:.3g} on {spec!r}"


def test_a_boolean_array_mask_is_lowered_by_every_backend(rng):
    q, k, v = rng.normal(size=(2, 4, 5, 3)), rng.normal(size=(2, 2, 7, 3)), rng.normal(size=(2, 2, 7, 3))
    mask = rng.random((2, 1, 5, 7)) < 0.6  # (B, 1, T, S)
    want = expected(q, k, v, mask, None)
    for name, out in run_all(q, k, v, mask, None, dict(block_q=2, block_k=3), 3).items():
        assert float(np.abs(out - want).max()) <= tolerance(q, k, v, None), name


def _flash_running(mp, run):
    """Register, for one test, a "flash" backend whose kernel is `run` (a planted mistake)."""
    mp.setitem(BACKENDS._backends, "flash", dataclasses.replace(BACKENDS.get("flash"), run=run))


def _gqa_by_modulo(q, k, v, m, b, **o):
    """Planted: query head i reads kv head i % h_kv (np.tile) instead of i // g."""
    g = q.shape[1] // k.shape[1]
    return flash.flash_attention(q, np.tile(k, (1, g, 1, 1)), np.tile(v, (1, g, 1, 1)), mask=m, bias=b,
                                 **o)[0], None


@pytest.mark.parametrize("plant, where", [
    ("no bias in the tiles", lambda mp: mp.setattr(flash, "_bias_tiles", lambda *a: None)),
    ("query head i reads kv head i % h_kv", lambda mp: _flash_running(mp, _gqa_by_modulo)),
    ("a spec lowered without its window", lambda mp: _flash_running(
        mp, lambda q, k, v, m, b, **o: (flash.flash_attention(q, k, v, mask=m.with_(window=None), bias=b,
                                                               **o)[0], None))),
])
def test_the_equality_check_catches_planted_flash_bugs(plant, where, monkeypatch):
    """Each planted mistake makes the drawn-case check fail on a case that exercises it."""
    rng = np.random.default_rng(3)
    B, h, h_kv, T, S, d = 1, 4, 2, 6, 9, 3
    q, k, v = rng.normal(size=(B, h, T, d)), rng.normal(size=(B, h_kv, S, d)), rng.normal(size=(B, h_kv, S, d))
    spec = MaskSpec.plain(T, S, causal=True, aligned="bottom_right", window=3)
    bias = rng.normal(size=(1, h, T, S))
    want = expected(q, k, v, allowed_pairs(spec.q_pos[None], spec.k_pos[None], True, 3), bias)
    assert np.abs(attention(q, k, v, spec, bias, backend="flash")[0] - want).max() <= 1e-12
    where(monkeypatch)
    assert np.abs(attention(q, k, v, spec, bias, backend="flash")[0] - want).max() > 1e-3, plant


# ---- tiles outside the band are never computed -----------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 40), extra=st.integers(0, 30), window=st.one_of(st.none(), st.integers(1, 12)),
       bq=st.integers(1, 9), bk=st.integers(1, 9), pad=st.integers(0, 5))
def test_flash_computes_exactly_the_tiles_with_an_allowed_pair(T, extra, window, bq, bk, pad):
    """Counted through flash's `stats`: a tile is computed iff some query of it may see some key."""
    S = T + extra
    pad = min(pad, S - 1)
    k_pos = np.where(np.arange(S) >= pad, np.arange(S) - pad, -1)[None]  # (1, S): left padding
    q_pos = (S - pad - T + np.arange(T))[None]  # (1, T): the last T positions, as after a cache
    spec = MaskSpec(q_pos, k_pos, causal=True, window=window)
    ok = allowed_pairs(q_pos, k_pos, True, window)[0, 0]  # (T, S)
    rng = np.random.default_rng(T * 100 + S)
    q, k, v = rng.normal(size=(1, 2, T, 4)), rng.normal(size=(1, 1, S, 4)), rng.normal(size=(1, 1, S, 4))
    stats = {"tiles": []}
    flash.flash_attention(q, k, v, mask=spec, block_q=bq, block_k=bk, stats=stats)
    nq, nk = -(-T // bq), -(-S // bk)
    needed = {(0, i, j) for i in range(nq) for j in range(nk)
              if ok[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk].any()}
    assert set(stats["tiles"]) == needed, "computed tiles != tiles with an allowed pair"
    assert stats.get("computed", 0) == len(needed) and stats.get("skipped", 0) == nq * nk - len(needed)


def test_the_tile_count_catches_a_schedule_that_skips_nothing(monkeypatch):
    spec = MaskSpec.plain(32, 32, causal=True, window=4)
    q = np.random.default_rng(0).normal(size=(1, 1, 32, 4))
    stats = {"tiles": []}
    flash.flash_attention(q, q, q, mask=spec, block_q=4, block_k=4, stats=stats)
    assert stats["skipped"] == 64 - 8 - 7  # the band: 8 diagonal tiles and 7 just left of them
    monkeypatch.setattr(MaskSpec, "tile_kinds", lambda self, bq, bk: np.ones((1, 8, 8), np.int8))
    stats = {"tiles": []}
    flash.flash_attention(q, q, q, mask=spec, block_q=4, block_k=4, stats=stats)
    assert stats["computed"] == 64, "every tile computed: the count above must notice"


def test_split_kv_never_reads_a_chunk_left_of_the_window():
    S, window = 64, 8
    spec = MaskSpec(np.array([S - 1]), np.arange(S), causal=True, window=window)  # one decoding query
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(1, 4, 1, 8)), rng.normal(size=(1, 2, S, 8)), rng.normal(size=(1, 2, S, 8))
    k[:, :, :S - window], v[:, :, :S - window] = np.nan, np.nan  # outside the band: must not be read
    stats = {}
    out, _ = flash.split_kv_attention(q, k, v, mask=spec, n_splits=8, stats=stats)
    assert stats == {"chunks": 1, "skipped": 7} and np.isfinite(out).all()


# ---- the module on every backend -------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(h_kv=st.sampled_from([1, 2, 4]), alibi=st.booleans(), window=st.one_of(st.none(), st.integers(1, 6)),
       rope=st.sampled_from([None, "half"]), B=st.integers(1, 2), T=st.integers(1, 9),
       steps=st.integers(1, 4), padded=st.booleans(), backend=st.sampled_from(["flash", "split_kv"]),
       seed=st.integers(0, 2**16))
def test_the_module_on_a_backend_equals_reference_with_cached_decoding(h_kv, alibi, window, rope, B, T,
                                                                     steps, padded, backend, seed):
    """Prefill then one-token decode steps with a cache, GQA, ALiBi, a window, RoPE, left padding."""
    opts = dict(n_kv_heads=h_kv, alibi=alibi, window=window, rope=rope)
    ref, other = (MultiHeadAttention(16, 4, seed=seed % 7, **opts, backend=b) for b in ("reference", backend))
    caches = [m.new_cache(B, T + steps) for m in (ref, other)]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=B) if padded else np.full(B, T)
    pos = compose.padded_positions(lengths, T)  # (B, T): -1 on the left pads
    x = rng.normal(size=(B, T, 16))
    outs = [m(x, causal=True, positions=pos, cache=c) for m, c in zip((ref, other), caches, strict=True)]
    assert other.attn is None and ref.attn is not None  # only the reference forms the weights
    for _ in range(steps):
        x = rng.normal(size=(B, 1, 16))
        outs += [m(x, causal=True, cache=c) for m, c in zip((ref, other), caches, strict=True)]
    for i in range(0, len(outs), 2):
        np.testing.assert_allclose(outs[i + 1], outs[i], rtol=0, atol=1e-10, err_msg=f"call {i // 2}")


def test_a_flash_module_decodes_by_split_kv_and_a_call_can_pick_its_backend(rng):
    m = MultiHeadAttention(16, 4, n_kv_heads=2, alibi=True, window=5, backend="flash")
    ref = MultiHeadAttention(16, 4, n_kv_heads=2, alibi=True, window=5)
    c, c_ref = m.new_cache(1, 12), ref.new_cache(1, 12)
    x = rng.normal(size=(1, 6, 16))
    with mock.patch.object(flash, "split_kv_attention", wraps=flash.split_kv_attention) as split:
        np.testing.assert_allclose(m(x, causal=True, cache=c), ref(x, causal=True, cache=c_ref), atol=1e-12)
        assert split.call_count == 0  # a prefill of 6 queries is tiled
        x1 = rng.normal(size=(1, 1, 16))
        np.testing.assert_allclose(m(x1, causal=True, cache=c), ref(x1, causal=True, cache=c_ref), atol=1e-12)
        assert split.call_count == 1  # one query after a cache: flash decoding
    y = rng.normal(size=(2, 7, 16))
    want = ref(y, causal=True)
    np.testing.assert_allclose(ref(y, causal=True, backend="flash"), want, atol=1e-12)
    assert ref.attn is None and ref.backend == "reference"  # the call's backend, not the module's


# ---- refusals ----------------------------------------------------------------------------------------
@pytest.fixture
def no_bias_backend(monkeypatch):
    """A numpy backend declaring no bias and no GQA, registered for one test only."""
    lame = Backend("lame", "numpy", lambda q, k, v, m, b: numpy_attention.reference_attention(q, k, v, m, b),
                   supports=frozenset({"mask", "window"}), note="test only")
    monkeypatch.setitem(BACKENDS._backends, "lame", lame)
    return "lame"


def test_refusals_name_the_lacking_feature_and_who_can_serve(rng, no_bias_backend):
    with pytest.raises(ValueError, match=r"'lame' cannot serve .*lacks an additive bias \(ALiBi\) "
                                         r"\(backends that can: reference, flash, split_kv\)"):
        MultiHeadAttention(16, 4, alibi=True, backend="lame")
    with pytest.raises(ValueError, match=r"lacks grouped-query heads"):
        MultiHeadAttention(16, 4, n_kv_heads=2, backend="lame")
    with pytest.raises(ValueError, match=r"backend must be one of \('reference', 'flash', 'split_kv', 'lame'\)"):
        MultiHeadAttention(16, 4, backend="sdpa")
    with pytest.raises(ValueError, match=r"'flash' cannot serve this call: it lacks the attention "
                                         r"weights returned \(backends that can: reference\)"):
        BACKENDS.check("flash", call_needs(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)), weights=True))


def test_a_refused_call_leaves_the_cache_as_it_was(rng, no_bias_backend):
    m = MultiHeadAttention(16, 4, alibi=True)
    cache = m.new_cache(1, 8)
    m(rng.normal(size=(1, 3, 16)), causal=True, cache=cache)
    before = (len(cache), cache.K.copy())
    with pytest.raises(ValueError, match="lacks an additive bias"):
        m(rng.normal(size=(1, 1, 16)), causal=True, cache=cache, backend="lame")
    assert len(cache) == before[0] and np.array_equal(cache.K, before[1], equal_nan=True)


def test_call_needs_reads_the_inputs():
    q, k = np.zeros((1, 4, 3, 2)), np.zeros((1, 2, 5, 2))
    spec = MaskSpec.plain(3, 5, causal=True, window=2)
    assert call_needs(q, q).needs == frozenset() and call_needs(q, q).dtype == "float64"
    assert call_needs(q, k, spec, np.zeros((1, 4, 3, 5))).needs == {"gqa", "window", "bias"}
    assert call_needs(q, q[..., :5, :], np.ones((3, 5), bool)).needs == {"mask"}
    assert call_needs(q.astype(np.float16), q.astype(np.float16)).dtype == "float16"


def test_bad_inputs_are_refused_before_any_backend_runs():
    q = np.zeros((1, 4, 3, 2))
    with pytest.raises(ValueError, match=r"divides q's h=4 .*got h_kv=3"):
        attention(q, np.zeros((1, 3, 5, 2)), np.zeros((1, 3, 5, 2)), backend="flash")
    with pytest.raises(TypeError, match="q must be a numpy array, got list"):
        attention([[0.0]], q, q)


@pytest.mark.parametrize("window", [None, 3])
def test_generation_on_the_flash_backend_writes_the_reference_tokens(window):
    """A left-padded batch, GQA, RoPE, a cache: prefill tiled, every decoding step split-KV."""
    from mha.inference import generate
    from mha.training import train

    model = train.TinyTransformer(vocab=12, T=16, d_model=16, n_heads=4, n_layers=2, causal=True,
                                  seed=0, n_kv_heads=2, rope="half", window=window)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11, 1, 2]]
    want = generate.generate(generate.NumpyTinyTransformer(model), prompts, 8)
    twin = generate.NumpyTinyTransformer(model, backend="flash")
    assert {a.backend for a in twin.attention_layers} == {"flash"}
    with mock.patch.object(flash, "split_kv_attention", wraps=flash.split_kv_attention) as split:
        np.testing.assert_array_equal(generate.generate(twin, prompts, 8), want)
    assert split.call_count == 2 * 7  # two layers, seven one-token steps after the prefill
