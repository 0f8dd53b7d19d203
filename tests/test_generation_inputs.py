"""Generation at the edges, and the inputs generation and the composed modules must refuse.

1. A window longer than the generation (Mistral's 4,096 on a short answer): the cache takes
   min(window, max_len) slots, and cached decoding writes the recomputed tokens, token for
   token, for windows below, at and above the tokens fed (drawn with hypothesis).
2. Bad input gets a clear error naming what was expected and what arrived, before any state
   changes: module options (numpy, torch, and the GQA subclass), positions, prompts, max_len,
   n_new, the cache-bytes formula, the numpy twin past its learned position table.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha.inference import generate
from mha.inference.kv_cache import KVCache, TorchKVCache
from mha.modules import compose, numpy_mha, torch_mha
from mha.training import train

D, H = 16, 4  # d_model, heads: d_k = 4
TOL = 1e-12  # float64 paths that differ only in summation order (see tests/test_compose.py)


def tiny(window: int | None, seed: int = 0, rope: str | None = "half", T: int = 16):
    """An attention-only TinyTransformer (numpy twin possible) and its float64 numpy twin."""
    model = train.TinyTransformer(vocab=11, T=T, d_model=D, n_heads=H, n_layers=2, causal=True,
                                  seed=seed, n_kv_heads=2, rope=rope, window=window)
    return model, generate.NumpyTinyTransformer(model)


def host(a):
    """A numpy array or tensor as a numpy array."""
    return a.detach().numpy() if isinstance(a, torch.Tensor) else a


def draw_prompts(data, B: int, vocab: int = 11) -> list[list[int]]:
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=B, max_size=B), label="lengths")
    return [data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n)) for n in lengths]


# ---- 1. a window longer than what is generated ---------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_window_around_the_generation_length_gives_the_recomputed_tokens(data):
    """window - (T + n_new) drawn in -3..+3: the rolling cache below, at and above its size."""
    B = data.draw(st.integers(1, 3), label="B")
    prompts = draw_prompts(data, B)
    T = max(len(p) for p in prompts)
    n_new = data.draw(st.integers(1, 6), label="n_new")
    window = max(1, T + n_new + data.draw(st.integers(-3, 3), label="window - (T + n_new)"))
    model, twin = tiny(window, seed=data.draw(st.integers(0, 3), label="seed"))
    cached = generate.generate(twin, prompts, n_new, cache=True)
    np.testing.assert_array_equal(cached, generate.generate(twin, prompts, n_new, cache=False))
    np.testing.assert_array_equal(generate.generate(model, prompts, n_new, cache=True).numpy(),
                                  cached)
    # the old default size, T + n_new, and any larger one, give the same tokens
    extra = data.draw(st.integers(0, 5), label="extra slots")
    np.testing.assert_array_equal(
        generate.generate(twin, prompts, n_new, max_len=T + n_new + extra), cached)


@settings(max_examples=30, deadline=None)
@given(window=st.integers(1, 12), max_len=st.integers(1, 12), seed=st.integers(0, 5),
       cuts=st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_a_rolling_cache_of_min_window_max_len_slots_equals_the_dense_band(window, max_len, seed,
                                                                            cuts):
    """Any window against any max_len: the cache's outputs are the full forward's band mask."""
    sizes = []
    for c in cuts:  # chunks that fill at most max_len positions
        if sum(sizes) + c <= max_len:
            sizes.append(c)
    if not sizes:
        sizes = [max_len]
    m = numpy_mha.MultiHeadAttention(D, H, seed=seed, n_kv_heads=2, rope="half", window=window)
    x = np.random.default_rng(seed).normal(size=(2, sum(sizes), D))
    for cache in (m.new_cache(2, max_len),):
        assert cache.K.shape == (2, 2, min(window, max_len), D // H)
        bounds = np.cumsum([0, *sizes])
        outs = [m(x[:, a:b], causal=True, cache=cache) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        np.testing.assert_allclose(np.concatenate(outs, 1), m(x, causal=True), rtol=0, atol=TOL)
    tm = torch_mha.MultiHeadAttention.from_numpy(m)
    tcache = tm.new_cache(2, max_len)
    assert tuple(tcache.K.shape) == (2, 2, min(window, max_len), D // H)


def test_cache_bytes_count_min_window_max_len_slots():
    model, _ = tiny(window=4096)
    assert generate.cache_bytes(model, 3, 40) == generate.cache_bytes_formula(2, 3, 2, 40, 4, 4)
    assert KVCache(1, 2, 5, 4, window=4096).nbytes == 2 * 2 * 5 * 4 * 8
    assert TorchKVCache(1, 2, 5, 4, window=4096).nbytes == 2 * 2 * 5 * 4 * 4


def test_generate_feeds_each_new_token_but_the_last():
    """The last token is returned, not fed back: the caches need T + n_new - 1 positions."""
    _, twin = tiny(window=None)
    calls = []

    class Counting:
        vocab, pos = twin.vocab, None

        def __call__(self, tokens, positions=None, caches=None):
            calls.append(tokens.shape[1])
            return twin(tokens, positions, caches)

        def new_caches(self, B, max_len):
            calls.append(("max_len", max_len))
            return twin.new_caches(B, max_len)

    out = generate.generate(Counting(), [[1, 2, 3], [4]], 4)
    assert out.shape == (2, 4)
    assert calls == [("max_len", 6), 3, 1, 1, 1]
    np.testing.assert_array_equal(out, generate.generate(twin, [[1, 2, 3], [4]], 4, max_len=6))


# ---- 2. module options ---------------------------------------------------------------------------
MODULES = {
    "numpy": lambda **kw: numpy_mha.MultiHeadAttention(D, H, **kw),
    "torch": lambda **kw: torch_mha.MultiHeadAttention(D, H, **kw),
    "numpy-gqa": lambda **kw: numpy_mha.MultiHeadAttention(D, H, n_kv_heads=2, **kw),
    "torch-gqa": lambda **kw: torch_mha.MultiHeadAttention(D, H, n_kv_heads=2, **kw),
}

BAD_OPTIONS = [
    ({"rope": "half", "rope_base": 0}, ValueError, "rope_base must be a finite number > 1"),
    ({"rope": "half", "rope_base": 0.0}, ValueError, "got 0.0"),
    ({"rope": "half", "rope_base": math.nan}, ValueError, "got nan"),
    ({"rope": "half", "rope_base": -10000.0}, ValueError, "got -10000.0"),
    ({"rope": "half", "rope_base": math.inf}, ValueError, "got inf"),
    ({"rope": "half", "rope_base": 1}, ValueError, "rope_base must be a finite number > 1"),
    ({"rope": "half", "rope_base": "10000"}, TypeError, "rope_base must be a real number > 1"),
    ({"rope": "half", "rope_base": None}, TypeError, "got NoneType None"),
    ({"rope": "half", "rope_base": True}, TypeError, "got bool True"),
    ({"rope_base": math.nan}, ValueError, "got nan"),  # checked even without rope
    ({"rope": True}, TypeError, "rope must be None or one of ('half', 'interleaved'), got bool"),
    ({"rope": 1}, TypeError, "got int 1"),
    ({"rope": "HALF"}, ValueError, "got 'HALF'"),
    ({"alibi": "yes"}, TypeError, "alibi must be True or False, got str 'yes'"),
    ({"alibi": 1}, TypeError, "alibi must be True or False"),
    ({"window": True}, TypeError, "window must be an int, got bool"),
    ({"window": -2}, ValueError, "window must be >= 1, got -2"),
    ({"window": math.nan}, TypeError, "window must be an int, got float nan"),
    ({"n_kv_heads": 2.0}, TypeError, "n_kv_heads must be an int, got float"),
    ({"n_kv_heads": -1}, ValueError, "n_kv_heads must be >= 1, got -1"),
    ({"seed": -1}, ValueError, "seed must be >= 0, got -1"),
    ({"seed": 1.5}, TypeError, "seed must be an int, got float 1.5"),
    ({"seed": True}, TypeError, "seed must be an int, got bool"),
]


@pytest.mark.parametrize(("module", "kwargs", "error", "words"), [
    pytest.param(module, kw, error, words, id=module + ":" + ",".join(f"{k}={v!r}" for k, v in kw.items()))
    for module in MODULES for kw, error, words in BAD_OPTIONS
    if not (module.endswith("gqa") and "n_kv_heads" in kw)  # the GQA classes take it positionally
])
def test_bad_module_options_are_refused_when_the_module_is_built(module, kwargs, error, words):
    state = torch.random.get_rng_state()
    with pytest.raises(error) as info:
        MODULES[module](**kwargs)
    assert words in str(info.value), str(info.value)
    assert torch.equal(torch.random.get_rng_state(), state), "a refused build drew from torch's RNG"


@pytest.mark.parametrize(("args", "kwargs", "error", "words"), [
    ((True, 4), {}, TypeError, "d_model must be an int, got bool"),
    ((16.0, 4), {}, TypeError, "d_model must be an int, got float"),
    ((math.nan, 4), {}, TypeError, "d_model must be an int, got float nan"),
    ((0, 4), {}, ValueError, "d_model must be >= 1, got 0"),
    ((16, -4), {}, ValueError, "n_heads must be >= 1, got -4"),
    ((16, 3), {}, ValueError, "must be divisible by n_heads=3"),
])
def test_bad_sizes_are_refused_by_both_modules(args, kwargs, error, words):
    for cls in (numpy_mha.MultiHeadAttention, torch_mha.MultiHeadAttention):
        with pytest.raises(error) as info:
            cls(*args, **kwargs)
        assert words in str(info.value)


@pytest.mark.parametrize("dtype", ["foo", np.int32, int, bool, "U3"])
def test_the_numpy_module_refuses_a_dtype_that_is_not_floating_point(dtype):
    with pytest.raises(TypeError, match="dtype must be a floating-point type, got "):
        numpy_mha.MultiHeadAttention(D, H, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, np.float32, "float32"])
def test_the_torch_module_refuses_a_dtype_that_is_not_a_floating_torch_dtype(dtype):
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        torch_mha.MultiHeadAttention(D, H, dtype=dtype)


@pytest.mark.parametrize("name", ["fused_qkv", "use_sdpa", "use_enable_gqa"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_the_torch_module_switches_must_be_bools(name, value):
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        torch_mha.MultiHeadAttention(D, H, **{name: value})


def test_a_valid_rope_base_still_builds_and_numpy_scalars_are_fine():
    for base in (10000, 500000.0, np.float32(1.5), np.int64(10000)):
        m = numpy_mha.MultiHeadAttention(D, H, rope="half", rope_base=base)
        assert m.options.rope_base == float(base)
    assert numpy_mha.MultiHeadAttention(D, H, alibi=np.True_).options.alibi is True


# ---- 2. positions --------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("pos", [[3, 4, 5], (0, 2, 7), [[0, 1, 2], [-1, 0, 1]], [np.int64(1), 2, 3]],
                         ids=["list", "tuple", "rows", "numpy-ints"])
def test_positions_as_a_list_give_the_arrays_answer(impl, pos):
    m = numpy_mha.MultiHeadAttention(D, H, seed=1, n_kv_heads=2, rope="interleaved", alibi=True)
    x = np.random.default_rng(1).normal(size=(2, 3, D))
    if impl == "torch":
        m, x = torch_mha.MultiHeadAttention.from_numpy(m), torch.from_numpy(x)
    want = m(x, causal=True, positions=np.array(pos, dtype=np.int64))
    got = m(x, causal=True, positions=pos)
    assert type(got) is type(want)
    np.testing.assert_array_equal(host(got), host(want))


@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize(("pos", "error", "words"), [
    ([0.0, 1.0, 2.0], TypeError, "positions must be whole numbers, one per token, got a list holding "
                                 "float 0.0"),
    ([0, 1, True], TypeError, "holding bool True"),
    (["0", "1", "2"], TypeError, "holding str '0'"),
    ([], TypeError, "holding nothing"),
    ([[0, 1, 2], [0, 1]], ValueError, "rows of one length"),
    ([[0, 1, 2]] * 3, ValueError, "positions must be (T=3,) or (B=2, T=3)"),  # B mismatch
    ([0, 1], ValueError, "positions must be (T=3,) or (B=2, T=3)"),
    ("012", TypeError, "positions must be an int array (T,) or (B, T), or a list of ints, got str"),
    (3, TypeError, "got int 3"),
])
def test_bad_positions_are_refused_and_leave_the_cache_unchanged(impl, pos, error, words):
    assert_refused_with_cache_unchanged(impl, dict(seed=2), dict(causal=True, positions=pos),
                                        error, words)


def assert_refused_with_cache_unchanged(impl: str, options: dict, call: dict, error: type,
                                        words: str) -> None:
    """A module holding one cached token refuses m(x, **call) with `words`; its cache is untouched."""
    m = numpy_mha.MultiHeadAttention(D, H, rope="half", **options)
    x = np.random.default_rng(options["seed"]).normal(size=(2, 3, D))
    if impl == "torch":
        m, x = torch_mha.MultiHeadAttention.from_numpy(m), torch.from_numpy(x)
    cache = m.new_cache(2, 8)
    m(x[:, :1], causal=True, cache=cache)
    before = (len(cache), host(cache.K).copy(), host(cache.positions).copy())
    with pytest.raises(error) as info:
        m(x, cache=cache, **call)
    assert words in str(info.value), str(info.value)
    assert len(cache) == before[0]
    np.testing.assert_array_equal(host(cache.K), before[1])
    np.testing.assert_array_equal(host(cache.positions), before[2])


@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize(("window", "causal", "error", "words"), [
    (None, np.ones((3, 3), dtype=bool), TypeError, "causal must be True or False, got ndarray"),
    (None, 1, TypeError, "causal must be True or False, got int 1"),
    (None, "yes", TypeError, "causal must be True or False, got str 'yes'"),
    (2, False, ValueError, "window=2 is a causal band"),
], ids=["a-mask", "int", "str", "window-not-causal"])
def test_a_bad_causal_is_refused_before_the_cache_changes(impl, window, causal, error, words):
    assert_refused_with_cache_unchanged(impl, dict(seed=3, window=window), dict(causal=causal),
                                        error, words)


# ---- 2. generate(): prompts, n_new, max_len, cache -----------------------------------------------
@pytest.fixture(scope="module")
def twin():
    return tiny(window=None)[1]


@pytest.mark.parametrize(("prompts", "error", "words"), [
    ("hello", TypeError, "prompts must be a list of token-id lists (ints), got str 'hello'"),
    (["hello", "world"], TypeError, "prompt 0 must be a list of token ids (ints), got text 'hello'"),
    ([[1.0, 2.0, 3.0]], TypeError, "prompt 0 must hold token ids (ints), got float 1.0 (a float id "
                                   "would be truncated)"),
    ([[1, 2], [3, 4.7]], TypeError, "prompt 1 must hold token ids (ints), got float 4.7"),
    ([[1, True]], TypeError, "got bool True"),
    ([1, 2, 3], TypeError, "got a flat list of ids (prompt 0 is the int 1): wrap one prompt"),
    ([np.array([1.0, 2.0])], TypeError, "prompt 0 must be a 1-D array of int token ids, got dtype "
                                        "float64"),
    ([[1, 2], []], ValueError, "prompt 1 is empty"),
    ([], ValueError, "got no prompt"),
    ([[1, 11]], ValueError, "prompt 0 must hold ids in 0..10 (vocab=11), got 11"),
    ([[-1, 2]], ValueError, "got -1"),
    (None, TypeError, "got NoneType None"),
    (7, TypeError, "got int 7"),
])
def test_bad_prompts_are_refused_with_what_arrived(twin, prompts, error, words):
    with pytest.raises(error) as info:
        generate.generate(twin, prompts, 2)
    assert words in str(info.value), str(info.value)


def test_prompts_as_int_arrays_or_tensors_give_the_lists_tokens(twin):
    want = generate.generate(twin, [[1, 2, 3], [4, 5]], 3)
    for prompts in ([np.array([1, 2, 3]), np.array([4, 5], dtype=np.int32)],
                    [torch.tensor([1, 2, 3]), torch.tensor([4, 5])], ((1, 2, 3), (4, 5))):
        np.testing.assert_array_equal(generate.generate(twin, prompts, 3), want)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"max_len": 0}, ValueError, "max_len must be >= 1, got 0"),
    ({"max_len": 4}, ValueError, "max_len must hold the padded prompts and the new tokens fed back, "
                                 "T + n_new - 1 = 3 + 3 - 1 = 5, got max_len=4"),
    ({"max_len": -5}, ValueError, "max_len must be >= 1, got -5"),
    ({"max_len": 8.0}, TypeError, "max_len must be an int, got float 8.0"),
    ({"max_len": True}, TypeError, "max_len must be an int, got bool"),
    ({"n_new": -1}, ValueError, "n_new must be >= 1, got -1"),
    ({"n_new": 0}, ValueError, "n_new must be >= 1, got 0"),
    ({"n_new": 2.5}, TypeError, "n_new must be an int, got float 2.5"),
    ({"n_new": True}, TypeError, "n_new must be an int, got bool"),
    ({"n_new": "3"}, TypeError, "n_new must be an int, got str"),
    ({"cache": "no"}, TypeError, "cache must be True or False, got str 'no'"),
    ({"cache": None}, TypeError, "cache must be True or False, got NoneType"),
])
def test_bad_generation_sizes_are_refused(twin, kwargs, error, words):
    args = {"n_new": 3, **kwargs}
    with pytest.raises(error) as info:
        generate.generate(twin, [[1, 2, 3], [4]], **args)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("which", ["numpy", "torch"])
def test_running_past_the_learned_position_table_says_why(which):
    """Both twins name the table, numpy as torch does, directly and through generate."""
    model, twin = tiny(window=None, rope=None, T=8)
    m = twin if which == "numpy" else model
    tokens = np.array([[1, 2, 3]])
    pos = np.array([[6, 7, 8]])
    with pytest.raises(ValueError, match=r"tokens must have positions < 8 \(the learned position "
                                         r"table\), got position 8; a model with rope= runs"):
        m(torch.from_numpy(tokens) if which == "torch" else tokens,
          torch.from_numpy(pos) if which == "torch" else pos)
    with pytest.raises(ValueError, match=r"positions < 8 \(the learned position table\): prompts "
                                         r"of 5 columns and n_new=5 reach position 8"):
        generate.generate(m, [[1, 2, 3, 4, 5]], 5)
    assert generate.generate(m, [[1, 2, 3, 4, 5]], 4).shape == (1, 4)  # positions 0..7: fits


def test_the_numpy_twin_refuses_a_wrong_number_of_caches_and_a_model_it_cannot_read(twin):
    with pytest.raises(ValueError, match=r"caches must hold one cache per layer \(2\), got 1"):
        twin(np.array([[1, 2]]), None, twin.new_caches(1, 4)[:1])
    with pytest.raises(TypeError, match="model must be an mha.training.train.TinyTransformer, got "
                                        "MultiHeadAttention"):
        generate.NumpyTinyTransformer(numpy_mha.MultiHeadAttention(D, H))
    model, _ = tiny(window=None)
    with pytest.raises(TypeError, match="dtype must be a floating-point type, got "):
        generate.NumpyTinyTransformer(model, dtype=np.int64)


# ---- 2. the cache-bytes formula, token_seconds ----------------------------------------------------
SIZES = ("n_layers", "B", "n_kv_heads", "slots", "d_k", "itemsize")


@pytest.mark.parametrize("name", SIZES)
@pytest.mark.parametrize(("value", "error", "words"), [
    (-2, ValueError, "must be >= 1, got -2"), (0, ValueError, "must be >= 1, got 0"),
    (2.0, TypeError, "must be an int, got float"), (True, TypeError, "must be an int, got bool"),
    (None, TypeError, "must be an int, got NoneType"),
])
def test_cache_bytes_formula_refuses_sizes_that_are_not_positive_ints(name, value, error, words):
    sizes = dict(n_layers=2, B=3, n_kv_heads=2, slots=40, d_k=4, itemsize=4)
    assert generate.cache_bytes_formula(**sizes) == 2 * 2 * 3 * 2 * 40 * 4 * 4
    with pytest.raises(error) as info:
        generate.cache_bytes_formula(**{**sizes, name: value})
    assert f"{name} {words}" in str(info.value), str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"repeats": 0}, ValueError, "repeats must be >= 1"),
    ({"B": True}, TypeError, "B must be an int, got bool"),
    ({"cache": "yes"}, TypeError, "cache must be True or False"),
    ({"context": -3}, ValueError, "context must be >= 1"),
])
def test_token_seconds_refuses_bad_sizes(twin, kwargs, error, words):
    args = {"context": 4, "cache": True, **kwargs}
    with pytest.raises(error, match=words.replace("(", r"\(")):
        generate.token_seconds(twin, **args)


def test_compose_positions_helper_is_what_the_modules_use():
    np.testing.assert_array_equal(compose.as_positions([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]]))
    assert compose.as_positions([1, 2]).dtype == np.int64
