"""The paged KV cache (mha.inference.paged): equal to the dense cache token for token, in numpy and torch.

The reference is the dense cache (`KVCache` / `TorchKVCache`), itself tested against the full
causal forward in tests/test_kv_cache.py. Contracts:
  * generation: greedy decoding through `pool.batch(ids)` gives generate()'s tokens, logits close
    (NumpyTinyTransformer in float64, the torch TinyTransformer in float32 against a float64 golden);
  * the module (numpy and torch; RoPE, GQA, a window, ALiBi, left padding), prefill in drawn
    chunks then decode steps, any block size: outputs equal the dense cache's;
  * ragged batches (rows of different lengths, no padding) equal each row alone;
  * prefix sharing: fork, copy-on-write, reference counts, freeing at the last holder, slot use;
  * the numpy and torch pools agree operation by operation;
  * bad input: a clear error and the pool unchanged (tables, refcounts, free list, K/V bytes);
  * index plans: computed once per model call (all layers share them) and never reused after a
    fork, copy-on-write, free or reserve changes the tables;
  * mutation proofs: broken pools (a fill count off by one, copy-on-write skipped, free ignoring
    reference counts, unused slots not marked EMPTY, plans keyed without the tables or recomputed
    for every layer) are caught by the checks above.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha.inference import generate
from mha.inference.kv_cache import EMPTY
from mha.inference.paged import (
    BlockPool,
    PagedKVCache,
    PoolExhausted,
    TorchBlockPool,
    TorchPagedKVCache,
)
from mha.modules import compose
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import MultiHeadAttention as TorchMHA
from mha.perf.bench import derived_tolerance
from mha.training import train

D, H = 16, 4  # d_model, heads: d_k = 4
EPS64 = float(np.finfo(np.float64).eps)
TWINS = ["numpy", "torch"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def host(a) -> np.ndarray:
    """A numpy array or a tensor (any device) as a numpy array."""
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def order_tol(ref, S: int, dtype=np.float64) -> float:
    """What two float paths that differ only in summation order may differ by: a sum of S terms
    rounds at most S times, each by eps relative to the largest term (4x headroom)."""
    return 4 * S * float(np.finfo(dtype).eps) * max(1.0, float(np.abs(host(ref)).max()))


def make_pool(twin: str, *args, device: str = "cpu", **kwargs):
    """A BlockPool (numpy, float64) or TorchBlockPool (float64 on device) with these sizes."""
    if twin == "numpy":
        return BlockPool(*args, **kwargs)
    return TorchBlockPool(*args, dtype=torch.float64, device=device, **kwargs)


def as_twin(twin: str, a: np.ndarray, device: str = "cpu"):
    """a as a numpy array or a tensor on device."""
    return a if twin == "numpy" else torch.as_tensor(a, device=device)


def put(pool, seq, start: int, n: int, tag: float, twin: str = "numpy"):
    """Append n tokens at positions start.. to seq in every layer; k = tag + position + layer/10."""
    for layer, cache in enumerate(pool.batch([seq])):
        pos = np.arange(start, start + n)[None]  # (1, n)
        k = np.broadcast_to((tag + pos + layer / 10)[:, None, :, None],
                            (1, pool.n_kv_heads, n, pool.d_k)).copy()  # (1, h_kv, n, d_k)
        dev = "cpu" if twin == "numpy" else pool.device
        cache.update(as_twin(twin, k, dev), as_twin(twin, -k, dev), as_twin(twin, pos, dev))


def read(pool, seq, layer: int = 0):
    """(K (h_kv, S, d_k), k_pos (S,)) of one sequence in one layer, as numpy."""
    K, _, pos = pool.batch([seq])[layer].gather()
    return host(K)[0], host(pos)[0]


def snapshot(pool) -> tuple:
    """Everything a failed call must leave as it was."""
    return ({s: tuple(t) for s, t in pool.tables.items()}, pool.refcounts.tolist(), pool.free_blocks,
            host(pool.K).tobytes(), host(pool.V).tobytes(), host(pool.positions).tobytes(),
            {s: pool.length(s) for s in pool.tables})


# ---- generation: token for token against the dense cache ----------------------------------
def tiny(rope: str | None = "half", window: int | None = None, seed: int = 0):
    """An attention-only causal TinyTransformer (GQA) and its float64 numpy twin."""
    model = train.TinyTransformer(vocab=11, T=24, d_model=D, n_heads=H, n_layers=2, causal=True,
                                  seed=seed, n_kv_heads=2, rope=rope, window=window)
    return model, generate.NumpyTinyTransformer(model)


def decode(model, prompts, n_new: int, caches):
    """generate()'s loop (left-padded prefill, then one token per step) -> (tokens (B, n_new), logits)."""
    tokens, positions = generate.left_pad(prompts, model)
    out, logits_seen = [], []
    with generate._inference(model):
        logits = model(tokens, positions, caches)  # (B, T, V)
        for i in range(n_new):
            logits_seen.append(host(logits[:, -1]))  # (B, V)
            nxt = logits[:, -1].argmax(-1)  # (B,)
            out.append(host(nxt))
            if i == n_new - 1:
                break
            positions = positions[:, -1:] + 1  # (B, 1)
            logits = model(nxt[:, None], positions, caches)  # (B, 1, V)
    return np.stack(out, 1), np.stack(logits_seen, 1)  # (B, n_new), (B, n_new, V)


PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [8, 9], [3, 1, 4, 1, 5]]
MODELS = {"rope": dict(rope="half"), "learned positions": dict(rope=None),
          "window": dict(rope="half", window=4)}


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_numpy_generation_equals_the_dense_cache_token_for_token(kind, block_size):
    _, model = tiny(**MODELS[kind])
    n_new = 8
    want, want_logits = decode(model, PROMPTS, n_new, model.new_caches(3, 7 + n_new - 1))
    assert np.array_equal(want, generate.generate(model, PROMPTS, n_new))
    pool = BlockPool.for_model(model, n_blocks=40, block_size=block_size)
    for i in range(3):
        pool.add(i)
    got, got_logits = decode(model, PROMPTS, n_new, pool.batch([0, 1, 2]))
    assert np.array_equal(got, want), f"paged tokens {got} differ from the dense cache's {want}"
    tol = order_tol(want_logits, S=7 + n_new)
    err = np.abs(got_logits - want_logits).max()
    assert err <= tol, f"paged logits differ from the dense cache's by {err:.3g} > {tol:.3g}"
    assert [pool.length(i) for i in range(3)] == [len(p) + n_new - 1 for p in PROMPTS]
    pool.check()


