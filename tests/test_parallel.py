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
