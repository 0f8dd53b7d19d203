"""The torch attention entry point: every backend equals an independent reference on the cases it
declares it can serve, refuses the rest by name, and the module hands SDPA no mask where none is needed."""

from __future__ import annotations

import math
import re
import unittest.mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha.attention import torch_attention
from mha.attention.masking import MaskSpec
from mha.attention.torch_attention import BACKENDS, attention
from mha.modules.torch_mha import MultiHeadAttention

EAGER_FLEX = "ignore:flex_attention called without torch.compile"
pytestmark = pytest.mark.filterwarnings(EAGER_FLEX)


def reference(q, k, v, allowed, bias) -> torch.Tensor:
    """Softmax attention in float64 written from the definition, not from the package's manual path."""
    g = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(g, dim=1) for t in (k, v))  # (B, h, S, d_k)
    s = q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, h, T, S)
    if bias is not None:
        s = s + bias.double()
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: all weights 0
    return w @ v  # (B, h, T, d_k)


@st.composite
def cases(draw):
    """q, k, v, a MaskSpec and maybe an ALiBi-like bias: one call some backends can serve."""
    B, h_kv, g = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    T, d_k = draw(st.integers(1, 20)), draw(st.sampled_from([16, 32]))
    kind = draw(st.sampled_from(["none", "causal", "decode", "window", "padding", "documents",
                                 "user"]))
    S = T if kind in ("documents", "window") else T + draw(st.integers(0, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(B, h_kv * g, T, d_k, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, h_kv, S, d_k, generator=gen, dtype=torch.float64) for _ in range(2))
    spec = {
        "none": lambda: MaskSpec.plain(T, S, like=q),
        "causal": lambda: MaskSpec.plain(T, S, causal=True, like=q,
                                         aligned=draw(st.sampled_from(["top_left", "bottom_right"]))),
        "decode": lambda: MaskSpec(torch.full((T,), S - 1), torch.arange(S), causal=True),
        "window": lambda: MaskSpec.plain(T, S, causal=True, like=q, window=draw(st.integers(1, 6))),
        "padding": lambda: MaskSpec(torch.arange(T) + S - T,
                                    torch.where(torch.arange(S) < draw(st.integers(0, S - 1)), -1,
                                                torch.arange(S)), causal=draw(st.booleans())),
        "documents": lambda: MaskSpec.packed(torch.tensor(_lengths(draw, T)),
                                             causal=draw(st.booleans())),
        "user": lambda: MaskSpec(torch.arange(T), torch.arange(S),
                                 user=torch.rand(B, 1, T, S, generator=gen) > 0.4),
    }[kind]()
    bias = None
    if draw(st.booleans()):
        slopes = torch.rand(1, h_kv * g, 1, 1, generator=gen, dtype=torch.float64)  # (1, h, 1, 1)
        bias = -slopes * (spec.q_pos[:, None] - spec.k_pos[None, :]).abs()  # (1, h, T, S)
    return q, k, v, spec, bias


def _lengths(draw, T: int) -> list[int]:
    """Document lengths summing to T."""
    cuts = sorted(draw(st.sets(st.integers(1, T - 1), max_size=3))) if T > 1 else []
    return [b - a for a, b in zip([0, *cuts], [*cuts, T], strict=True)]


def _tolerance(q: torch.Tensor, S: int) -> float:
    """float64: a few dozen roundings of values of size ~ sqrt(d_k) per score, growing with S."""
    return 64 * torch.finfo(q.dtype).eps * math.sqrt(q.shape[-1]) * max(S, 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_backend_that_serves_a_call_equals_the_reference_and_the_others_refuse(case):
    q, k, v, spec, bias = case
    want = reference(q, k, v, spec.dense(), bias)
    serving = BACKENDS.serving(torch_attention.call_needs(q, k, spec, bias))
    assert "manual" in serving and "sdpa" in serving  # the two general backends serve everything
    for name in BACKENDS.names():
        if name not in serving:
            with pytest.raises(ValueError, match=f"the torch backend '{name}' cannot serve"):
                attention(q, k, v, spec, bias, backend=name)
            continue
        got, weights = attention(q, k, v, spec, bias, backend=name)
        err = float((got - want).abs().max()) if got.numel() else 0.0
        assert err <= _tolerance(q, k.shape[2]), f"{name}: error {err:.3g}"
        assert (weights is not None) == (name == "manual")


@settings(max_examples=15, deadline=None)
@given(cases())
def test_a_boolean_tensor_mask_gives_what_its_spec_gives(case):
    q, k, v, spec, bias = case
    dense = spec.dense()
    for name in ("manual", "sdpa", "flex"):
        got, _ = attention(q, k, v, dense, bias, backend=name)
        want, _ = attention(q, k, v, spec, bias, backend=name)
        err = float((got - want).abs().max()) if got.numel() else 0.0
        assert err <= _tolerance(q, k.shape[2]), f"{name}: error {err:.3g}"


def test_a_wrong_lowering_is_caught():
    """The comparison can fail: a causal staircase one key off moves the output."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g, dtype=torch.float64) for _ in range(3))
    spec = MaskSpec.plain(8, 8, causal=True, like=q)
    shifted = torch.ones(8, 8, dtype=torch.bool).tril(1)  # one key too many
    got, _ = attention(q, k, v, spec, backend="sdpa")
    assert float((got - reference(q, k, v, shifted, None)).abs().max()) > 1e-3


def test_triton_runs_the_causal_staircase_with_its_offset():
    """Bottom-right causal (a chunk after a cache) goes to the kernel as causal with offset S - T."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 5, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 9, 16, generator=g, dtype=torch.float64) for _ in range(2))
    spec = MaskSpec.plain(5, 9, causal=True, like=q, aligned="bottom_right")
    assert spec.causal_offset() == 4
    got, _ = attention(q, k, v, spec, backend="triton", block_q=16, block_k=16)
    assert float((got - reference(q, k, v, spec.dense(), None)).abs().max()) < 1e-12


@pytest.mark.parametrize(("backend", "kwargs", "lacks"), [
    ("triton", {"mask": torch.ones(4, 6, dtype=torch.bool)}, "an arbitrary boolean mask"),
    ("triton", {"bias": torch.zeros(1, 2, 4, 6, dtype=torch.float64)}, "an additive bias"),
    ("triton", {"mask": MaskSpec.plain(4, 6, causal=True, window=2)}, "a sliding window"),
    ("triton", {"mask": MaskSpec.packed(torch.tensor([2, 2]), causal=False)}, "packed documents"),
    ("flex", {"dropout_p": 0.5}, "dropout on the weights"),
    ("sdpa", {"need_weights": True}, "the attention weights returned"),
])
def test_a_backend_refuses_what_it_lacks_and_names_who_can(backend, kwargs, lacks):
    q = torch.zeros(1, 2, 4, 16, dtype=torch.float64)
    k = torch.zeros(1, 2, 4 if isinstance(kwargs.get("mask"), MaskSpec) and kwargs["mask"].S == 4
                    else 6, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=re.escape(f"lacks {lacks}")) as err:
        attention(q, k, k, backend=backend, **kwargs)
    assert "backends that can: manual" in str(err.value)


def test_gradients_are_refused_by_the_backends_without_a_backward():
    q = torch.zeros(1, 2, 4, 16, requires_grad=True)
    for name in ("flex", "triton"):
        with pytest.raises(ValueError, match="lacks gradients"):
            attention(q, q, q, backend=name)
    attention(q, q, q, backend="sdpa")[0].sum().backward()  # sdpa and manual have one
    assert q.grad is not None


def test_grouped_heads_run_on_every_backend_and_must_divide_the_query_heads():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 6, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 6, 16, generator=g, dtype=torch.float64) for _ in range(2))
    want = reference(q, k, v, None, None)
    for name in BACKENDS.names():
        assert float((attention(q, k, v, backend=name)[0] - want).abs().max()) < 1e-12, name
    with pytest.raises(ValueError, match=r"h_kv that divides q's h=4 \(grouped-query attention\), got h_kv=3"):
        attention(q, *torch.zeros(2, 1, 3, 6, 16, dtype=torch.float64))