@pytest.mark.parametrize("kind", MODELS)
def test_torch_generation_equals_the_dense_cache_token_for_token(kind):
    model, golden_model = tiny(**MODELS[kind])
    n_new = 8
    want, want_logits = decode(model, PROMPTS, n_new, model.new_caches(3, 7 + n_new - 1))
    _, golden = decode(golden_model, PROMPTS, n_new, None)  # float64, no cache
    pool = TorchBlockPool.for_model(model, n_blocks=32, block_size=4)
    for i in range(3):
        pool.add(i)
    got, got_logits = decode(model, PROMPTS, n_new, pool.batch([0, 1, 2]))
    assert np.array_equal(got, want), f"paged tokens {got} differ from the dense cache's {want}"
    dense_err, allowed = derived_tolerance(golden, want_logits, torch.float32)
    err = np.abs(got_logits - golden).max()
    assert err <= allowed, (f"paged float32 logits are {err:.3g} off the float64 golden; the dense "
                            f"cache is {dense_err:.3g} off, allowed {allowed:.3g}")


@pytest.mark.parametrize("twin", TWINS)
def test_chunked_prefill_with_default_positions_equals_one_prefill(twin):
    model, nmodel = tiny()
    m = nmodel if twin == "numpy" else model
    Pool = BlockPool if twin == "numpy" else TorchBlockPool
    ids = np.array([[5, 3, 9, 1, 2, 7, 7, 4, 0, 6]])  # (1, 10)
    tokens = ids if twin == "numpy" else torch.from_numpy(ids)
    with generate._inference(m):
        want = host(m(tokens, None, m.new_caches(1, 10)))  # (1, 10, V)
        pool = Pool.for_model(m, n_blocks=8, block_size=3)
        pool.add("s")
        caches = pool.batch(["s"])
        got = np.concatenate([host(m(tokens[:, a:b], None, caches))  # positions from the cache
                              for a, b in pairwise([0, 4, 5, 10])], 1)
    assert np.abs(got - want).max() <= order_tol(want, 10, np.float64 if twin == "numpy" else np.float32)
    assert pool.length("s") == 10 and pool.n_used == 4


@pytest.mark.parametrize("twin", TWINS)
def test_ragged_decoding_without_padding_equals_each_prompt_alone(twin):
    """Each prompt prefilled on its own, then ONE batched call per step for rows of different lengths."""
    model, nmodel = tiny()
    m = nmodel if twin == "numpy" else model
    n_new = 6
    want = [host(generate.generate(m, [p], n_new))[0] for p in PROMPTS]
    Pool = BlockPool if twin == "numpy" else TorchBlockPool
    pool = Pool.for_model(m, n_blocks=16, block_size=4)
    conv = (lambda a: a) if twin == "numpy" else torch.from_numpy
    nxt = []
    with generate._inference(m):
        for i, p in enumerate(PROMPTS):  # prefill alone: no pad anywhere
            pool.add(i)
            logits = m(conv(np.array([p])), None, pool.batch([i]))
            nxt.append(int(host(logits[0, -1]).argmax()))
        out = [[t] for t in nxt]
        caches = pool.batch([0, 1, 2])
        assert len(caches[0]) == 7 and host(caches[0].next_positions()).tolist() == [7, 2, 5]
        for _ in range(n_new - 1):
            pos = np.array([[pool.length(i)] for i in range(3)])  # (3, 1): each row's own position
            logits = m(conv(np.array([[o[-1]] for o in out])), conv(pos), caches)  # (3, 1, V)
            for o, t in zip(out, host(logits[:, -1]).argmax(-1), strict=True):
                o.append(int(t))
    assert [list(w) for w in want] == out


# ---- the module: paged equals dense, drawn block sizes, lengths and chunks -------------------
OPTIONS = {"rope gqa": dict(n_kv_heads=2, rope="half"),
           "window rope": dict(n_kv_heads=2, rope="interleaved", window=3),
           "alibi mqa": dict(n_kv_heads=1, alibi=True),
           "plain": {}}


def module(twin: str, opts: dict, seed: int = 1, backend: str | None = None):
    """A float64 module (numpy, or its torch twin) with nonzero biases, these options, a backend."""
    rng = np.random.default_rng(seed)
    m = MultiHeadAttention(D, H, seed=seed, **opts)
    m.bq, m.bo = rng.normal(size=D), rng.normal(size=D)
    m.bk, m.bv = rng.normal(size=m.bk.shape), rng.normal(size=m.bv.shape)
    m = m if twin == "numpy" else TorchMHA.from_numpy(m)
    if backend is not None:
        if twin == "numpy":
            m.set_backend(backend)
        else:
            m.backend = backend
    return m


