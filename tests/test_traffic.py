"""mha.traffic: the HBM bytes and FLOPs of attention, against hand counts, and the roofline."""

import pytest

from mha import bench, kv_cache, traffic


def test_the_materialised_forward_by_hand():
    # B=1, h=1, T=S=4, d=2, bf16: q, k, v, out 4*2 each; (T, S) = 16 written 2x and read 2x
    t = traffic.forward_math(1, 1, 4, 4, 2, 2)
    assert t.bytes == 2 * (8 + 8 + 16 + 2 * 16 + 16 + 8 + 8)
    assert t.flops == 4 * 4 * 4 * 2 == bench.attention_flops(1, 1, 4, 2)


def test_the_tiled_forward_by_hand():
    # T=S=256, blocks 128 x 64: 2 query blocks x 4 key blocks = 8 tiles; causal keeps 2 + 4 = 6
    full = traffic.forward_tiled(1, 1, 256, 256, 16, 2)
    assert full.flops == 4 * 8 * 128 * 64 * 16 == bench.attention_flops(1, 1, 256, 16)
    assert full.bytes == 2 * 2 * 256 * 16 + 4 * 256 + 2 * 2 * 8 * 64 * 16
    causal = traffic.forward_tiled(1, 1, 256, 256, 16, 2, causal=True)
    assert causal.flops == 4 * 6 * 128 * 64 * 16
    reuse = traffic.forward_tiled(1, 1, 256, 256, 16, 2, reuse=True)
    assert reuse.bytes == 2 * 2 * 256 * 16 + 4 * 256 + 2 * 2 * 256 * 16  # q, out, lse, k, v once


def test_the_backward_is_two_and_a_half_forwards_of_flops():
    for causal in (False, True):
        f = traffic.forward_tiled(2, 4, 1024, 1024, 64, 2, causal=causal)
        b = traffic.backward_tiled(2, 4, 1024, 1024, 64, 2, causal=causal)
        assert b.flops * 2 == 5 * f.flops
    by_hand = 2 * (3 * 256 * 16 + 2 * 256 * 16 + 256 * 16 + 2 * 256 * 16) + 2 * 4 * 256
    assert traffic.backward_tiled(1, 1, 256, 256, 16, 2, reuse=True).bytes == by_hand


def test_tiling_cuts_the_bytes_and_the_materialised_path_is_memory_bound():
    acc = traffic.H100_SXM
    for T in (1024, 4096, 16384):
        math = traffic.forward_math(1, 32, T, T, 128, 2)
        tiled = traffic.forward_tiled(1, 32, T, T, 128, 2, causal=True)
        assert tiled.bytes < math.bytes / 3, f"T={T}"
        assert math.bound(acc) == "memory" and math.intensity < 64  # ~ d / 2 FLOP per byte
    big = traffic.forward_tiled(1, 32, 16384, 16384, 128, 2, causal=True, reuse=True)
    assert big.bound(acc) == "compute"


def test_the_accelerators_and_their_ridges():
    assert traffic.H100_SXM.ridge == pytest.approx(989e12 / 3.35e12)  # ~295 FLOP per byte
    assert traffic.H200_SXM.ridge == pytest.approx(989e12 / 4.8e12)  # ~206: more bandwidth, lower ridge
    assert traffic.H200_SXM.attainable(1.0) == 4.8e12 and traffic.H200_SXM.attainable(1e6) == 989e12
    step = kv_cache.decode_step_cost(1, 32, 4096, 128, 2, peak_flops=989e12, bandwidth=4.8e12)
    assert step.intensity == 1.0 and step.bound == "memory"


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="T"):
        traffic.forward_math(1, 1, 0, 4, 2, 2)
