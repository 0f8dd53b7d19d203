"""Ring attention and Ulysses on simulated ranks (mha.parallel.ring), against one-process attention."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha.attention import numpy_attention, torch_attention
from mha.parallel import ring as parallel
from mha.perf import bench


def _qkv(B=2, h=4, T=16, d_k=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, T, d_k, generator=g, dtype=dtype) for _ in range(3)]


def _reference(q, k, v, causal):
    """Softmax attention in float64, written from the definition (one process, no blocks)."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T, S)
    if causal:
        T = q.shape[2]
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, h, T, d_k)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("layout", parallel.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_ring_and_ulysses_equal_one_process_attention(world_size, layout, causal):
    q, k, v = _qkv()
    want = _reference(q, k, v, causal)
    ring, _ = parallel.ring_attention(q, k, v, world_size, layout, causal)
    uly = parallel.ulysses_attention(q, k, v, world_size, layout, causal)
    assert float((ring - want).abs().max()) < 1e-12
    assert float((uly - want).abs().max()) < 1e-12


def test_float32_stays_within_the_error_of_one_process_float32():
    q, k, v = _qkv(T=32, dtype=torch.float32, seed=3)
    golden = _reference(q, k, v, causal=True)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    _, allowed = bench.derived_tolerance(golden, plain, torch.float32)
    for layout in parallel.LAYOUTS:
        ring, _ = parallel.ring_attention(q, k, v, 4, layout, causal=True)
        err = float((ring.double() - golden).abs().max())
        assert err <= allowed, f"{layout}: float32 ring error {err:.3g} > allowed {allowed:.3g}"


def test_zigzag_balances_the_causal_work_and_contiguous_does_not():
    q, k, v = _qkv(T=32)
    _, contiguous = parallel.ring_attention(q, k, v, 4, "contiguous", causal=True)
    _, zigzag = parallel.ring_attention(q, k, v, 4, "zigzag", causal=True)
    assert contiguous == [1, 2, 3, 4]  # rank r sees only the blocks of ranks <= r
    assert zigzag == [4, 4, 4, 4]  # every rank's late chunk sees every block
    pairs = parallel.causal_work(32, 4, "zigzag")
    assert len(set(pairs)) == 1 and sum(pairs) == 32 * 33 // 2  # equal shares of the triangle
    by_hand = [sum(t + 1 for t in range(8 * r, 8 * r + 8)) for r in range(4)]  # 36, 100, 164, 228
    assert parallel.causal_work(32, 4, "contiguous") == by_hand


def test_merge_equals_the_numpy_merge_and_a_plain_average_does_not():
    q, k, v = _qkv(T=8)
    a = torch_attention.attention_lse(q, k[:, :, :3], v[:, :, :3])
    b = torch_attention.attention_lse(q, k[:, :, 3:], v[:, :, 3:])
    out, lse = torch_attention.merge_partials(*a, *b)
    assert float((out - _reference(q, k, v, False)).abs().max()) < 1e-12
    np_out, np_lse = numpy_attention.merge_partials(*(t.numpy() for t in (*a, *b)))
    assert np.abs(out.numpy() - np_out).max() < 1e-14 and np.abs(lse.numpy() - np_lse).max() < 1e-14
    planted = (a[0] + b[0]) / 2  # the usual mistake: averaging normalised outputs, no lse
    assert float((planted - out).abs().max()) > 1e-2, "the check could not tell the planted merge"


def test_an_empty_side_counts_for_nothing():
    q, k, v = _qkv(T=4)
    o, o_lse = torch_attention.attention_lse(q, k, v)
    empty = (torch.zeros_like(o), torch.full_like(o_lse, float("-inf")))
    out, lse = torch_attention.merge_partials(*empty, o, o_lse)
    assert torch.equal(out, o) and torch.equal(lse, o_lse)
    out, lse = torch_attention.merge_partials(*empty, *empty)
    assert torch.equal(out, torch.zeros_like(o)) and bool(torch.isneginf(lse).all())


def test_bad_splits_are_refused_before_any_work():
    q, k, v = _qkv(T=12)
    with pytest.raises(ValueError, match="zigzag layout cuts T into 8 equal pieces"):
        parallel.ring_attention(q, k, v, 4, "zigzag")
    with pytest.raises(ValueError, match="T=12 is not divisible by 8"):
        parallel.rank_positions(12, 8, "contiguous")
    with pytest.raises(ValueError, match="h=4 is not divisible by 3"):
        parallel.ulysses_attention(*_qkv(T=12), 3)
    with pytest.raises(ValueError, match="layout must be one of"):
        parallel.shard(q, 2, "striped")
    with pytest.raises(ValueError, match="world_size must be a whole number >= 1"):
        parallel.ring_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="expected out_a, out_b of one shape"):
        torch_attention.merge_partials(q, q[..., 0], q[:, :1], q[..., 0])