def paged_vs_dense(twin: str, opts: dict, block_size: int, lengths: list[int], chunks: list[int],
                   n_decode: int, pool=None, seed: int = 0, backend: str | None = None) -> None:
    """Left-padded prefill in `chunks`, then n_decode steps, with a dense and a paged cache: equal outputs.

    `pool` (default: a pool with exactly the blocks the rows need) lets a test pass a broken one.
    """
    m = module(twin, opts, backend=backend)
    B, T = len(lengths), max(lengths)
    x = np.random.default_rng(seed).normal(size=(B, T + n_decode, D))  # (B, T + n_decode, D)
    pos = compose.padded_positions(np.array(lengths), T)  # (B, T): -1 on pads
    steps = np.array(lengths)[:, None] + np.arange(n_decode)  # (B, n_decode)
    pos = np.concatenate([pos, steps], 1)  # (B, T + n_decode)
    bounds = np.cumsum([0, *chunks, *[1] * n_decode])
    if pool is None:
        need = sum(math.ceil((n + n_decode) / block_size) for n in lengths)
        pool = make_pool(twin, 1, need, block_size, m.n_kv_heads, m.d_k, window=m.options.window)
    for b in range(B):
        pool.add(b)
    paged, dense = pool.batch(list(range(B)))[0], m.new_cache(B, T + n_decode)
    conv = (lambda a: a) if twin == "numpy" else torch.from_numpy
    ctx = torch.no_grad() if twin == "torch" else generate.contextlib.nullcontext()
    with ctx:
        for a, b in pairwise(bounds):
            xs, ps = conv(x[:, a:b]), conv(pos[:, a:b])
            want = host(m(xs, causal=True, positions=ps, cache=dense))
            got = host(m(xs, causal=True, positions=ps, cache=paged))
            real = pos[:, a:b] >= 0  # (B, t): pad queries read nothing; their output is not compared
            err = np.abs(got - want)[real].max(initial=0.0)
            tol = order_tol(want[real], S=b)
            assert err <= tol, (f"paged output differs from the dense cache's by {err:.3g} > "
                                f"{tol:.3g} at tokens {a}..{b - 1} (block_size={block_size})")
    assert [pool.length(b) for b in range(B)] == [n + n_decode for n in lengths]
    pool.check()


@st.composite
def workloads(draw):
    """block_size, lengths of a batch, a chunking of the padded prefill, decode steps."""
    block_size = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    T, chunks = max(lengths), []
    while sum(chunks) < T:
        chunks.append(draw(st.integers(1, T - sum(chunks))))
    return block_size, lengths, chunks, draw(st.integers(1, 4))


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("opts", OPTIONS)
@settings(max_examples=15, deadline=None)
@given(work=workloads())
def test_module_with_a_paged_cache_equals_the_dense_cache(twin, opts, work):
    paged_vs_dense(twin, OPTIONS[opts], *work)


@pytest.mark.parametrize("twin, backend", [("numpy", "reference"), ("numpy", "flash"),
                                           ("torch", "sdpa"), ("torch", "manual")])
@pytest.mark.parametrize("opts", ["window rope", "alibi mqa"])
def test_every_backend_reads_a_paged_cache(twin, backend, opts):
    """The backends lower the same mask spec; numpy's flash decodes one token by split-KV."""
    paged_vs_dense(twin, OPTIONS[opts], 3, [7, 2, 4], [4, 3], 3, backend=backend)


@pytest.mark.parametrize("twin", TWINS)
@settings(max_examples=15, deadline=None)
@given(block_size=st.integers(1, 4), lengths=st.lists(st.integers(1, 8), min_size=2, max_size=3),
       n_decode=st.integers(1, 3))
def test_a_ragged_batch_equals_each_row_alone(twin, block_size, lengths, n_decode):
    ragged_vs_alone(twin, block_size, lengths, n_decode)


def ragged_vs_alone(twin: str, block_size: int, lengths: list[int], n_decode: int,
                    pool_type: type | None = None) -> None:
    """Rows prefilled alone to different lengths, then decoded in ONE batch: each equals its row alone."""
    m = module(twin, OPTIONS["rope gqa"])
    conv = (lambda a: a) if twin == "numpy" else torch.from_numpy
    rng = np.random.default_rng(7)
    xs = [rng.normal(size=(1, n + n_decode, D)) for n in lengths]  # one sequence per row
    Pool = pool_type or (BlockPool if twin == "numpy" else TorchBlockPool)
    kw = {} if twin == "numpy" else {"dtype": torch.float64}
    pool = Pool(1, 32, block_size, m.n_kv_heads, m.d_k, **kw)
    ctx = torch.no_grad() if twin == "torch" else generate.contextlib.nullcontext()
    with ctx:
        alone = []
        for x, n in zip(xs, lengths, strict=True):
            cache = m.new_cache(1, n + n_decode)
            alone.append(host(m(conv(x), causal=True, cache=cache)))  # (1, n + n_decode, D)
        for b, (x, n) in enumerate(zip(xs, lengths, strict=True)):
            pool.add(b)
            m(conv(x[:, :n]), causal=True, cache=pool.batch([b])[0])
        [cache] = pool.batch(list(range(len(lengths))))
        for t in range(n_decode):
            x_t = np.concatenate([x[:, n + t:n + t + 1] for x, n in zip(xs, lengths, strict=True)])
            got = host(m(conv(x_t), causal=True, cache=cache))  # (B, 1, D): rows at their own positions
            want = np.concatenate([a[:, n + t] for a, n in zip(alone, lengths, strict=True)])  # (B, D)
            err = np.abs(got[:, 0] - want).max()
            assert err <= order_tol(want, max(lengths) + n_decode), (
                f"row outputs of a ragged batch differ from each row alone by {err:.3g} (lengths "
                f"{lengths}, step {t})")


