"""The Triton kernel (mha.triton_flash) against mha.flash and SDPA; on CPU in Triton's interpreter."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha import bench, flash, triton_flash
from mha.torch_mha import manual_attention

pytestmark = pytest.mark.skipif(not triton_flash.available(),
                                reason="triton is a test requirement (requirements-dev.txt)")


def _qkv(T, S, d=16, dtype=torch.float32, seed=0, B=2, h=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, T, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, h, S, d, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v)]


CASES = [(64, 64, False, 0), (64, 64, True, 0), (50, 70, True, 20), (70, 50, False, 0),
         (33, 33, True, 0), (40, 40, True, -8)]  # ragged, bottom-right, rows with no key


@pytest.mark.parametrize("T,S,causal,offset", CASES)
def test_float64_equals_the_numpy_tiles(T, S, causal, offset):
    q, k, v = _qkv(T, S, dtype=torch.float64, seed=T + S)
    out, lse = triton_flash.flash_forward(q, k, v, causal, offset, block_q=16, block_k=32)
    want, want_lse = flash.flash_attention(q.numpy(), k.numpy(), v.numpy(), causal, offset=offset)
    assert float(np.abs(out.numpy() - want).max()) < 1e-12
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse.numpy()), finite), "lse -inf exactly where no key is allowed"
    assert float(np.abs(lse.double().numpy()[finite] - want_lse[finite]).max()) < 1e-5  # float32 lse
    if not finite.all():
        assert float(np.abs(out.numpy()[~finite]).max(initial=0.0)) == 0.0, "no key: output 0"


def test_float32_within_the_tolerance_of_float32_sdpa():
    q, k, v = _qkv(96, 96, d=32, seed=3)
    golden = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    _, allowed = bench.derived_tolerance(golden, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                         torch.float32)
    out, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=32, block_k=16)
    assert out.dtype == torch.float32
    assert float((out.double() - golden).abs().max()) <= allowed


def test_bfloat16_within_the_tolerance_of_the_manual_path():
    q, k, v = _qkv(48, 48, d=32, dtype=torch.bfloat16, seed=4)
    golden = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    mask = torch.ones(48, 48, dtype=torch.bool).tril()
    _, allowed = bench.derived_tolerance(golden, manual_attention(q, k, v, mask)[0], torch.bfloat16)
    out, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=16, block_k=16)
    assert out.dtype == torch.bfloat16
    err = float((out.double() - golden).abs().max())
    assert err <= allowed, f"bfloat16 kernel error {err:.3g} > allowed {allowed:.3g}"


def test_bad_shapes_are_refused_and_the_environment_is_left_as_it_was():
    q, k, v = _qkv(16, 16, d=8)
    with pytest.raises(ValueError, match="d_k must be a power of two >= 16 .*got 8"):
        triton_flash.flash_forward(q, k, v)
    q, k, v = _qkv(16, 16)
    with pytest.raises(ValueError, match=r"block_q must be a power of two >= 16 .*, got 24"):
        triton_flash.flash_forward(q, k, v, block_q=24)
    with pytest.raises(ValueError, match=r"expected q \(B, h, T, d_k\)"):
        triton_flash.flash_forward(q, k[:, :1], v)
    before = os.environ.get("TRITON_INTERPRET")
    triton_flash.flash_forward(q, k, v)
    assert os.environ.get("TRITON_INTERPRET") == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the compiled Triton kernel")
def test_compiled_on_the_gpu_matches_sdpa_in_bfloat16():
    q, k, v = (t.cuda() for t in _qkv(1024, 1024, d=128, dtype=torch.bfloat16, seed=5, B=1, h=4))
    golden = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    _, allowed = bench.derived_tolerance(golden, sdpa, torch.bfloat16)
    out, _ = triton_flash.flash_forward(q, k, v, causal=True, block_q=128, block_k=64)
    assert float((out.double() - golden).abs().max()) <= allowed