def test_bad_names_options_and_shapes_are_refused_clearly():
    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match=re.escape("backend must be one of ('manual', 'sdpa', "
                                                   "'flex', 'triton') for torch, got 'flash'")):
        attention(q, q, q, backend="flash")
    with pytest.raises(TypeError, match="the torch backend 'sdpa' takes the options "
                                        r"\('enable_gqa', 'dropout_p'\), got compile"):
        attention(q, q, q, backend="sdpa", compile=True)
    with pytest.raises(ValueError, match=re.escape("mask must be (T=4, S=4)")):
        attention(q, q, q, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="MaskSpec must describe T=4 queries and S=4 keys"):
        attention(q, q, q, MaskSpec.plain(4, 5))
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        attention(q.numpy(), q, q)
    with pytest.raises(ValueError, match="compiled FlexAttention takes"):
        attention(q.double(), q.double(), q.double(), backend="flex", compile=True)


# ---- the SDPA call the module makes ------------------------------------------------------------
def _sdpa_calls(run) -> list[dict]:
    """The keyword arguments of every F.scaled_dot_product_attention call `run()` makes."""
    with unittest.mock.patch.object(F, "scaled_dot_product_attention",
                                    wraps=F.scaled_dot_product_attention) as spy:
        run()
    return [c.kwargs for c in spy.call_args_list]


