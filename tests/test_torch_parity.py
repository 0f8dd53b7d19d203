"""One contract, every implementation: numpy, torch SDPA, torch manual, fused QKV, nn.MultiheadAttention.

float64: every implementation matches the loop reference (tests/reference.py) to 1e-12.
float32 / bfloat16: tolerances are derived, not guessed, the way PyTorch's
test/test_transformers.py (`_check_equal`) and flash-attention's tests do it:
    golden   = float64 computation on the same (rounded) weights and inputs
    ref_err  = max |golden - manual path run in the low dtype|   (the plain low-precision path)
    allowed  = max(floor, FUDGE * ref_err),  floor = PyTorch's default_atol for the dtype
(test_transformers.py floors its derived atol the same way: 1e-5 for float32, 1e-3 for
bfloat16/float16; without a floor, a lucky low-precision reference on a tiny problem makes
the bound tighter than rounding noise, which hypothesis duly found).
and the tested path must stay within `allowed` of the golden output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import checks
from mha.attention.torch_attention import causal_mask
from mha.modules.torch_mha import MultiHeadAttention, torch_mha_forward
from mha.perf.bench import FUDGE, derived_tolerance
from tests.reference import attention_loops

IMPLS = ["numpy", "sdpa", "manual", "sdpa_fused", "manual_fused", "nn_mha"]


def run_impl(name: str, module: MultiHeadAttention, x, context, causal, mask) -> np.ndarray:
    """Run implementation `name` with `module`'s weights in the module's dtype; return float64 numpy."""
    if name == "numpy":
        np_dtype = {torch.float64: np.float64, torch.float32: np.float32}[module.dtype]
        npm = module.to_numpy(np_dtype)  # weights transposed back to numpy's (in, out)
        ctx = None if context is None else context.numpy().astype(np_dtype)
        m = None if mask is None else mask.numpy()
        return npm(x.numpy().astype(np_dtype), context=ctx, causal=causal, mask=m).astype(np.float64)
    with torch.no_grad():
        if name == "nn_mha":
            out = torch_mha_forward(module.to_torch_mha(), x, context, causal, mask)
        else:
            fused = name.endswith("_fused")
            twin = MultiHeadAttention(module.d_model, module.n_heads, dtype=module.dtype,
                                      fused_qkv=fused, use_sdpa=name.startswith("sdpa"))
            twin.load_weights_(*module.qkv_weights(), module.out_proj.weight, module.out_proj.bias)
            out = twin(x, context=context, causal=causal, mask=mask)
    return out.double().numpy()


@st.composite
def cases(draw):
    """A random problem: shapes, self- or cross-attention, causal or not, a mask of any accepted shape."""
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 6))
    cross = draw(st.booleans())
    S = draw(st.integers(1, 7)) if cross else T
    d_model, h = draw(st.sampled_from([(4, 1), (8, 2), (12, 3), (16, 4), (24, 6), (32, 8)]))
    causal = draw(st.booleans())
    mask_kind = draw(st.sampled_from(["none", "TS", "BTS", "B1TS", "1hTS", "BhTS"]))
    seed = draw(st.integers(0, 2**16))
    return B, T, S, d_model, h, cross, causal, mask_kind, seed


def make_problem(case, dtype=torch.float64):
    """Seeded module with nonzero biases, inputs and a mask with no fully masked row."""
    B, T, S, d_model, h, cross, causal, mask_kind, seed = case
    g = torch.Generator().manual_seed(seed)
    module = MultiHeadAttention(d_model, h, seed=seed, dtype=dtype)
    with torch.no_grad():  # nonzero biases, so a bias mix-up cannot hide
        for p in (module.q_proj.bias, module.k_proj.bias, module.v_proj.bias, module.out_proj.bias):
            p.copy_(torch.randn(d_model, generator=g, dtype=torch.float64))
    x = torch.randn(B, T, d_model, generator=g, dtype=torch.float64).to(dtype)
    ctx = torch.randn(B, S, d_model, generator=g, dtype=torch.float64).to(dtype) if cross else None
    shape = {"none": None, "TS": (T, S), "BTS": (B, T, S), "B1TS": (B, 1, T, S),
             "1hTS": (1, h, T, S), "BhTS": (B, h, T, S)}[mask_kind]
    mask = None
    if shape is not None:
        mask = torch.rand(shape, generator=g) < 0.6
        # key 0 always allowed: no fully masked row even with causal (s = 0 <= t), because
        # nn.MultiheadAttention returns NaN there (tested separately below)
        mask[..., 0] = True
    return module, x, ctx, causal, mask


def allowed_4d(case, mask) -> np.ndarray | None:
    """The combined boolean mask as a (B, h, T, S) numpy array, for the loop reference."""
    B, T, S, _, h, _, causal, _, _ = case
    allowed = np.ones((B, h, T, S), dtype=bool)
    if mask is not None:
        m = mask.numpy()
        allowed &= m.reshape({2: (1, 1, T, S), 3: (B, 1, T, S), 4: m.shape}[m.ndim])
    if causal:
        allowed &= causal_mask(T, S).numpy()
    return allowed




# ---- the contract -----------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=25, deadline=None)
@given(case=cases())
def test_float64_every_impl_matches_loop_reference(impl, case):
    module, x, ctx, causal, mask = make_problem(case)
    npm = module.to_numpy()
    want, _ = attention_loops(npm, x.numpy(), None if ctx is None else ctx.numpy(),
                              allowed_4d(case, mask))
    got = run_impl(impl, module, x, ctx, causal, mask)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


LOW = [(impl, dt) for dt in (torch.float32, torch.bfloat16) for impl in IMPLS
       if impl != "manual" and not (impl == "numpy" and dt == torch.bfloat16)]


@pytest.mark.parametrize(("impl", "dtype"), LOW, ids=[f"{i}-{str(d)[6:]}" for i, d in LOW])
@settings(max_examples=15, deadline=None)
@given(case=cases())
def test_low_precision_within_derived_tolerance(impl, dtype, case):
    module, x, ctx, causal, mask = make_problem(case, dtype)
    # golden: float64 on exactly the rounded weights and inputs the low-precision run sees
    golden_module = MultiHeadAttention.from_numpy(module.to_numpy(), dtype=torch.float64)
    golden = run_impl("manual", golden_module, x.double(), None if ctx is None else ctx.double(),
                      causal, mask)
    lp_ref = run_impl("manual", module, x, ctx, causal, mask)
    ref_err, allowed = derived_tolerance(golden, lp_ref, dtype)
    err = float(np.abs(run_impl(impl, module, x, ctx, causal, mask) - golden).max())
    assert err <= allowed, f"{impl} {dtype}: error {err:.3g} > {FUDGE} x manual's {ref_err:.3g}"


def test_derived_tolerances_are_tight_at_a_fixed_shape():
    """Pin the derived numbers at one realistic shape, so a loosened recipe shows up here."""
    case = (2, 16, 16, 64, 8, False, True, "BTS", 7)
    for dtype, lo, hi in ((torch.float32, 1e-8, 1e-5), (torch.bfloat16, 1e-3, 1e-1)):
        module, x, ctx, causal, mask = make_problem(case, dtype)
        golden = run_impl("manual", MultiHeadAttention.from_numpy(module.to_numpy(), dtype=torch.float64),
                          x.double(), None, causal, mask)
        ref_err, allowed = derived_tolerance(golden, run_impl("manual", module, x, ctx, causal, mask), dtype)
        assert lo < ref_err < hi and allowed < 10 * hi
        err = float(np.abs(run_impl("sdpa", module, x, ctx, causal, mask) - golden).max())
        assert err <= allowed


# ---- a flipped mask polarity must fail the checks -----------------------------------------------
def _self_attn_problem():
    return make_problem((2, 6, 6, 16, 4, False, False, "none", 11))


def test_flipped_polarity_to_nn_mha_breaks_parity():
    module, x, _, _, _ = _self_attn_problem()
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(0)) < 0.5
    mask[:, 0] = True
    mask[:, 1] = False  # so ~mask also leaves every row something to attend to
    want = run_impl("numpy", module, x, None, False, mask)
    np.testing.assert_allclose(run_impl("nn_mha", module, x, None, False, mask), want, atol=1e-12)
    ref = module.to_torch_mha()
    with torch.no_grad():  # the trap: hand nn.MultiheadAttention our True = may-attend mask
        wrong = ref(x, x, x, attn_mask=mask, need_weights=False)[0].numpy()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(wrong, want, atol=1e-6)


def test_flipped_polarity_is_caught_by_the_causality_check():
    module, x, _, _, _ = _self_attn_problem()
    T = x.shape[1]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # nn.MultiheadAttention's "causal": True = hide

    def ours(mask):  # our module, numpy in and out, as check_causal expects
        return lambda a: module(torch.from_numpy(a), mask=mask).detach().numpy()

    def theirs(mask):
        ref = module.to_torch_mha()
        return lambda a: ref(t := torch.from_numpy(a), t, t, attn_mask=mask,
                             need_weights=False)[0].detach().numpy()

    xn = x.numpy()
    checks.check_causal(ours(causal_mask(T)), xn, t=2)  # right polarity passes
    checks.check_causal(theirs(future), xn, t=2)
    with pytest.raises(AssertionError, match="causality broken"):
        checks.check_causal(ours(future), xn, t=2)  # nn.MHA's mask given to SDPA
    with pytest.raises(AssertionError, match="causality broken"):
        checks.check_causal(theirs(causal_mask(T)), xn, t=2)  # SDPA's mask given to nn.MHA


# ---- fully masked rows ---------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["numpy", "sdpa", "manual", "sdpa_fused"])
def test_fully_masked_row_gives_bias_only_output(impl):
    module, x, _, _, _ = _self_attn_problem()
    mask = torch.ones(2, 6, 6, dtype=torch.bool)
    mask[1, 4, :] = False  # query 4 of item 1 may attend to nothing
    out = run_impl(impl, module, x, None, True, mask)
    assert np.isfinite(out).all()
    # zero weights -> zero context -> the output is out_proj's bias alone
    np.testing.assert_allclose(out[1, 4], module.out_proj.bias.detach().numpy(), rtol=0, atol=1e-15)


def test_nn_mha_fast_path_gives_nan_on_fully_masked_rows():
    """Why the contract never draws a fully masked row: nn.MultiheadAttention's eval fast path returns NaN."""
    module, x, _, _, _ = _self_attn_problem()
    ref = module.to_torch_mha().eval()
    hide = torch.zeros(6, 6, dtype=torch.bool)
    hide[4] = True  # nn.MHA convention: row 4 masks every key
    with torch.no_grad():
        out = ref(x, x, x, attn_mask=hide, need_weights=True)[0]
    assert torch.isnan(out[:, 4]).all() and not torch.isnan(out[:, :4]).any()