# ---- prefix sharing: fork, copy-on-write, reference counts ------------------------------------
def fork_and_diverge(twin: str, pool=None) -> None:
    """A parent of 6 tokens (blocks of 4: the last one half full) forks; both append; then both free."""
    pool = pool or make_pool(twin, 2, 8, 4, 1, 2)
    pool.add("p")
    put(pool, "p", 0, 6, tag=100, twin=twin)
    assert pool.tables["p"] == [0, 1] and pool.n_used == 2
    parent = [read(pool, "p", layer) for layer in range(2)]
    pool.fork("p", "c")
    assert pool.tables["c"] == [0, 1] and pool.refcounts[:2].tolist() == [2, 2]
    assert pool.tokens_held == 6 and pool.length("c") == 6, "a fork shares, it stores nothing new"
    assert pool.blocks_needed("c", 1) == 1, "the shared, half-full block must be copied first"
    assert pool.blocks_needed("c", 2) == 1 and pool.blocks_needed("c", 3) == 2
    put(pool, "c", 6, 3, tag=200, twin=twin)  # copy-on-write of block 1 (both layers), then a new block
    c_table = pool.tables["c"]
    assert c_table[1] not in (0, 1), (f"the child wrote into shared block {c_table[1]} in place: "
                                      f"copy-on-write missing")
    assert c_table[0] == 0 and len(c_table) == 3, f"the full prefix block stays shared: {c_table}"
    assert pool.refcounts[[0, 1]].tolist() == [2, 1], pool.refcounts
    for layer in range(2):
        K, pos = read(pool, "p", layer)
        assert np.array_equal(K, parent[layer][0]) and np.array_equal(pos, parent[layer][1]), \
            "the parent's keys changed when the child appended: copy-on-write missing"
        K, pos = read(pool, "c", layer)
        assert pos.tolist() == list(range(9))
        assert np.array_equal(K[0, :6], parent[layer][0][0]), "the child lost the shared prefix"
        assert np.array_equal(K[0, 6:, 0], 200 + np.arange(6, 9) + layer / 10)
    child = [read(pool, "c", layer) for layer in range(2)]
    put(pool, "p", 6, 1, tag=300, twin=twin)  # the parent now holds block 1 alone: in place
    assert pool.tables["p"] == [0, 1]
    for layer in range(2):
        K, pos = read(pool, "c", layer)
        assert np.array_equal(K, child[layer][0]), "the child's keys changed when the parent appended"
        assert read(pool, "p", layer)[1].tolist() == list(range(7))
    pool.check()
    pool.free("p")
    assert pool.refcounts[[0, 1]].tolist() == [1, 0], pool.refcounts
    assert 0 not in pool.free_blocks and 1 in pool.free_blocks, "a block went back while shared"
    pool.check()
    assert read(pool, "c")[1].tolist() == list(range(9)), "the child lost tokens when the parent left"
    pool.free("c")
    assert pool.n_free == 8 and pool.refcounts.sum() == 0 and pool.tables == {}
    pool.check()


@pytest.mark.parametrize("twin", TWINS)
def test_fork_shares_blocks_and_copies_a_shared_block_before_writing(twin):
    fork_and_diverge(twin)


@pytest.mark.parametrize("twin", TWINS)
def test_forked_generations_each_equal_their_own_sequence(twin):
    """A prompt prefilled once, forked 3 ways; each branch continues differently and equals its own run."""
    model, nmodel = tiny()
    m = nmodel if twin == "numpy" else model
    conv = (lambda a: a) if twin == "numpy" else torch.from_numpy
    prompt, tails = [4, 1, 7, 2, 9], [[3, 3], [5], [8, 0, 6]]
    Pool = BlockPool if twin == "numpy" else TorchBlockPool
    pool = Pool.for_model(m, n_blocks=12, block_size=4)
    with generate._inference(m):
        pool.add("root")
        m(conv(np.array([prompt])), None, pool.batch(["root"]))
        for i, tail in enumerate(tails):
            pool.fork("root", i)
            got = host(m(conv(np.array([tail])), None, pool.batch([i])))[0, -1]  # (V,)
            want = host(m(conv(np.array([prompt + tail])), None, m.new_caches(1, 8)))[0, -1]
            tol = order_tol(want, 8, np.float64 if twin == "numpy" else np.float32)
            assert np.abs(got - want).max() <= tol, f"branch {i} differs from its own sequence"
    assert pool.refcounts[pool.tables["root"][0]] == 4, "the full prefix block is shared by all"
    pool.check()


@pytest.mark.parametrize("n", [1, 4, 32])
def test_prefix_sharing_stores_a_common_prompt_once(n):
    """n requests with a 64-token common prompt: blocks and slot use with fork against without."""
    bs, prefix, own = 16, 64, 5
    shared, separate = BlockPool(1, 200, bs, 1, 2), BlockPool(1, 200, bs, 1, 2)
    shared.add("sys")
    put(shared, "sys", 0, prefix, tag=0)
    for i in range(n):
        shared.fork("sys", i)
        put(shared, i, prefix, own, tag=i)
        separate.add(i)
        put(separate, i, 0, prefix + own, tag=i)
    shared.free("sys")
    assert shared.n_used == prefix // bs + n, "the prefix blocks once, one block per request's tail"
    assert separate.n_used == n * math.ceil((prefix + own) / bs)
    assert shared.tokens_held == prefix + n * own
    assert separate.tokens_held == n * (prefix + own)
    shared.check()
    separate.check()


def test_slot_use_counts_real_tokens_over_reserved_slots():
    pool = BlockPool(1, 10, 4, 1, 2)
    assert pool.slot_use == 0.0 and pool.n_used == 0
    for s, n in (("a", 5), ("b", 3), ("c", 8)):
        pool.add(s)
        put(pool, s, 0, n, tag=0)
    assert pool.n_used == 2 + 1 + 2 and pool.tokens_held == 16
    assert pool.slot_use == pytest.approx(16 / 20)
    pool.fork("c", "d")  # shares, stores nothing
    assert pool.slot_use == pytest.approx(16 / 20)
    pool.free("b")
    assert pool.slot_use == pytest.approx(13 / 16)
    assert pool.nbytes == 2 * 1 * 10 * 1 * 4 * 2 * 8


@pytest.mark.parametrize("twin", TWINS)
def test_pads_are_not_stored_and_a_row_of_pads_copies_nothing(twin):
    pool = make_pool(twin, 1, 6, 4, 1, 2)
    pool.add("a")
    put(pool, "a", 0, 5, tag=0, twin=twin)
    pool.fork("a", "b")
    k, v = _kv(twin, (2, 1, 3, 2))
    pos = as_twin(twin, np.array([[-1, 5, 6], [-1, -1, -1]]))  # a: a pad, then 2 tokens; b: pads
    K, _, k_pos = pool.batch(["a", "b"])[0].update(k, v, pos)
    assert pool.length("a") == 7 and pool.length("b") == 5, "pads must not take slots"
    assert pool.tables["b"] == [0, 1] and pool.refcounts[[0, 1]].tolist() == [2, 1], \
        "a row of pads wrote nothing, so it must copy nothing"
    assert host(k_pos).tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, EMPTY, EMPTY]]
    assert tuple(K.shape) == (2, 1, 7, 2)
    pool.check()