def test_the_module_gives_sdpa_is_causal_for_a_prefill_and_no_mask_for_a_decode_step():
    m = MultiHeadAttention(32, 4, seed=0, n_kv_heads=2)
    x = torch.randn(2, 10, 32)
    (prefill,) = _sdpa_calls(lambda: m(x, causal=True))
    assert prefill["attn_mask"] is None and prefill["is_causal"] is True
    cache = m.new_cache(2, 16)
    (cached,) = _sdpa_calls(lambda: m(x, causal=True, cache=cache))  # the prompt into a cache
    assert cached["attn_mask"] is None and cached["is_causal"] is True
    (decode,) = _sdpa_calls(lambda: m(x[:, :1], causal=True, cache=cache))
    assert decode["attn_mask"] is None and decode["is_causal"] is False
    (chunk,) = _sdpa_calls(lambda: m(x[:, :3], causal=True, cache=cache))  # bottom-right: a mask
    assert chunk["attn_mask"].shape[-2:] == (3, 14) and chunk["is_causal"] is False


def test_the_module_gives_sdpa_a_mask_only_where_one_is_needed():
    x = torch.randn(2, 10, 32)
    (window,) = _sdpa_calls(lambda: MultiHeadAttention(32, 4, window=3)(x, causal=True))
    assert window["attn_mask"].shape[-2:] == (10, 10) and window["is_causal"] is False
    pos = torch.tensor([[-1, -1, 0, 1, 2, 3, 4, 5, 6, 7], list(range(10))])  # a left-padded batch
    (padded,) = _sdpa_calls(lambda: MultiHeadAttention(32, 4)(x, causal=True, positions=pos))
    assert padded["attn_mask"].shape == (2, 1, 10, 10)


# ---- the module on every backend -----------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sdpa", "flex", "triton"])
def test_the_module_on_each_backend_equals_the_manual_module(backend):
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    m = MultiHeadAttention(32, 2, seed=3, dtype=torch.float64, backend="manual")
    with torch.no_grad():
        for causal in (False, True):
            want = m(x, causal=causal)
            got = m(x, causal=causal, backend=backend)  # per call; the module's stays manual
            assert float((got - want).abs().max()) < 1e-12
            assert m.backend == "manual" and (m.attn is None) == (backend != "manual")


def test_a_triton_module_refuses_what_its_kernel_lacks():
    with pytest.raises(ValueError, match=re.escape("lacks an additive bias (ALiBi)")):
        MultiHeadAttention(32, 2, alibi=True, backend="triton")
    m = MultiHeadAttention(32, 2, n_kv_heads=1, backend="triton")  # grouped heads: served
    with torch.no_grad(), pytest.raises(ValueError, match="lacks an arbitrary boolean mask"):
        m(torch.randn(1, 4, 32), mask=torch.ones(4, 4, dtype=torch.bool))


def test_flex_takes_alibi_as_a_score_mod_on_positions():
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    m = MultiHeadAttention(32, 4, seed=1, dtype=torch.float64, alibi=True, n_kv_heads=2, window=4)
    with torch.no_grad():
        want = m(x, causal=True, backend="manual")
        cache = m.new_cache(2, 9)
        got = torch.cat([m(x[:, a:b], causal=True, cache=cache, backend="flex")
                         for a, b in ((0, 5), (5, 6), (6, 9))], dim=1)
    assert float((got - want).abs().max()) < 1e-12


def test_use_sdpa_still_switches_between_sdpa_and_manual():
    m = MultiHeadAttention(16, 2)
    m.use_sdpa = False
    assert m.backend == "manual" and not m.use_sdpa
    m.use_sdpa = True
    assert m.backend == "sdpa"


# ---- Flex, compiled ----------------------------------------------------------------------------------
def test_compiled_flex_equals_eager_flex_on_the_cpu():
    """torch.compile(flex_attention) on the CPU (float32) gives what the eager reference gives."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=g) for _ in range(3))
    spec = MaskSpec.plain(128, 128, causal=True, like=q, window=40)
    slopes = torch.tensor([0.5, 0.25])
    mod = torch_attention.alibi_score_mod(slopes, spec.q_pos, spec.k_pos)
    eager, _ = attention(q, k, v, spec, backend="flex", compile=False, score_mod=mod)
    compiled, _ = attention(q, k, v, spec, backend="flex", compile=True, score_mod=mod)
    bias = -slopes[None, :, None, None] * (spec.q_pos[:, None] - spec.k_pos[None, :]).abs()
    want = reference(q, k, v, spec.dense(), bias)
    tol = 64 * torch.finfo(torch.float32).eps * math.sqrt(16) * 40  # float32, window keys
    assert float((compiled - eager).abs().max()) <= tol
    assert float((compiled.double() - want).abs().max()) <= tol