def test_manual_path_gradients_are_finite_and_match_sdpa():
    module, x, _, _, _ = _self_attn_problem()
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[3] = False  # a fully masked row must not poison the gradients with NaN
    grads = {}
    for use_sdpa in (False, True):
        module.use_sdpa = use_sdpa
        module.zero_grad()
        xg = x.clone().requires_grad_()
        module(xg, causal=True, mask=mask).square().sum().backward()
        grads[use_sdpa] = (xg.grad.clone(), module.q_proj.weight.grad.clone())
    assert all(torch.isfinite(g).all() for g in grads[False])
    for a, b in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the module on the GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_module_within_derived_tolerance(dtype):
    module, x, _, _, mask = make_problem((2, 64, 64, 128, 4, False, True, "BTS", 3), dtype)
    golden_module = MultiHeadAttention.from_numpy(module.to_numpy(), dtype=torch.float64)
    gpu, xg = module.cuda(), x.cuda()
    for m in (mask, None):  # a boolean mask (no flash), then is_causal alone (flash may run)
        golden = run_impl("manual", golden_module, x.double(), None, True, m)
        with torch.no_grad():
            gpu.use_sdpa = False
            lp_ref = gpu(xg, causal=True, mask=m).double().cpu().numpy()
            gpu.use_sdpa = True
            got = gpu(xg, causal=True, mask=m).double().cpu().numpy()
        ref_err, allowed = derived_tolerance(golden, lp_ref, dtype)
        err = float(np.abs(got - golden).max())
        assert err <= allowed, f"{dtype} mask={m is not None}: {err:.3g} > {FUDGE} x {ref_err:.3g}"