# ---- the twins agree -----------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_numpy_and_torch_pools_agree_operation_by_operation(device):
    pools = {"numpy": make_pool("numpy", 2, 9, 3, 2, 4),
             "torch": make_pool("torch", 2, 9, 3, 2, 4, device=device)}
    for twin, pool in pools.items():
        pool.add("a")
        put(pool, "a", 0, 4, tag=10, twin=twin)
        pool.fork("a", "b")
        put(pool, "b", 4, 3, tag=20, twin=twin)
        pool.add("c")
        put(pool, "c", 0, 2, tag=30, twin=twin)
        pool.free("a")
        put(pool, "c", 2, 5, tag=40, twin=twin)
    n, t = pools["numpy"], pools["torch"]
    assert dict(n.tables) == dict(t.tables)
    assert n.refcounts.tolist() == t.refcounts.tolist() and n.free_blocks == t.free_blocks
    assert np.array_equal(n.K, host(t.K)) and np.array_equal(n.positions, host(t.positions))
    assert n.nbytes == t.nbytes and n.slot_use == t.slot_use
    for layer in range(2):
        for got, want in zip(t.batch(["b", "c"])[layer].gather(), n.batch(["b", "c"])[layer].gather(),
                             strict=True):
            assert np.array_equal(host(got), want)


def test_the_cache_reports_what_the_module_reads():
    pool = BlockPool(2, 8, 2, 1, 2, window=5)
    for s, n in (("a", 3), ("b", 1)):
        pool.add(s)
        put(pool, s, 0, n, tag=0)
    pool.add("e")
    caches = pool.batch(["a", "b", "e"])
    assert isinstance(caches[1], PagedKVCache) and caches[1].layer == 1
    c = caches[0]
    assert (c.B, c.n_heads, c.d_k, c.dtype, c.window) == (3, 1, 2, np.float64, 5)
    assert len(c) == 3 and c.next_positions().tolist() == [3, 1, 0] and c.lengths() == [3, 1, 0]
    K, V, pos = c.gather()
    assert K.shape == V.shape == (3, 1, 3, 2) and pos.tolist() == [[0, 1, 2], [0, EMPTY, EMPTY],
                                                                   [EMPTY] * 3]
    c.check_room(2)  # 2 + 1 + 1 blocks of 8 - 3 used
    with pytest.raises(PoolExhausted, match="6 blocks needed, 5 free"):
        c.check_room(4)
    t = TorchBlockPool(1, 2, 2, 1, 2)
    t.add(0)
    assert isinstance(t.batch([0])[0], TorchPagedKVCache)


# ---- bad input: a clear error, the pool unchanged ----------------------------------------------
def _busy(twin: str, device: str = "cpu"):
    """A pool of 6 blocks of 4 holding a (5 tokens) and its fork b: 2 blocks used, 4 free."""
    pool = make_pool(twin, 2, 6, 4, 1, 2, device=device)
    pool.add("a")
    put(pool, "a", 0, 5, tag=1, twin=twin)
    pool.fork("a", "b")
    return pool


def _kv(twin: str, shape, dtype=np.float64, device: str = "cpu"):
    a = np.ones(shape, dtype)
    return as_twin(twin, a, device), as_twin(twin, a.copy(), device)


BAD_POOL_CALLS = {
    "longer than the pool": (lambda p: p.reserve("a", 20), ValueError,
                             r"would hold 25 tokens, 7 blocks of 4, but the whole pool has 6 blocks"),
    "exhausted": (lambda p: p.reserve("a", 16), PoolExhausted, r"5 blocks needed, 4 free \(of 6\)"),
    "n_new zero": (lambda p: p.reserve("a", 0), ValueError, "n_new must be >= 1, got 0"),
    "n_new negative": (lambda p: p.blocks_needed("a", -2), ValueError, "n_new must be >= 1, got -2"),
    "n_new float": (lambda p: p.reserve("a", 1.5), TypeError, "n_new must be an int"),
    "unknown sequence": (lambda p: p.free("zz"), ValueError, "'zz' is not in the pool .it was never added"),
    "duplicate add": (lambda p: p.add("a"), ValueError, "'a' is already in the pool"),
    "fork onto a sequence": (lambda p: p.fork("a", "b"), ValueError, "child 'b' is already in the pool"),
    "fork of nothing": (lambda p: p.fork("zz", "y"), ValueError, "'zz' is not in the pool"),
    "unhashable id": (lambda p: p.add(["x"]), TypeError, "sequence id must be hashable"),
    "batch twice": (lambda p: p.batch(["a", "a"]), ValueError, "each sequence once, got 'a' twice"),
    "batch of nothing": (lambda p: p.batch([]), TypeError, "non-empty list of sequence ids"),
    "batch unknown": (lambda p: p.batch(["a", 3]), ValueError, "sequence 3 is not in the pool"),
}


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("case", BAD_POOL_CALLS)
def test_bad_pool_calls_are_refused_and_change_nothing(twin, case):
    call, error, match = BAD_POOL_CALLS[case]
    pool = _busy(twin)
    before = snapshot(pool)
    with pytest.raises(error, match=match) as info:
        call(pool)
    assert snapshot(pool) == before, f"{case}: the pool changed although the call was refused"
    if case == "longer than the pool":
        assert not isinstance(info.value, PoolExhausted), "too long is not 'exhausted': it never fits"


@pytest.mark.parametrize("twin", TWINS)
def test_freeing_twice_is_refused_and_changes_nothing(twin):
    pool = _busy(twin)
    pool.free("b")
    before = snapshot(pool)
    with pytest.raises(ValueError, match="sequence 'b' is not in the pool .it was freed already"):
        pool.free("b")
    assert snapshot(pool) == before
    pool.add("b")  # an id may come back (a preempted request)
    assert pool.tables["b"] == []


