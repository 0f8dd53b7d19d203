"""mha.perf.traffic: the HBM bytes and FLOPs of attention, against hand counts, and the roofline."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha.inference import kv_cache
from mha.perf import bench, hardware, traffic


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
    acc = hardware.H100_SXM
    for T in (1024, 4096, 16384):
        math = traffic.forward_math(1, 32, T, T, 128, 2)
        tiled = traffic.forward_tiled(1, 32, T, T, 128, 2, causal=True)
        assert tiled.bytes < math.bytes / 3, f"T={T}"
        assert math.bound(acc) == "memory" and math.intensity < 64  # ~ d / 2 FLOP per byte
    big = traffic.forward_tiled(1, 32, 16384, 16384, 128, 2, causal=True, reuse=True)
    assert big.bound(acc) == "compute"


def test_the_accelerators_and_their_ridges():
    assert hardware.H100_SXM.ridge == pytest.approx(989e12 / 3.35e12)  # ~295 FLOP per byte
    assert hardware.H200_SXM.ridge == pytest.approx(989e12 / 4.8e12)  # ~206: more bandwidth, lower ridge
    assert hardware.H200_SXM.attainable(1.0) == 4.8e12 and hardware.H200_SXM.attainable(1e6) == 989e12
    step = kv_cache.decode_step_cost(1, 32, 4096, 128, 2, peak_flops=989e12, bandwidth=4.8e12)
    assert step.intensity == 1.0 and step.bound == "memory"


def test_one_hardware_table_serves_the_roofline_the_decode_cost_and_the_benchmarks():
    default = kv_cache.decode_step_cost(1, 32, 4096, 128, 2)  # the H100 SXM by default
    assert (default.peak_flops, default.bandwidth) == (989e12, 3.35e12)
    assert hardware.ACCELERATORS == (hardware.H100_SXM, hardware.H200_SXM)
    t = traffic.Traffic(989 * 10**12, 10**12)  # one second of arithmetic on the SXM peak
    assert t.seconds(hardware.H100_SXM) == pytest.approx(1.0)
    for row in hardware.GPUS:  # every named part finds its own row, and only it
        assert row.match and hardware.lookup(f"NVIDIA {row.name}") is row, row.name
    assert hardware.lookup("NVIDIA H100 80GB HBM3") is hardware.H100_SXM
    assert hardware.lookup("NVIDIA GH200 480GB") is hardware.GH200
    assert hardware.lookup("Tesla T4") is None
    assert bench.gpu_peak_bf16_tflops("NVIDIA H200") == hardware.H200_SXM.peak_flops / 1e12


def test_a_figure_the_table_lacks_is_refused_by_name():
    with pytest.raises(ValueError, match="A100: bandwidth is not in the hardware table"):
        _ = hardware.A100.ridge
    with pytest.raises(ValueError, match="H100 NVL: peak_flops"):
        traffic.Traffic(10, 10).seconds(hardware.H100_NVL)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="T"):
        traffic.forward_math(1, 1, 0, 4, 2, 2)


# --- ragged tiles: what the kernel really reads, against a brute-force walk of its loops ----------


def _walk(T, S, d, itemsize, causal, block_q, block_k):
    """FA-2's loops walked element by element: (forward flops, forward bytes, backward flops, backward bytes).

    A tile is computed when any of its (query, key) pairs is visible (bottom-right causal: key s
    <= t + S - T); every load and store counts the elements its slice really holds.
    """
    visible = np.ones((T, S), dtype=bool)
    if causal:
        visible = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)  # (T, S)
    queries, keys = np.arange(T), np.arange(S)
    fwd_flops = fwd_bytes = bwd_flops = bwd_bytes = 0
    for t0 in range(0, T, block_q):
        rows = queries[t0:t0 + block_q].size  # the rows this query block holds
        fwd_bytes += itemsize * 2 * rows * d + traffic.LSE_BYTES * rows  # q read, out and lse written
        for s0 in range(0, S, block_k):
            if not visible[t0:t0 + block_q, s0:s0 + block_k].any():
                continue  # skipped: wholly above the diagonal
            cols = keys[s0:s0 + block_k].size
            fwd_flops += 4 * rows * cols * d
            fwd_bytes += itemsize * 2 * cols * d  # this K and V tile
            bwd_flops += 10 * rows * cols * d
            # q, dout read (itemsize), lse, delta read (float32), dq read + written (float32)
            bwd_bytes += itemsize * 2 * rows * d + 2 * traffic.LSE_BYTES * rows + 2 * 4 * rows * d
    bwd_bytes += itemsize * 4 * S * d  # every key block: K, V read once, dK, dV written once
    return fwd_flops, fwd_bytes, bwd_flops, bwd_bytes


@settings(max_examples=150, deadline=None)
@given(T=st.integers(1, 200), S=st.integers(1, 200), d=st.sampled_from([1, 16, 64]),
       itemsize=st.sampled_from([1, 2, 4]), causal=st.booleans(),
       block_q=st.integers(4, 80), block_k=st.integers(4, 80))
def test_the_tiled_counts_equal_a_walk_of_the_loops(T, S, d, itemsize, causal, block_q, block_k):
    fwd_flops, fwd_bytes, bwd_flops, bwd_bytes = _walk(T, S, d, itemsize, causal, block_q, block_k)
    f = traffic.forward_tiled(2, 3, T, S, d, itemsize, causal=causal, block_q=block_q, block_k=block_k)
    b = traffic.backward_tiled(2, 3, T, S, d, itemsize, causal=causal, block_q=block_q, block_k=block_k)
    assert (f.flops, f.bytes) == (6 * fwd_flops, 6 * fwd_bytes)
    assert (b.flops, b.bytes) == (6 * bwd_flops, 6 * bwd_bytes)
    assert b.flops * 2 == 5 * f.flops


def test_a_ragged_last_key_tile_counts_its_keys_not_a_block():
    # S = 65 with 64-key blocks: the kernel reads 64 + 1 keys, not the 128 of S = 128
    ragged = traffic.forward_tiled(1, 1, 128, 65, 64, 2, block_q=128, block_k=64)
    by_hand = 2 * 2 * 128 * 64 + 4 * 128 + 2 * 2 * 65 * 64  # q, out; lse; K and V: 65 keys each
    assert ragged.bytes == by_hand == 49920
    assert ragged.bytes < traffic.forward_tiled(1, 1, 128, 128, 64, 2, block_q=128, block_k=64).bytes
    for T, S in ((65, 65), (100, 37), (1, 300)):  # no mask: the products of attention, padding not counted
        assert traffic.forward_tiled(1, 2, T, S, 16, 2).flops == bench.attention_flops(1, 2, T, 16, S=S)
    # a ragged last query block: q, dout, lse, delta and dq of 65 rows, not 128
    b = traffic.backward_tiled(1, 1, 65, 65, 64, 2, block_q=128, block_k=64)
    assert b.bytes == 2 * 4 * 65 * 64 + 2 * (2 * 2 * 65 * 64 + 2 * 4 * 65 + 2 * 4 * 65 * 64)


# --- bad inputs: a clear error naming what was expected and what arrived --------------------------

SIZES = dict(B=1, h=2, T=8, S=8, d=4, itemsize=2)


def _sized(fn, **changes):
    return lambda: fn(**{**SIZES, **changes})


BAD = [
    *[(f"{fn.__name__} {name}={value!r}", _sized(fn, **{name: value}), error, name)
      for fn in (traffic.forward_math, traffic.forward_tiled, traffic.backward_tiled)
      for name, value, error in (("T", 0, ValueError), ("S", -1, ValueError), ("B", 1.5, TypeError),
                                 ("h", True, TypeError), ("d", float("nan"), TypeError),
                                 ("itemsize", 0, ValueError), ("T", "8", TypeError))],
    *[(f"{fn.__name__} {name}={value!r}", _sized(fn, **{name: value}), error, name)
      for fn in (traffic.forward_tiled, traffic.backward_tiled)
      for name, value, error in (("block_q", 0, ValueError), ("block_k", -64, ValueError),
                                 ("block_k", 64.0, TypeError), ("block_q", True, TypeError),
                                 ("causal", "no", TypeError), ("causal", 1, TypeError),
                                 ("reuse", "yes", TypeError), ("reuse", None, TypeError))],
    ("Traffic flops=-1", lambda: traffic.Traffic(-1, 10), ValueError, "flops"),
    ("Traffic flops=1.5", lambda: traffic.Traffic(1.5, 10), TypeError, "flops"),
    ("Traffic bytes=0", lambda: traffic.Traffic(10, 0), ValueError, "bytes"),
    ("Traffic bytes=True", lambda: traffic.Traffic(10, True), TypeError, "bytes"),
    ("Accelerator peak=0", lambda: hardware.Accelerator("x", 0, 1e12, 1024, 1), ValueError, "peak_flops"),
    ("Accelerator peak=nan", lambda: hardware.Accelerator("x", float("nan"), 1e12, 1024, 1), ValueError,
     "peak_flops"),
    ("Accelerator peak='1e15'", lambda: hardware.Accelerator("x", "1e15", 1e12, 1024, 1), TypeError,
     "peak_flops"),
    ("Accelerator bandwidth=inf", lambda: hardware.Accelerator("x", 1e15, float("inf"), 1024, 1),
     ValueError, "bandwidth"),
    ("Accelerator bandwidth=True", lambda: hardware.Accelerator("x", 1e15, True, 1024, 1), TypeError,
     "bandwidth"),
    ("Accelerator sram=0", lambda: hardware.Accelerator("x", 1e15, 1e12, 0, 1), ValueError, "sram_per_sm"),
    ("Accelerator n_sm=1.5", lambda: hardware.Accelerator("x", 1e15, 1e12, 1024, 1.5), TypeError, "n_sm"),
    ("Accelerator name=3", lambda: hardware.Accelerator(3, 1e15, 1e12, 1024, 1), TypeError, "name"),
    ("attainable(nan)", lambda: hardware.H100_SXM.attainable(float("nan")), ValueError, "intensity"),
    ("attainable(-1)", lambda: hardware.H100_SXM.attainable(-1.0), ValueError, "intensity"),
    ("attainable('3')", lambda: hardware.H100_SXM.attainable("3"), TypeError, "intensity"),
    ("attainable(True)", lambda: hardware.H100_SXM.attainable(True), TypeError, "intensity"),
    ("seconds('H100')", lambda: traffic.Traffic(10, 10).seconds("H100"), TypeError, "Accelerator"),
    ("bound(None)", lambda: traffic.Traffic(10, 10).bound(None), TypeError, "Accelerator"),
]


@pytest.mark.parametrize("name,call,error,words", BAD, ids=[case[0] for case in BAD])
def test_bad_inputs_get_a_clear_error(name, call, error, words):
    with pytest.raises(error, match=words) as caught:
        call()
    assert "got" in str(caught.value), f"{name}: the message should say what arrived: {caught.value}"
