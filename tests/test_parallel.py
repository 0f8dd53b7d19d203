"""Ring attention and Ulysses on simulated ranks (mha.parallel), against one-process attention."""

import math

import numpy as np
import pytest
import torch

from mha import bench, flash, parallel


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
    a = parallel.attention_lse(q, k[:, :, :3], v[:, :, :3])
    b = parallel.attention_lse(q, k[:, :, 3:], v[:, :, 3:])
    out, lse = parallel.merge_partials(*a, *b)
    assert float((out - _reference(q, k, v, False)).abs().max()) < 1e-12
    np_out, np_lse = flash.merge_partials(*(t.numpy() for t in (*a, *b)))
    assert np.abs(out.numpy() - np_out).max() < 1e-14 and np.abs(lse.numpy() - np_lse).max() < 1e-14
    planted = (a[0] + b[0]) / 2  # the usual mistake: averaging normalised outputs, no lse
    assert float((planted - out).abs().max()) > 1e-2, "the check could not tell the planted merge"


def test_an_empty_side_counts_for_nothing():
    q, k, v = _qkv(T=4)
    o, o_lse = parallel.attention_lse(q, k, v)
    empty = (torch.zeros_like(o), torch.full_like(o_lse, float("-inf")))
    out, lse = parallel.merge_partials(*empty, o, o_lse)
    assert torch.equal(out, o) and torch.equal(lse, o_lse)
    out, lse = parallel.merge_partials(*empty, *empty)
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
        parallel.merge_partials(q, q[..., 0], q[:, :1], q[..., 0])


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
    from mha import launch

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
        _, own = parallel.attention_lse(q, k, v, allowed, bias)  # this block's lse only
        return right(q, k, v, own, dout, delta, allowed, bias)

    planted = parallel.ring_backward(q, k, v, dout, 4, "contiguous", True, block_grads=local_lse)
    err = _max_err(planted, want)
    assert err > 1e-2, f"the check could not tell the planted backward (error {err:.3g})"


# The whole module, sequence-parallel ------------------------------------------------------------
def test_a_core_forward_refuses_what_it_cannot_split():
    from mha.torch_mha import MultiHeadAttention

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
    from mha.torch_mha import MultiHeadAttention, attention_lse

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
    from mha.torch_mha import MultiHeadAttention

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
    from mha.torch_mha import MultiHeadAttention

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

    from mha import _launch_examples as ex
    from mha.launch import run_workers

    start = time.monotonic()
    said = run_workers(ex.disagreeing_ranks, 2, args=(facts,), timeout_s=30, collective_timeout_s=10)
    assert said[0] == said[1], "every rank must say the same"
    assert message in said[0], f"expected {message!r}, got {said[0]!r}"
    assert time.monotonic() - start < 10, "a disagreement must not wait for a collective timeout"


def test_ranks_that_agree_go_on():
    from mha import _launch_examples as ex
    from mha.launch import run_workers

    facts = [{"world_size": 2, "T": 16, "layout": "zigzag"}] * 2
    assert run_workers(ex.disagreeing_ranks, 2, args=(facts,), timeout_s=30) == ["agreed"] * 2


def test_nccl_is_refused_without_enough_gpus_before_any_process_starts():
    from mha import _launch_examples as ex
    from mha.launch import run_workers

    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match="backend='nccl' puts each rank on its own GPU"):
        run_workers(ex.all_reduce_sum, too_many, backend="nccl")
    with pytest.raises(ValueError, match="backend must be 'gloo' or 'nccl', got 'mpi'"):
        run_workers(ex.all_reduce_sum, 2, backend="mpi")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs CUDA: 2 GPUs for NCCL")
@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_nccl_ranks_on_gpus_equal_one_process_attention(kind):
    from mha.launch import run_workers

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
    from mha.torch_mha import attention, causal_mask

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