BAD_UPDATES = {  # (k, v, positions) for a pool of h_kv=1, d_k=2, one row "a" holding positions 0..4
    "k float32": (lambda t, d: (*_kv(t, (1, 1, 1, 2), np.float32, d), [[5]]), TypeError,
                  "k must be (torch.)?float64 to match the pool, got (torch.)?float32"),
    "k of ints": (lambda t, d: (*_kv(t, (1, 1, 1, 2), np.int64, d), [[5]]), TypeError, "k must"),
    "wrong heads": (lambda t, d: (*_kv(t, (1, 2, 1, 2), device=d), [[5]]), ValueError,
                    r"k must be \(B=1, h_kv=1, t_new, d_k=2\), got \(1, 2, 1, 2\)"),
    "wrong d_k": (lambda t, d: (*_kv(t, (1, 1, 1, 3), device=d), [[5]]), ValueError, "d_k=2"),
    "wrong batch": (lambda t, d: (*_kv(t, (2, 1, 1, 2), device=d), [[5], [6]]), ValueError, "B=1"),
    "v differs": (lambda t, d: (_kv(t, (1, 1, 2, 2), device=d)[0], _kv(t, (1, 1, 1, 2), device=d)[0],
                                [[5, 6]]), ValueError, "v must"),
    "no token": (lambda t, d: (*_kv(t, (1, 1, 0, 2), device=d), np.zeros((1, 0), int)), ValueError,
                 "at least one position"),
    "float positions": (lambda t, d: (*_kv(t, (1, 1, 1, 2), device=d), [[5.0]]), TypeError,
                        "positions must hold whole numbers"),
    "positions shape": (lambda t, d: (*_kv(t, (1, 1, 2, 2), device=d), [[5]]), ValueError,
                        r"positions must be \(B=1, t_new=2\)"),
    "positions not after": (lambda t, d: (*_kv(t, (1, 1, 2, 2), device=d), [[5, 4]]), ValueError,
                            "sequence 'a' .row 0. holds up to position 4, and the chunk has 4"),
    "array type": (lambda t, d: (*_kv("torch" if t == "numpy" else "numpy", (1, 1, 1, 2)), [[5]]),
                   TypeError, "k must be a (numpy array|torch.Tensor)"),
}


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("case", BAD_UPDATES)
def test_bad_updates_are_refused_and_change_nothing(twin, case):
    make, error, match = BAD_UPDATES[case]
    pool = _busy(twin)
    k, v, pos = make(twin, "cpu")
    pos = pos if hasattr(pos, "dtype") and (twin == "numpy") == isinstance(pos, np.ndarray) else \
        as_twin(twin, np.array(pos))
    before = snapshot(pool)
    with pytest.raises(error, match=match):
        pool.batch(["a"])[0].update(k, v, pos)
    assert snapshot(pool) == before, f"{case}: the pool changed although the update was refused"


@pytest.mark.parametrize("twin", TWINS)
def test_an_exhausted_pool_refuses_a_whole_batch_before_writing(twin):
    """Row a fits, row b does not: nothing is written for either (all or nothing)."""
    pool = _busy(twin)
    pool.add("c")
    before = snapshot(pool)
    k, v = _kv(twin, (2, 1, 14, 2))
    pos = as_twin(twin, np.stack([np.arange(5, 19), np.arange(14)]))  # a: 5..18, c: 0..13
    # a: 19 tokens, 5 blocks: its 2, a copy of the shared half-full one, 3 new; c: 4 new
    with pytest.raises(PoolExhausted, match="8 blocks needed, 4 free"):
        pool.batch(["a", "c"])[0].update(k, v, pos)
    assert snapshot(pool) == before


@pytest.mark.parametrize("twin", TWINS)
def test_a_table_pointing_at_a_freed_block_is_refused_naming_block_and_sequence(twin):
    """What a free that ignores reference counts leaves behind: check() and the gather both refuse it."""
    pool = _busy(twin)
    pool._refcounts[1] = 0  # block 1 freed while "a" and "b" still hold it
    pool._free.append(1)
    with pytest.raises(RuntimeError, match="sequence 'a'.s block table points at block 1, which is free"):
        pool.check()
    before = snapshot(pool)
    with pytest.raises(RuntimeError, match="sequence 'b'.s block table points at block 1"):
        pool.batch(["b"])[0].gather()
    k, v = _kv(twin, (1, 1, 1, 2))
    with pytest.raises(RuntimeError, match="block 1"):
        pool.batch(["b"])[0].update(k, v, as_twin(twin, np.array([[5]])))
    assert snapshot(pool) == before


def test_check_names_a_refcount_that_disagrees_with_the_tables():
    pool = _busy("numpy")
    pool._refcounts[0] = 3
    with pytest.raises(RuntimeError, match="block 0 has refcount 3 but 2 block tables hold it"):
        pool.check()


def test_a_torch_pool_refuses_tensors_on_another_device():
    pool = TorchBlockPool(1, 4, 2, 1, 2, dtype=torch.float64, device="meta")
    pool.add(0)
    before = (pool.tables[0], pool.refcounts.tolist(), pool.free_blocks)
    k = torch.zeros(1, 1, 1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="k is on cpu but the pool is on meta"):
        pool.batch([0])[0].update(k, k, torch.zeros(1, 1, dtype=torch.long))
    assert (pool.tables[0], pool.refcounts.tolist(), pool.free_blocks) == before


@pytest.mark.parametrize("twin", TWINS)
def test_the_module_refuses_a_mask_and_a_pool_that_does_not_fit(twin):
    m = module(twin, OPTIONS["rope gqa"])
    conv = (lambda a: a) if twin == "numpy" else torch.from_numpy
    x = conv(np.zeros((1, 2, D)))
    pool = make_pool(twin, 1, 4, 2, m.n_kv_heads, m.d_k)
    pool.add(0)
    with pytest.raises(ValueError, match="a paged cache takes no mask"):
        m(x, causal=True, mask=conv(np.ones((2, 2), bool)), cache=pool.batch([0])[0])
    wrong = make_pool(twin, 1, 4, 2, H, m.d_k)
    wrong.add(0)
    with pytest.raises(ValueError, match=r"cache must be built for \(B=1, n_kv_heads=2"):
        m(x, causal=True, cache=wrong.batch([0])[0])
    assert pool.length(0) == wrong.length(0) == 0
    other = BlockPool(1, 4, 2, 2, 4) if twin == "torch" else TorchBlockPool(1, 4, 2, 2, 4)
    other.add(0)
    with pytest.raises(TypeError, match="cache must be a (Torch)?KVCache for this module, got "
                                        "(Torch)?PagedKVCache; a (Torch)?PagedKVCache serves too"):
        m(x, causal=True, cache=other.batch([0])[0])


