"""The manual path computes bfloat16 / float16 in float32 and rounds once, like the fused kernels."""

import pytest
import torch
import torch.nn.functional as F

from mha.attention.torch_attention import (
    compute_dtype,
    manual_attention,
    masked_scores,
    safe_softmax,
)
from mha.modules.torch_mha import MultiHeadAttention
from mha.parallel import ring as parallel


def _qkv(dtype, T=128, seed=11, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 4, T, 32, generator=g) * scale).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_one_rounding_of_the_float32_answer(dtype):
    q, k, v = _qkv(dtype)
    mask = torch.ones(128, 128, dtype=torch.bool).tril()
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    out, weights = manual_attention(q, k, v, mask)
    assert out.dtype == dtype and weights.dtype == dtype, "results come back in the input's dtype"
    in_fp32, _ = manual_attention(q.float(), k.float(), v.float(), mask)
    assert torch.equal(out, in_fp32.to(dtype)), "expected exactly the float32 answer rounded once"
    spacing = torch.finfo(dtype).eps * float(exact.abs().max())  # one ulp at the largest output
    assert float((out.double() - exact).abs().max()) <= spacing / 2 + 1e-5


def test_a_bfloat16_softmax_would_be_about_twice_as_far_off():
    """The planted old behaviour: scores and softmax in bfloat16 (what the path did before)."""
    q, k, v = _qkv(torch.bfloat16)
    mask = torch.ones(128, 128, dtype=torch.bool).tril()
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    new = float((manual_attention(q, k, v, mask)[0].double() - exact).abs().max())
    old = float(((safe_softmax(masked_scores(q, k, mask)) @ v).double() - exact).abs().max())
    sdpa = float((F.scaled_dot_product_attention(q, k, v, is_causal=True).double() - exact).abs().max())
    assert old > 1.5 * new, f"bfloat16 softmax error {old:.3g} vs float32 accumulation {new:.3g}"
    assert new <= sdpa * 1.01 + 1e-6, f"the manual path ({new:.3g}) should be no worse than SDPA ({sdpa:.3g})"


def test_float16_scores_past_65504_do_not_overflow():
    q, k, v = _qkv(torch.float16, T=16, scale=100.0)  # q . k reaches past 65504: inf in float16
    assert bool(torch.isinf(q @ k.transpose(-1, -2)).any()), "the case must overflow in float16"
    out, _ = manual_attention(q, k, v)
    assert bool(torch.isfinite(out).all())
    want, _ = manual_attention(q.float(), k.float(), v.float())
    assert torch.equal(out, want.to(torch.float16))


def test_compute_dtype_and_the_module_in_bfloat16():
    assert compute_dtype(torch.bfloat16) == torch.float32 == compute_dtype(torch.float16)
    assert compute_dtype(torch.float64) == torch.float64
    m = MultiHeadAttention(32, 4, seed=1, dtype=torch.bfloat16, backend="manual")
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        assert m(x, causal=True).dtype == torch.bfloat16 and m.attn.dtype == torch.bfloat16


def test_ring_attention_in_bfloat16_merges_in_float32_and_rounds_once():
    q, k, v = _qkv(torch.bfloat16, T=32, seed=3)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    ring, _ = parallel.ring_attention(q, k, v, 4, "zigzag", causal=True)
    assert ring.dtype == torch.bfloat16
    spacing = torch.finfo(torch.bfloat16).eps * float(exact.abs().max())
    assert float((ring.double() - exact).abs().max()) <= spacing / 2 + 1e-5
    grads = parallel.ring_backward(q, k, v, q, 4, "zigzag", causal=True)
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3