def test_shard_and_unshard_are_inverses_for_both_layouts():
    x = torch.arange(2 * 3 * 24).reshape(2, 3, 24)
    for layout in parallel.LAYOUTS:
        pieces = parallel.shard(x, 4, layout, dim=2)
        assert all(p.is_contiguous() and p.shape == (2, 3, 6) for p in pieces)
        assert torch.equal(parallel.unshard(pieces, layout, dim=2), x)
    assert parallel.rank_positions(8, 2, "zigzag")[0].tolist() == [0, 1, 6, 7]


# Across processes (torch.distributed, gloo): the same rank algorithms, real messages ----------
@pytest.mark.parametrize("kind", ["ring", "ulysses"])
@pytest.mark.parametrize("world_size,layout,causal", [(2, "contiguous", True), (4, "zigzag", True),
                                                      (4, "contiguous", False)])
def test_across_processes_equals_one_process_attention(kind, world_size, layout, causal):
    q, k, v = _qkv(T=16)
    out, ranks = parallel.distributed_attention(kind, q, k, v, world_size, layout, causal,
                                                timeout_s=60)
    err = float((out - _reference(q, k, v, causal)).abs().max())
    assert err < 1e-12, f"{kind} W={world_size} {layout}: error {err:.3g}"
    if kind == "ring":  # W - 1 steps, each sending the rank's K, V block and its positions
        per_step = 2 * 2 * 4 * (16 // world_size) * 8 * 8 + (16 // world_size) * 8  # by hand
        assert per_step == parallel.ring_bytes_per_step(2, 4, 16, world_size, 8, 8)
        assert [r["bytes_sent"] for r in ranks] == [(world_size - 1) * per_step] * world_size
        want_blocks = [4] * 4 if layout == "zigzag" else (
            list(range(1, world_size + 1)) if causal else [world_size] * world_size)
        assert [r["blocks"] for r in ranks] == want_blocks


def test_across_processes_a_bad_split_is_refused_before_any_process_starts(monkeypatch):
    from mha.parallel import launch

    def no_processes(*args, **kwargs):
        raise AssertionError("a bad split must be refused before any process starts")

    monkeypatch.setattr(launch, "run_workers", no_processes)
    q, k, v = _qkv(T=12)
    with pytest.raises(ValueError, match="T=12 is not divisible by 8"):
        parallel.distributed_attention("ring", q, k, v, 4, "zigzag")
    with pytest.raises(ValueError, match="h=4 is not divisible by 3"):
        parallel.distributed_attention("ulysses", q, k, v, 3)
    with pytest.raises(ValueError, match="kind must be 'ring' or 'ulysses'"):
        parallel.distributed_attention("tree", q, k, v, 2)


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_simulated_ring_backward_equals_one_process_autograd(layout):
    """Autograd through the simulated messages: dq, dk, dv of the ring equal those of one pass."""
    leaves = [t.requires_grad_() for t in _qkv(T=16, seed=5)]
    dout = torch.randn(2, 4, 16, 8, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    want = torch.autograd.grad(_reference(*leaves, True), leaves, dout)
    ring, _ = parallel.ring_attention(*leaves, 4, layout, causal=True)
    got = torch.autograd.grad(ring, leaves, dout)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert float((g - w).abs().max()) < 1e-12, f"d{name} differs by {float((g - w).abs().max()):.3g}"


# The hand-derived backward of ring attention ---------------------------------------------------
def _grads_by_autograd(q, k, v, dout, causal):
    """dq, dk, dv of one-process float64 attention (k, v may have fewer heads: repeated first)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    n_rep = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(n_rep, dim=1) for t in leaves[1:])
    return torch.autograd.grad(_reference(leaves[0], kr, vr, causal), leaves, dout)


def _max_err(got, want):
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("layout", parallel.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_hand_derived_ring_backward_equals_autograd(world_size, layout, causal):
    q, k, v = _qkv(T=16, seed=2)
    dout = _qkv(T=16, seed=3)[0]
    got = parallel.ring_backward(q, k, v, dout, world_size, layout, causal)
    err = _max_err(got, _grads_by_autograd(q, k, v, dout, causal))
    assert err < 1e-12, f"W={world_size} {layout} causal={causal}: gradient error {err:.3g}"


def test_ring_with_grouped_kv_heads_sends_the_small_heads_and_sums_their_gradients():
    q = _qkv(h=4, T=16, seed=4)[0]
    k, v = _qkv(h=2, T=16, seed=5)[:2]  # h_kv = 2: each K/V head serves 2 query heads
    dout = _qkv(h=4, T=16, seed=6)[0]
    out, _ = parallel.ring_attention(q, k, v, 4, "zigzag", causal=True)
    want = _reference(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), True)
    assert float((out - want).abs().max()) < 1e-12
    got = parallel.ring_backward(q, k, v, dout, 4, "zigzag", causal=True)
    assert got[1].shape == k.shape and got[2].shape == v.shape
    assert _max_err(got, _grads_by_autograd(q, k, v, dout, True)) < 1e-12


def test_a_backward_from_each_blocks_own_logsumexp_is_caught():
    """Planted bug: P recomputed from the block's own lse (its local softmax), not the row's."""
    q, k, v = _qkv(T=16, seed=7)
    dout = _qkv(T=16, seed=8)[0]
    want = _grads_by_autograd(q, k, v, dout, True)
    right = parallel.block_backward

    def local_lse(q, k, v, lse, dout, delta, allowed=None, bias=None):
        _, own = torch_attention.attention_lse(q, k, v, allowed, bias)  # this block's lse only
        return right(q, k, v, own, dout, delta, allowed, bias)

    planted = parallel.ring_backward(q, k, v, dout, 4, "contiguous", True, block_grads=local_lse)
    err = _max_err(planted, want)
    assert err > 1e-2, f"the check could not tell the planted backward (error {err:.3g})"


# The whole module, sequence-parallel ------------------------------------------------------------
def test_a_core_forward_refuses_what_it_cannot_split():
    from mha.modules.torch_mha import MultiHeadAttention

    m = MultiHeadAttention(16, 4, dtype=torch.float64)
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    core = parallel.ring_core(2)
    with pytest.raises(ValueError, match="a core= forward is self-attention over positions: it "
                                         "takes causal and positions, not mask"):
        m(x, mask=torch.ones(8, 8, dtype=torch.bool), core=core)
    with pytest.raises(ValueError, match="not context"):
        m(x, context=x, core=core)
    with pytest.raises(ValueError, match=r"h_kv=2 is not divisible by 4"):
        parallel.sequence_parallel(MultiHeadAttention(16, 4, n_kv_heads=2), x.float(), 4, "ulysses")
    with pytest.raises(ValueError, match="expected an mha MultiHeadAttention"):
        parallel.sequence_parallel(torch.nn.Linear(16, 16), x, 2)


def test_a_core_forward_on_one_rank_is_the_module_itself():
    """The core= path with a core that attends locally gives the ordinary forward (every option)."""
    from mha.attention.torch_attention import attention_lse
    from mha.modules.torch_mha import MultiHeadAttention

    def local(q, k, v, q_pos, k_pos, rule):
        allowed, bias = rule(q_pos, k_pos)
        return attention_lse(q, *parallel._full_heads(q, k, v), allowed, bias)[0]

    x = torch.randn(2, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for opts in [{}, dict(n_kv_heads=2, rope="half"), dict(alibi=True), dict(window=3)]:
        m = MultiHeadAttention(16, 4, seed=2, dtype=torch.float64, **opts).requires_grad_(False)
        err = float((m(x, causal=True, core=local) - m(x, causal=True)).abs().max())
        assert err < 1e-12, f"{opts}: the core= path differs by {err:.3g}"


# Across processes: backward, the whole module, ranks that disagree, NCCL ------------------------
@pytest.mark.parametrize("kind", ["ring", "ulysses"])
@pytest.mark.parametrize("world_size,layout,causal", [(2, "contiguous", True), (4, "zigzag", True),
                                                      (4, "contiguous", False)])
def test_across_processes_backward_equals_one_process_autograd(kind, world_size, layout, causal):
    q, k, v = _qkv(T=16, seed=11)
    dout = _qkv(T=16, seed=12)[0]
    out, grads, ranks = parallel.distributed_backward(kind, q, k, v, dout, world_size, layout,
                                                      causal=causal, timeout_s=60)
    assert float((out - _reference(q, k, v, causal)).abs().max()) < 1e-12
    err = _max_err(grads, _grads_by_autograd(q, k, v, dout, causal))
    assert err < 1e-12, f"{kind} W={world_size} {layout}: gradient error {err:.3g}"
    if kind == "ring":  # by hand: W - 1 steps of K, V, positions, dK, dV (float64), then dK, dV
        block = 2 * 4 * (16 // world_size) * 8 * 8
        by_hand = (world_size - 1) * (4 * block + (16 // world_size) * 8) + 2 * block
        assert by_hand == parallel.ring_backward_bytes(2, 4, 16, world_size, 8, 8)
        assert [r["backward_bytes_sent"] for r in ranks] == [by_hand] * world_size


@pytest.mark.parametrize("kind,world_size,options", [
    ("ring", 2, dict(n_kv_heads=2, rope="half")), ("ulysses", 2, dict(alibi=True)),
    ("ring", 4, dict(window=5)), ("ulysses", 4, dict(n_kv_heads=4, rope="interleaved"))])
def test_sequence_parallel_module_equals_the_module_forward_and_backward(kind, world_size, options):
    from mha.modules.torch_mha import MultiHeadAttention

    g = torch.Generator().manual_seed(3)
    m = MultiHeadAttention(16, 4, seed=4, dtype=torch.float64, **options)
    x = torch.randn(2, 16, 16, dtype=torch.float64, generator=g, requires_grad=True)
    dy = torch.randn(2, 16, 16, dtype=torch.float64, generator=g)
    y = m(x, causal=True)
    want = torch.autograd.grad(y, [x, *m.parameters()], dy)
    y = y.detach()
    got = parallel.sequence_parallel(m, x.detach(), world_size, kind, "zigzag", True, dout=dy)
    assert float((got["out"] - y).abs().max()) < 1e-12
    assert float((got["dx"] - want[0]).abs().max()) < 1e-12
    for (name, grad), w in zip(got["grads"].items(), want[1:], strict=True):
        assert float((grad - w).abs().max()) < 1e-12, f"{kind} {options}: d{name} differs"


def test_sequence_parallel_float32_stays_within_the_error_of_the_float32_module():
    from mha.modules.torch_mha import MultiHeadAttention

    x = torch.randn(1, 16, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        golden = MultiHeadAttention(16, 4, seed=6, dtype=torch.float64)(x.double(), causal=True)
        plain = MultiHeadAttention(16, 4, seed=6)(x, causal=True)
    _, allowed = bench.derived_tolerance(golden, plain, torch.float32)
    got = parallel.sequence_parallel(MultiHeadAttention(16, 4, seed=6), x, 4, "ring", "zigzag", True)
    err = float((got["out"].double() - golden).abs().max())
    assert err <= allowed, f"float32 sequence-parallel error {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.parametrize("facts,message", [
    ([{"world_size": 2, "T": 16}, {"world_size": 2, "T": 12}],
     "they differ: T: rank 0 has 16, rank 1 has 12"),
    ([{"layout": "zigzag"}, {"layout": "contiguous"}],
     "they differ: layout: rank 0 has zigzag, rank 1 has contiguous"),
    ([{"world_size": 4}, {"world_size": 4}],
     "every rank was told world_size=4, but the process group has 2 ranks"),
])
def test_ranks_that_disagree_all_raise_the_same_clear_error_instead_of_hanging(facts, message):
    import time

    from mha.parallel import _launch_examples as ex
    from mha.parallel.launch import run_workers

    start = time.monotonic()
    said = run_workers(ex.disagreeing_ranks, 2, args=(facts,), timeout_s=30, collective_timeout_s=10)
    assert said[0] == said[1], "every rank must say the same"
    assert message in said[0], f"expected {message!r}, got {said[0]!r}"
    assert time.monotonic() - start < 10, "a disagreement must not wait for a collective timeout"


def test_ranks_that_agree_go_on():
    from mha.parallel import _launch_examples as ex
    from mha.parallel.launch import run_workers

    facts = [{"world_size": 2, "T": 16, "layout": "zigzag"}] * 2
    assert run_workers(ex.disagreeing_ranks, 2, args=(facts,), timeout_s=30) == ["agreed"] * 2


def test_nccl_is_refused_without_enough_gpus_before_any_process_starts():
    from mha.parallel import _launch_examples as ex
    from mha.parallel.launch import run_workers

    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match="backend='nccl' puts each rank on its own GPU"):
        run_workers(ex.all_reduce_sum, too_many, backend="nccl")
    with pytest.raises(ValueError, match="backend must be 'gloo' or 'nccl', got 'mpi'"):
        run_workers(ex.all_reduce_sum, 2, backend="mpi")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs CUDA: 2 GPUs for NCCL")
@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_nccl_ranks_on_gpus_equal_one_process_attention(kind):
    from mha.parallel.launch import run_workers

    q, k, v = _qkv(T=16, seed=13)
    dout = _qkv(T=16, seed=14)[0]
    ranks = run_workers(parallel.rank_worker, 2, (kind, q, k, v, "zigzag", True, dout),
                        timeout_s=120, backend="nccl")
    out = parallel.unshard([r["out"] for r in ranks], "zigzag")
    assert float((out - _reference(q, k, v, True)).abs().max()) < 1e-12
    grads = [parallel.unshard([r["grads"][i] for r in ranks], "zigzag") for i in range(3)]
    assert _max_err([g.cpu() for g in grads], _grads_by_autograd(q, k, v, dout, True)) < 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: tensors on the GPU")
def test_simulated_ring_on_the_gpu_equals_the_cpu():
    q, k, v = (t.cuda() for t in _qkv(T=16, seed=15))
    out, _ = parallel.ring_attention(q, k, v, 4, "zigzag", causal=True)
    assert float((out.cpu() - _reference(q.cpu(), k.cpu(), v.cpu(), True)).abs().max()) < 1e-12


def test_each_rank_peaks_at_a_few_of_its_own_score_matrices_not_the_whole_one():
    """Measured per rank (torch's profiler): ring ~ (T/W)^2 scores per head, Ulysses ~ T^2 of h/W heads."""
    from mha.attention.torch_attention import attention, causal_mask

    q, k, v = _qkv(B=1, h=4, T=512, d_k=16, dtype=torch.float32, seed=16)
    with torch.no_grad():
        one = bench.peak_memory_bytes(lambda: attention(q, k, v, causal_mask(512, 512), backend="manual"))
    whole = bench.score_matrix_bytes(1, 4, 512, 512, torch.float32)
    assert 1 <= one / whole < 4
    ring = parallel.peak_bytes_per_rank("ring", q, k, v, 2, "zigzag", causal=True)
    uly = parallel.peak_bytes_per_rank("ulysses", q, k, v, 2, "zigzag", causal=True)
    for name, peaks, scores in (("ring", ring, whole / 4), ("ulysses", uly, whole / 2)):
        for r, peak in enumerate(peaks):
            assert 1 <= peak / scores < 4, f"{name} rank {r}: peak {peak} is {peak / scores:.2f} score matrices"
    assert max(ring) < one / 3 and max(uly) < one / 1.5, (one, ring, uly)


# The zigzag rule: what each rank really scores ---------------------------------------------------
def _per_rank_flops(ranks):
    """Drive rank generators in one process (as `simulate`), counting each rank's matmul flops apart."""
    from torch.utils.flop_counter import FlopCounterMode

    flops = [0] * len(ranks)

    def counted(r, gen):
        def step(message):
            with FlopCounterMode(display=False) as counter:
                try:
                    out = next(gen) if message is None else gen.send(message)
                finally:
                    flops[r] += counter.get_total_flops()
            return out

        message = None
        while True:
            try:
                sent = step(message)
            except StopIteration as done:
                return done.value
            message = yield sent

    results = parallel.simulate([counted(r, g) for r, g in enumerate(ranks)], "ring")
    return results, flops


def _ring_ranks(q, k, v, world_size, layout, causal, stats, rule=None, out_dtype=None):
    pos = parallel.rank_positions(q.shape[2], world_size, layout)
    qs, ks, vs = (parallel.shard(t, world_size, layout) for t in (q, k, v))
    return [parallel.ring_rank(qs[r], ks[r], vs[r], pos[r], world_size, causal, stats[r], rule,
                               out_dtype) for r in range(world_size)]


@pytest.mark.parametrize("T,W", [(4096, 4), (64, 4), (48, 3), (32, 2), (16, 8)])
def test_zigzag_scores_half_blocks_so_every_rank_does_the_same_work(T, W):
    """ring-flash-attention's rule: own block causal, earlier blocks' first half, later blocks to the
    second half of the queries. Per rank c^2 (2W + 2) entries with c = T / 2W: the contiguous total,
    spread evenly. Contiguous: rank r scores r + 1 whole blocks of (2c)^2."""
    c = T // (2 * W)
    zig = [s["scores"] for s in parallel.ring_stats(T, W, "zigzag")]
    con = [s["scores"] for s in parallel.ring_stats(T, W, "contiguous")]
    assert con == [(r + 1) * (2 * c) ** 2 for r in range(W)], f"contiguous: {con}"
    assert zig == [(2 * W + 2) * c * c] * W, f"zigzag: expected {(2 * W + 2) * c * c} per rank, got {zig}"
    assert sum(zig) == sum(con), f"zigzag total {sum(zig)} != contiguous total {sum(con)}"
    if W > 1:
        assert max(zig) < max(con), "the slowest zigzag rank must do less than the last contiguous one"
    least = parallel.causal_work(T, W, "zigzag")  # allowed pairs: no rank can do less
    assert all(z >= n for z, n in zip(zig, least, strict=True))


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_the_counted_scores_are_the_flops_torch_counts(layout):
    """FlopCounterMode, per rank: forward 2 matmuls (q k^T, P v), backward 5, each 2 d_k flops per entry."""
    B, h, T, d_k, W = 1, 2, 64, 8, 4
    q, k, v = _qkv(B, h, T, d_k, seed=21)
    dout = _qkv(B, h, T, d_k, seed=22)[0]
    stats = [{} for _ in range(W)]
    fwd, flops = _per_rank_flops(_ring_ranks(q, k, v, W, layout, True, stats))
    assert flops == [4 * d_k * s["scores"] for s in stats], (flops, stats)
    c = T // (2 * W)
    if layout == "zigzag":
        assert [s["scores"] for s in stats] == [B * h * (2 * W + 2) * c * c] * W
    pos = parallel.rank_positions(T, W, layout)
    qs, ks, vs, dos = (parallel.shard(t, W, layout) for t in (q, k, v, dout))
    back = [{} for _ in range(W)]
    _, bflops = _per_rank_flops([parallel.ring_rank_backward(qs[r], ks[r], vs[r], pos[r], *fwd[r],
                                                             dos[r], W, True, back[r])
                                 for r in range(W)])
    assert [s["scores"] for s in back] == [s["scores"] for s in stats], "the backward scores as the forward"
    assert bflops == [10 * d_k * s["scores"] for s in back], (bflops, back)


def test_the_zigzag_tiles_are_the_half_blocks_and_need_no_mask():
    T, W = 16, 4
    c = T // (2 * W)
    for r, s in enumerate(parallel.ring_stats(T, W, "zigzag")):
        mine = set(parallel.rank_positions(T, W, "zigzag")[r].tolist())
        for q_pos, k_pos, masked in s["tiles"]:
            own = set(k_pos.tolist()) <= mine
            assert masked == own, f"rank {r}: only the own block needs a mask"
            if not own:  # a half block: c queries x 2c keys or 2c queries x c keys, all visible
                assert sorted((len(q_pos), len(k_pos))) == [c, 2 * c]
                assert bool((k_pos[None, :] <= q_pos[:, None]).all())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_visible_tile_is_exact_on_any_mask(T_q, S, n, seed):
    g = torch.Generator().manual_seed(seed)
    kind = seed % 3  # a random mask, a random rectangle, or nothing visible
    if kind == 0:
        allowed = torch.rand(n, T_q, S, generator=g) < 0.5
    else:
        allowed = torch.zeros(n, T_q, S, dtype=torch.bool)
        if kind == 1:
            r0, c0 = int(torch.randint(T_q, (1,), generator=g)), int(torch.randint(S, (1,), generator=g))
            allowed[:, r0:, c0:] = True
    tile = parallel.visible_tile(allowed)
    if tile is None:
        assert not bool(allowed.any())
        return
    rows, cols, mask = tile
    inside = torch.zeros_like(allowed)
    inside[:, rows, cols] = True
    assert not bool((allowed & ~inside).any()), "an allowed pair outside the tile"
    if mask is None:
        assert bool(allowed[:, rows, cols].all()), "an unmasked tile must hold only allowed pairs"
    else:
        assert mask is allowed


@settings(max_examples=25, deadline=None)
@given(W=st.integers(1, 4), chunk=st.integers(1, 3), B=st.integers(1, 2), h_kv=st.integers(1, 2),
       group=st.integers(1, 2), d_k=st.integers(1, 5), layout=st.sampled_from(parallel.LAYOUTS),
       causal=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_ring_forward_and_backward_equal_one_process_on_drawn_sizes(W, chunk, B, h_kv, group, d_k,
                                                                    layout, causal, seed):
    T, h = 2 * W * chunk, h_kv * group
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(B, h, T, d_k, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, h_kv, T, d_k, generator=g, dtype=torch.float64) for _ in range(2))
    want_out = _reference(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal)
    out, _ = parallel.ring_attention(q, k, v, W, layout, causal)
    assert float((out - want_out).abs().max()) < 1e-12
    got = parallel.ring_backward(q, k, v, dout, W, layout, causal)
    assert _max_err(got, _grads_by_autograd(q, k, v, dout, causal)) < 1e-12


def _rule_from(mask, bias):
    """A rule read off a global (T, T) mask and (1, h, T, T) bias (None: none)."""
    def rule(q_pos, k_pos):
        allowed = None if mask is None else mask[q_pos][:, k_pos]  # (T_q, T_k)
        return allowed, None if bias is None else bias[..., q_pos, :][..., k_pos]
    return rule


@settings(max_examples=20, deadline=None)
@given(W=st.integers(1, 4), chunk=st.integers(1, 3), which=st.sampled_from(
    ["causal", "window", "alibi", "random", "random+bias", "none"]),
    layout=st.sampled_from(parallel.LAYOUTS), seed=st.integers(0, 2**31 - 1))
def test_any_rule_stays_exact_forward_and_backward(W, chunk, which, layout, seed):
    """Windows, ALiBi, arbitrary masks: the tile rule only skips what the rule's mask hides."""
    B, h, d_k, T = 2, 2, 4, 2 * W * chunk
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(B, h, T, d_k, generator=g, dtype=torch.float64) for _ in range(4))
    t = torch.arange(T)
    causal = t[None, :] <= t[:, None]  # (T, T)
    mask = {"causal": causal, "window": causal & (t[:, None] - t[None, :] < 3), "alibi": causal,
            "random": torch.rand(T, T, generator=g) < 0.6, "random+bias": torch.rand(T, T, generator=g) < 0.6,
            "none": None}[which]
    bias = None
    if which in ("alibi", "random+bias"):
        slopes = torch.tensor([0.5, 0.25], dtype=torch.float64)[None, :, None, None]
        bias = -slopes * (t[:, None] - t[None, :]).abs().double()  # (1, h, T, T)
    rule = _rule_from(mask, bias)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    scores = leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(d_k) + (0 if bias is None else bias)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # a row with no key: 0
    want = probs @ leaves[2]
    want_grads = torch.autograd.grad(want, leaves, dout)
    pos = parallel.rank_positions(T, W, layout)
    qs, ks, vs, dos = (parallel.shard(x, W, layout) for x in (q, k, v, dout))
    fwd = parallel.simulate([parallel.ring_rank(qs[r], ks[r], vs[r], pos[r], W, rule=rule)
                             for r in range(W)], "ring")
    out = parallel.unshard([o for o, _ in fwd], layout)
    assert float((out - want.detach()).abs().max()) < 1e-12, which
    grads = parallel.simulate([parallel.ring_rank_backward(qs[r], ks[r], vs[r], pos[r], *fwd[r], dos[r],
                                                           W, rule=rule) for r in range(W)], "ring")
    got = [parallel.unshard([gr[i] for gr in grads], layout) for i in range(3)]
    assert _max_err(got, want_grads) < 1e-12, which


def test_a_mask_that_is_not_one_rectangle_falls_back_to_the_whole_block_masked():
    """A window's band inside a block: the whole block, masked; pure causal zigzag: rectangles."""
    T, W = 16, 2
    t = torch.arange(T)
    band = _rule_from((t[None, :] <= t[:, None]) & (t[:, None] - t[None, :] < 3), None)
    x = torch.zeros(1, 1, T, 1, dtype=torch.float64)
    stats = [{"tiles": []} for _ in range(W)]
    parallel.simulate(_ring_ranks(x, x, x, W, "zigzag", False, stats, band), "ring")
    for s in stats:
        for q_pos, k_pos, masked in s["tiles"]:
            assert masked and len(q_pos) == len(k_pos) == T // W, "a band is no rectangle: whole block"
    causal = [{"tiles": []} for _ in range(W)]
    parallel.simulate(_ring_ranks(x, x, x, W, "zigzag", True, causal), "ring")
    assert [m for s in causal for *_, m in s["tiles"]] == [True, False] * W  # own block, half block


# Mixed precision: the backward's sums and messages in float32 -------------------------------------
def _rounding_ratio(got, exact, dtype):
    """Error against the exact answer, in units of one rounding of the exact answer to dtype."""
    one = float((exact.to(dtype).double() - exact).abs().max())
    return float((got.double() - exact).abs().max()) / one


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_low_precision_ring_backward_is_one_rounding_from_the_exact_gradient(dtype, layout):
    """W = 8: dK and dV summed and sent in float32 and rounded once, like dQ; the forward's out
    kept unrounded for delta. Each gradient within 1.5 roundings of the exact one (was 2-5)."""
    g = torch.Generator().manual_seed(31)
    q, k, v, dout = (torch.randn(2, 4, 128, 16, generator=g).to(dtype) for _ in range(4))
    exact = _grads_by_autograd(q.double(), k.double(), v.double(), dout.double(), True)
    got = parallel.ring_backward(q, k, v, dout, 8, layout, causal=True)
    ratios = [_rounding_ratio(x, w, dtype) for x, w in zip(got, exact, strict=True)]
    assert all(x.dtype == dtype for x in got)
    assert max(ratios) <= 1.5, f"dq, dk, dv are {[round(r, 2) for r in ratios]} roundings away"


def test_low_precision_ring_backward_across_processes_sends_float32_gradients():
    g = torch.Generator().manual_seed(32)
    q, k, v, dout = (torch.randn(1, 2, 64, 8, generator=g).to(torch.bfloat16) for _ in range(4))
    exact = _grads_by_autograd(q.double(), k.double(), v.double(), dout.double(), True)
    _, grads, ranks = parallel.distributed_backward("ring", q, k, v, dout, 4, "zigzag", causal=True,
                                                    timeout_s=60)
    ratios = [_rounding_ratio(x, w, torch.bfloat16) for x, w in zip(grads, exact, strict=True)]
    assert max(ratios) <= 1.5, f"dq, dk, dv are {[round(r, 2) for r in ratios]} roundings away"
    block = 1 * 2 * (64 // 4) * 8  # numbers in one (B, h_kv, T / W, d_k) block
    by_hand = 3 * (2 * block * 2 + 2 * block * 4 + (64 // 4) * 8) + 2 * block * 4  # dK, dV float32
    assert parallel.ring_backward_bytes(1, 2, 64, 4, 8, 2) == by_hand
    assert [r["backward_bytes_sent"] for r in ranks] == [by_hand] * 4