def test_for_model_refuses_the_other_twin_and_sizes_to_the_model():
    model, nmodel = tiny()
    with pytest.raises(TypeError, match="BlockPool.for_model needs a NumpyTinyTransformer"):
        BlockPool.for_model(model, 4, 2)
    with pytest.raises(TypeError, match="TorchBlockPool.for_model needs a torch TinyTransformer"):
        TorchBlockPool.for_model(nmodel, 4, 2)
    pool = TorchBlockPool.for_model(model, 4, 2)
    assert (pool.n_layers, pool.n_kv_heads, pool.d_k, pool.dtype) == (2, 2, 4, torch.float32)
    assert tuple(pool.K.shape) == (2, 4, 2, 2, 4) and tuple(pool.positions.shape) == (4, 2)
    with pytest.raises(ValueError, match="device"):
        BlockPool(1, 2, 2, 1, 2, device="cpu")


# ---- mutation proofs: the checks above catch a broken pool ----------------------------------------
class OffByOneCache(PagedKVCache):
    """Records one token fewer than it writes: the last block's fill count off by one."""

    def _write(self, k, v, positions, real, written):
        super()._write(k, v, positions, real, written)
        for s in self.seq_ids:
            self.pool._written[s][self.layer] = max(0, self.pool._written[s][self.layer] - 1)


class OffByOnePool(BlockPool):
    _cache_type = OffByOneCache


class NoCopyPool(BlockPool):
    """Counts the copy but writes into a shared block in place: copy-on-write skipped."""

    def _reserve(self, writes):
        for s, start, n in writes:
            while len(self._tables[s]) < math.ceil((start + n) / self.block_size):
                b = self._free.pop()
                self._refcounts[b] = 1
                self._tables[s].append(b)


class FreeAllPool(BlockPool):
    """Puts every block of a freed sequence back on the free list, shared or not."""

    def free(self, seq_id):
        for b in self._tables[seq_id]:
            self._refcounts[b] = max(0, self._refcounts[b] - 1)
            if b not in self._free:
                self._free.append(b)
        del self._tables[seq_id], self._written[seq_id], self._next[seq_id]


class NoEmptyCache(PagedKVCache):
    """Gathers without marking unused slots EMPTY: a short row reads its padding blocks' tokens."""

    def _where(self, held, pos):
        return pos


class NoEmptyPool(BlockPool):
    _cache_type = NoEmptyCache


def test_an_off_by_one_fill_count_is_caught():
    with pytest.raises(AssertionError, match="paged output differs|length"):
        paged_vs_dense("numpy", OPTIONS["rope gqa"], 3, [5, 2], [3, 2], 3, pool=OffByOnePool(1, 8, 3, 2, 4))


def test_skipping_copy_on_write_is_caught():
    with pytest.raises(AssertionError, match="copy-on-write missing"):
        fork_and_diverge("numpy", NoCopyPool(2, 8, 4, 1, 2))


def test_a_free_that_ignores_reference_counts_is_caught():
    with pytest.raises(AssertionError, match="a block went back while shared"):
        fork_and_diverge("numpy", FreeAllPool(2, 8, 4, 1, 2))


def test_unused_slots_left_unmarked_are_caught():
    with pytest.raises(AssertionError, match="ragged batch differ from each row alone"):
        ragged_vs_alone("numpy", 2, [6, 1], 2, pool_type=NoEmptyPool)


# ---- index plans: computed once per model call, never reused once the tables change -------------
def plans_follow_the_tables(twin: str, pool=None) -> None:
    """Sequences fork, copy on write, free, come back and reserve while one batch's caches are held;
    every write and gather must follow the tables as they are now (keys tagged by sequence and position)."""
    pool = pool or make_pool(twin, 2, 12, 2, 1, 2)
    want: dict[str, list[float]] = {}  # layer 0's key per position, as written

    def write(seq: str, n: int, tag: float) -> None:
        start = pool.length(seq)
        put(pool, seq, start, n, tag, twin)
        want[seq] = want.get(seq, [])[:start] + list(tag + np.arange(start, start + n))

    def expect(caches, seqs: list[str], when: str) -> None:
        for layer, cache in enumerate(caches):
            K, _, pos = (host(a) for a in cache.gather())
            for r, s in enumerate(seqs):
                n = len(want[s])
                assert pos[r, :n].tolist() == list(range(n)), f"{when}: {s} reads positions {pos[r]}"
                got, wrote = K[r, 0, :n, 0], np.array(want[s]) + layer / 10
                assert np.array_equal(got, wrote), (f"{when}: layer {layer} of {s} reads {got}, "
                                                    f"{wrote} was written: a stale index plan")

    for s, tag in (("a", 100), ("b", 200)):
        pool.add(s)
        write(s, 3, tag)
    expect(pool.batch(["a"]), ["a"], "a alone")
    expect(pool.batch(["b"]), ["b"], "b alone, the same length as a, other blocks")
    pool.fork("a", "c")
    want["c"] = list(want["a"])
    held = pool.batch(["c"])  # held through every change below
    expect(held, ["c"], "after fork")
    write("c", 1, 300)  # copy-on-write of a's half-full block
    write("a", 1, 400)  # a now holds that block alone: in place, at the slot c just wrote in its copy
    expect(pool.batch(["a", "c"]), ["a", "c"], "after copy-on-write")
    expect(held, ["c"], "after copy-on-write, caches held from before")
    pool.free("a")
    pool.add("d")
    write("d", 4, 500)  # a's freed blocks again
    expect(pool.batch(["d", "c", "b"]), ["d", "c", "b"], "after free and add")
    pool.reserve("d", 2)  # a block more, nothing written
    expect(pool.batch(["d"]), ["d"], "after reserve")
    write("d", 2, 600)
    expect(pool.batch(["c", "d"]), ["c", "d"], "after writing into the reserved block")
    expect(held, ["c"], "at the end, caches held from the start")
    pool.check()


@pytest.mark.parametrize("twin", TWINS)
def test_index_plans_follow_fork_copy_on_write_free_and_reserve(twin):
    plans_follow_the_tables(twin)


class StalePlanCache(PagedKVCache):
    """Keys its index plans without the block tables: a plan outlives a fork, free, reserve or copy."""

    @staticmethod
    def _plan_key(kind, tables, *rest):
        return (kind, *rest)


class StalePlanPool(BlockPool):
    _cache_type = StalePlanCache


def test_index_plans_that_ignore_the_tables_are_caught():
    with pytest.raises(AssertionError, match="a stale index plan"):
        plans_follow_the_tables("numpy", StalePlanPool(2, 12, 2, 1, 2))


class CountingCache(PagedKVCache):
    """Counts the index plans it computes."""

    made = {"write": 0, "gather": 0}

    def _write_plan(self, *args):
        CountingCache.made["write"] += 1
        return super()._write_plan(*args)

    def _gather_plan(self, *args):
        CountingCache.made["gather"] += 1
        return super()._gather_plan(*args)


class CountingPool(BlockPool):
    _cache_type = CountingCache


class ForgetfulPool(CountingPool):
    """Computes every plan afresh: each layer pays for the indices again."""

    def _memo(self, key, make):
        return make()


def plans_once_per_call(pool) -> None:
    """Appending to a batch through every layer (as a model call does) computes each plan once."""
    for s in ("a", "b"):
        pool.add(s)
    for step, n in enumerate((5, 1, 1, 3)):
        CountingCache.made.update(write=0, gather=0)
        for layer, cache in enumerate(pool.batch(["a", "b"])):
            start = step and pool.length("a")
            pos = np.arange(start, start + n)[None].repeat(2, 0)  # (2, n)
            k = np.full((2, pool.n_kv_heads, n, pool.d_k), float(layer))  # (2, h_kv, n, d_k)
            cache.update(k, k, pos)
        assert CountingCache.made == {"write": 1, "gather": 1}, \
            f"step {step}: {pool.n_layers} layers computed {CountingCache.made} index plans, not one each"


def test_one_call_through_every_layer_computes_its_index_plans_once():
    plans_once_per_call(CountingPool(3, 16, 4, 1, 2))


def test_plans_recomputed_for_every_layer_are_caught():
    with pytest.raises(AssertionError, match="not one each"):
        plans_once_per_call(ForgetfulPool(3, 16, 4, 1, 2))


# ---- counts over every sequence at once: blocks_needed_each, tokens_held -------------------------
def tokens_held_by_hand(pool) -> int:
    """The reference: each block's fill (the most any holder wrote into it), summed once per block."""
    fill: dict[int, int] = {}
    for s, table in pool.tables.items():
        n = pool.length(s)
        for i, b in enumerate(table):
            fill[b] = max(fill.get(b, 0), min(pool.block_size, max(n - i * pool.block_size, 0)))
    return sum(fill.values())


def _mixed_pool(twin: str):
    """Blocks of 4: a (6 tokens) and its fork d share a half-full block; b full; c one token, 2 blocks reserved ahead."""
    pool = make_pool(twin, 2, 16, 4, 1, 2)
    for s, n in (("a", 6), ("b", 4), ("c", 1)):
        pool.add(s)
        put(pool, s, 0, n, tag=0, twin=twin)
    pool.reserve("c", 6)  # blocks held, not yet written
    pool.fork("a", "d")
    return pool


@pytest.mark.parametrize("twin", TWINS)
def test_blocks_needed_each_equals_blocks_needed_of_each_sequence_alone(twin):
    pool = _mixed_pool(twin)
    ids = ["a", "b", "c", "d"]
    for counts in ([1, 1, 1, 1], [3, 4, 6, 2], [0, 5, 9, 0], [2, 0, 0, 7]):
        want = [pool.blocks_needed(s, n) if n else 0 for s, n in zip(ids, counts, strict=True)]
        assert pool.blocks_needed_each(ids, counts).tolist() == want, counts
    assert pool.blocks_needed_each(["a", "d"], [1, 1]).tolist() == [1, 1], \
        "each counted alone: both would copy the shared half-full block"
    pool.free("d")  # nothing shared now: the vectorised count
    for counts in ([1, 1, 1], [3, 4, 6], [0, 5, 9], [2, 0, 11]):
        want = [pool.blocks_needed(s, n) if n else 0 for s, n in zip(ids[:3], counts, strict=True)]
        assert pool.blocks_needed_each(ids[:3], counts).tolist() == want, counts
    before = snapshot(pool)
    with pytest.raises(ValueError, match="one count per sequence: 3 sequences, got 2 counts"):
        pool.blocks_needed_each(ids[:3], [1, 1])
    with pytest.raises(ValueError, match="'d' is not in the pool .it was freed already"):
        pool.blocks_needed_each(["a", "d"], [1, 1])
    with pytest.raises(ValueError, match="n_new must be >= 0, got -1"):
        pool.blocks_needed_each(["a"], [-1])
    assert snapshot(pool) == before


@pytest.mark.parametrize("twin", TWINS)
def test_tokens_held_counts_each_shared_block_once(twin):
    pool = _mixed_pool(twin)
    lengths = sum(pool.length(s) for s in pool.tables)
    assert pool.tokens_held == tokens_held_by_hand(pool) == 6 + 4 + 1 < lengths, \
        "the fork's 6 tokens are stored once"
    put(pool, "d", 6, 3, tag=1, twin=twin)  # copy-on-write: d's second block is its own now
    put(pool, "c", 1, 2, tag=1, twin=twin)  # into the reserved blocks
    assert pool.tokens_held == tokens_held_by_hand(pool) == 6 + 4 + 3 + 5
    pool.free("a")
    assert pool.tokens_held == tokens_held_by_hand(pool) == 4 + 3 + 9
    for s in ("b", "c", "d"):
        pool.free(s)
    assert pool.tokens_held == tokens_held_by_hand(pool) == 0
