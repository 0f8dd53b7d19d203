"""mha.training.grad: hand-derived gradients equal finite differences and torch autograd.

Contracts:
  * every step backward equals central finite differences (float64) and torch autograd of the
    same forward step, on numpy arrays and on torch tensors (one parametrised test);
  * the module backward equals finite differences (relative < 1e-6) and torch autograd on the
    same weights (relative < 1e-10), plain, causal, with a padding mask that fully masks rows,
    and for cross-attention with T != S;
  * both references can fail: every planted bug the module can show is far outside them;
  * backward takes its step backwards explicitly (a BackwardSteps); nothing is swapped;
  * bad input raises errors that name what was expected and what arrived, and leaves the
    module's weights as they were (finite differences restore every nudge).
The checks that name planted bugs are tested in test_diagnose_backward.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from mha import steps
from mha.attention import masks
from mha.attention.torch_attention import safe_softmax
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import merge_heads as torch_merge_heads
from mha.modules.torch_mha import split_heads as torch_split_heads
from mha.training import grad
from mha_course import planted
from mha_course.diagnose.backward import STEPS, backward_cases, default_module, step_cases
from tests.reference import autograd_grads

MODULE_VISIBLE = sorted(n for n in planted.BACKWARD_BUGS if n != "mask_backward_skipped")
CASES = [c for c, _ in backward_cases(default_module())]


@pytest.fixture(scope="module")
def module() -> MultiHeadAttention:
    return default_module()


def _kw(module, case: str) -> dict:
    return dict(backward_cases(module))[case]


# ---- each step: torch autograd of the forward step, on numpy and on torch inputs ---------------
def _torch_step(name: str, args: tuple):
    """(forward on leaf tensors, the leaves whose gradients the step backward returns)."""
    t = [torch.from_numpy(a).requires_grad_() if isinstance(a, np.ndarray) and a.dtype != bool
         else a for a in args]
    if name == "linear_backward":
        _, x, W = t
        b = torch.zeros(W.shape[1], dtype=torch.float64, requires_grad=True)
        return x @ W + b, (x, W, b)
    if name == "split_heads_backward":
        (s,) = t
        B, h, T, d_k = s.shape
        x = torch.zeros(B, T, h * d_k, dtype=torch.float64, requires_grad=True)
        return torch_split_heads(x, h), (x,)
    if name == "merge_heads_backward":
        _, h = t
        B, T, d = args[0].shape
        x = torch.zeros(B, h, T, d // h, dtype=torch.float64, requires_grad=True)
        return torch_merge_heads(x), (x,)
    if name == "scaled_scores_backward":
        _, q, k = t
        return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), (q, k)
    if name == "apply_mask_backward":
        _, allowed = t
        scores = torch.from_numpy(np.random.default_rng(0).normal(size=args[0].shape))
        scores.requires_grad_()
        return scores.masked_fill(~torch.from_numpy(allowed), float("-inf")), (scores,)
    if name == "softmax_backward":
        w = args[1]
        # the scores behind these weights: log w, with -inf where w == 0 (masked or dead rows)
        with np.errstate(divide="ignore"):
            scores = torch.from_numpy(np.log(w)).requires_grad_()
        return safe_softmax(scores), (scores,)
    if name == "weighted_sum_backward":
        _, w, v = t
        return w @ v, (w, v)
    raise AssertionError(name)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: tensors on the GPU")


@pytest.mark.parametrize("backend", ["numpy", "torch", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("name", sorted(STEPS))
def test_step_backward_equals_torch_autograd(name, backend):
    for case, args in step_cases(name, np.random.default_rng(5)):
        out, leaves = _torch_step(name, args)
        out.backward(torch.from_numpy(args[0]))
        want = [leaf.grad.numpy() for leaf in leaves]
        device = "cuda" if backend == "cuda" else "cpu"
        call = args if backend == "numpy" else tuple(
            torch.from_numpy(a).to(device) if isinstance(a, np.ndarray) and a.dtype != bool else a
            for a in args)
        got = getattr(grad, name)(*call)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(want), f"{name}: {len(got)} outputs, autograd has {len(want)}"
        for label, g, w in zip(STEPS[name][1], got, want, strict=True):
            if backend != "numpy":
                assert isinstance(g, torch.Tensor), f"{name} on tensors returned {type(g)}"
                assert g.device.type == device, f"{name} moved its result to {g.device}"
                g = g.cpu().numpy()
            assert not np.isnan(g).any(), f"{name} [{case}]: {label} has NaN"
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13, err_msg=f"{name} [{case}] {label}")


def _fd_step(name: str, args: tuple) -> list[np.ndarray]:
    """Finite-difference gradients of sum(step(inputs) * upstream) for what the backward returns."""
    g, rest = args[0], [a.copy() if isinstance(a, np.ndarray) else a for a in args[1:]]
    if name == "linear_backward":
        x, W = rest
        b = np.zeros(W.shape[1])
        f = lambda: float((steps.linear(x, W, b) * g).sum())  # noqa: E731
        return [grad.finite_difference(f, a) for a in (x, W, b)]
    if name == "scaled_scores_backward":
        q, k = rest
        f = lambda: float((steps.scaled_scores(q, k) * g).sum())  # noqa: E731
        return [grad.finite_difference(f, a) for a in (q, k)]
    if name == "softmax_backward":
        with np.errstate(divide="ignore"):
            scores = np.log(rest[0])  # -inf where the weight is 0
        f = lambda: float(np.nansum(steps.softmax(scores) * g))  # noqa: E731
        return [np.where(np.isfinite(scores), grad.finite_difference(f, scores), 0.0)]
    if name == "weighted_sum_backward":
        w, v = rest
        f = lambda: float((steps.weighted_sum(w, v) * g).sum())  # noqa: E731
        return [grad.finite_difference(f, a) for a in (w, v)]
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["linear_backward", "scaled_scores_backward", "softmax_backward",
                                  "weighted_sum_backward"])
def test_step_backward_equals_finite_differences(name):
    for case, args in step_cases(name, np.random.default_rng(6)):
        got = getattr(grad, name)(*args)
        got = got if isinstance(got, tuple) else (got,)
        for label, g, want in zip(STEPS[name][1], got, _fd_step(name, args), strict=True):
            assert grad.relative_error(g, want) < 1e-6, f"{name} [{case}] {label}"


# ---- the whole module -------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_backward_equals_finite_differences(module, case):
    kw = _kw(module, case)
    got, want = grad.backward(module, **kw), grad.numerical_grads(module, **kw)
    assert [n for n, _ in got.items()] == [n for n, _ in want.items()]
    out = module(kw["x"], context=kw.get("context"), causal=kw.get("causal", False),
                 mask=kw.get("mask"))
    noise = grad.fd_noise(out, kw["dout"])  # rounding of one central difference, per entry
    for name, g in got.items():
        w = getattr(want, name)
        if name == "dbk":  # exactly 0 in exact arithmetic: compare with the rounding it can have
            assert np.linalg.norm(w) <= noise * math.sqrt(w.size), f"fd dbk {np.abs(w).max():.3g}"
            assert np.abs(g).max() <= 1e-14 * np.abs(got.dWk).max(), f"dbk {np.abs(g).max():.3g}"
            continue
        err = grad.relative_error(g, w)
        assert err < 1e-6, f"[{case}] {name}: relative error {err:.3g} against finite differences"


@pytest.mark.parametrize("use_sdpa", [False, True], ids=["manual", "sdpa"])
@pytest.mark.parametrize("case", CASES)
def test_backward_equals_torch_autograd(module, case, use_sdpa):
    kw = _kw(module, case)
    got, want = grad.backward(module, **kw), autograd_grads(module, **kw, use_sdpa=use_sdpa)
    for name, g in got.items():
        w = getattr(want, name)
        assert np.isfinite(w).all(), f"torch autograd gave NaN for {name} [{case}]"
        if name == "dbk":
            assert np.abs(w).max() <= 1e-14 * np.abs(want.dWk).max()
            continue
        err = grad.relative_error(g, w)
        assert err < 1e-10, f"[{case}] {name}: relative error {err:.3g} against torch autograd"


def test_backward_on_a_wider_module_with_several_heads(rng):
    m = MultiHeadAttention(24, 4, seed=7)
    m.bq, m.bk, m.bv, m.bo = (rng.normal(size=24) for _ in range(4))
    x, ctx, dout = rng.normal(size=(3, 6, 24)), rng.normal(size=(3, 9, 24)), rng.normal(size=(3, 6, 24))
    mask = masks.padding_mask(np.array([6, 4, 1]), 6, 9, kv_lengths=np.array([9, 2, 5]))
    got, want = grad.backward(m, x, dout, ctx, mask=mask), autograd_grads(m, x, dout, ctx, mask=mask)
    for name, g in got.items():
        if name != "dbk":
            assert grad.relative_error(g, getattr(want, name)) < 1e-10, name


def test_finite_differences_and_autograd_catch_every_visible_planted_bug(module):
    """The two references above can fail: each planted bug is far outside their tolerances."""
    kw = _kw(module, "causal self-attention")
    fd, ag = grad.numerical_grads(module, **kw), autograd_grads(module, **kw)
    for name in MODULE_VISIBLE:
        wrong = planted.backward_with(name)(module, **kw)
        worst = max(grad.relative_error(g, getattr(fd, n)) for n, g in wrong.items() if n != "dbk")
        assert worst > 1e-2, f"{name}: finite differences would miss it (worst {worst:.3g})"
        worst = max(grad.relative_error(g, getattr(ag, n)) for n, g in wrong.items() if n != "dbk")
        assert worst > 1e-2, f"{name}: autograd comparison would miss it (worst {worst:.3g})"


def test_record_forward_is_the_module_forward_bit_for_bit(module):
    for case, kw in backward_cases(module):
        kw = {k: v for k, v in kw.items() if k != "dout"}
        tape = grad.record_forward(module, **kw)
        assert np.array_equal(tape.out, module(**kw)), case
        assert tape.weights.shape == (2, module.n_heads, 5, tape.k.shape[2])


def test_record_forward_uses_the_one_attention_core(module, monkeypatch):
    """Steps 3-6 of the recorded forward are numpy_attention.attention, not a copy of it."""
    calls = []
    core = grad.attention

    def spy(q, k, v, mask=None, bias=None):
        calls.append(mask)
        return core(q, k, v, mask=mask, bias=bias)

    monkeypatch.setattr(grad, "attention", spy)  # the test's own spy, undone by the fixture
    grad.record_forward(module, **{k: v for k, v in _kw(module, "causal self-attention").items()
                                   if k != "dout"})
    assert len(calls) == 1 and calls[0].shape[-2:] == (5, 5), calls  # (T, S), or (1, 1, T, S) from a MaskSpec


def test_backward_takes_its_step_backwards_explicitly(module):
    """A planted step is a BackwardSteps passed in; the module and REFERENCE_STEPS never change."""
    assert {f.name for f in dataclasses.fields(grad.BackwardSteps)} == set(STEPS)
    for f in dataclasses.fields(grad.BackwardSteps):  # the reference is the module's own functions
        assert getattr(grad.REFERENCE_STEPS, f.name) is getattr(grad, f.name), f.name
    kw = _kw(module, "causal self-attention")
    ref = grad.backward(module, **kw)
    wrong = dataclasses.replace(grad.REFERENCE_STEPS, softmax_backward=planted.softmax_no_outer_product)
    bad = grad.backward(module, **kw, steps=wrong)
    assert grad.relative_error(bad.dWq, ref.dWq) > 1e-2  # the planted step was used ...
    assert np.array_equal(bad.dWv, ref.dWv)  # ... and only where the softmax is on the path
    assert grad.softmax_backward is grad.REFERENCE_STEPS.softmax_backward  # nothing was swapped
    assert np.array_equal(grad.backward(module, **kw).dWq, ref.dWq)
    with pytest.raises(dataclasses.FrozenInstanceError):
        grad.REFERENCE_STEPS.softmax_backward = planted.softmax_no_outer_product
    with pytest.raises(TypeError, match="steps must be a grad.BackwardSteps.*got dict"):
        grad.backward(module, **kw, steps={"softmax_backward": planted.softmax_no_outer_product})


def test_fully_masked_rows_get_zero_gradient_not_nan():
    w = steps.softmax(np.full((1, 1, 2, 3), -np.inf))  # (B, h, T, S): nothing to attend to
    ds = grad.softmax_backward(np.ones((1, 1, 2, 3)), w)
    assert np.array_equal(ds, np.zeros_like(ds))
    rng = np.random.default_rng(0)
    w = steps.softmax(rng.normal(size=(2, 3, 4, 5)))
    rows = grad.softmax_backward(rng.normal(size=w.shape), w).sum(-1)  # shift invariance
    assert np.abs(rows).max() < 1e-15


def test_softmax_backward_is_the_jacobian_times_g():
    rng = np.random.default_rng(1)
    w = steps.softmax(rng.normal(size=(6,)))
    g = rng.normal(size=(6,))
    J = np.diag(w) - np.outer(w, w)  # (S, S): dw_i / ds_j
    np.testing.assert_allclose(grad.softmax_backward(g, w), J.T @ g, rtol=0, atol=1e-15)


def test_score_gradient_collapses_without_the_scale():
    med = {(d, s): float(np.median(grad.score_gradient_norms(d, s, n_rows=4096)))
           for d in (4, 512) for s in (True, False)}
    assert med[(512, False)] < med[(4, False)] / 100, med  # measured about 290x at 8192 rows
    assert 0.9 < med[(512, True)] / med[(4, True)] < 1.1, med
    # the query's gradient: without the scale most rows get almost nothing and a few a lot
    dq = {s: grad.score_gradient_norms(512, s, wrt="q", n_rows=4096) for s in (True, False)}
    assert dq[False].mean() / np.median(dq[False]) > 20
    assert dq[True].mean() / np.median(dq[True]) < 1.2
    with pytest.raises(ValueError, match="wrt must be 'scores' or 'q', got 'k'"):
        grad.score_gradient_norms(4, wrt="k")


# ---- check_gradient ---------------------------------------------------------------------------
def test_check_gradient_passes_and_names_what_the_numbers_show():
    rng = np.random.default_rng(3)
    e = rng.normal(size=(4, 4))
    assert grad.check_gradient("dWq", e + 1e-9, e).startswith("dWq: relative error")
    cases = {
        "transpose of the right gradient": e.T,
        "sqrt(d_k) = 4: the 1/sqrt(d_k) of the scores is missing": 4 * e,
        "1/sqrt(d_k) = 0.25": e / 4,
        "the sign is flipped": -e,
        "it is all zeros": np.zeros_like(e),
        "NaN or inf, first at index (1, 2)": np.where(np.arange(16).reshape(4, 4) == 6, np.nan, e),
        "1/10: a mean over 10 positions": e / 10,
    }
    for want, got in cases.items():
        with pytest.raises(AssertionError, match="dWq differs from the expected gradient") as info:
            grad.check_gradient("dWq", got, e, d_k=16)
        assert want in str(info.value), str(info.value)
        assert "It comes from steps 7 -> 3" in str(info.value)
    with pytest.raises(AssertionError, match=r"should have shape \(4, 3\), got \(3, 4\). It is transposed"):
        grad.check_gradient("dW", np.zeros((3, 4)), np.zeros((4, 3)))
    assert "allowed 1e-06 relative + 1e-08" in grad.check_gradient("dbk", np.full(3, 1e-9),
                                                                      np.zeros(3), atol=1e-8)
    with pytest.raises(AssertionError, match="no"):
        grad.check_gradient("dbk", np.full(3, 1e-3), np.zeros(3), atol=1e-8)


def test_finite_difference_restores_the_array_and_matches_a_known_derivative():
    a = np.array([[0.3, -1.2], [2.0, 0.5]])
    before = a.copy()
    d = grad.finite_difference(lambda: float(np.sin(a).sum()), a)
    assert np.array_equal(a, before)
    np.testing.assert_allclose(d, np.cos(a), rtol=0, atol=1e-9)


def test_finite_difference_restores_the_entry_when_f_raises():
    """Without the try/finally the nudged entry stays at old + eps after the error."""
    a = np.array([[0.3, -1.2], [2.0, 0.5]])
    before = a.copy()
    calls = []

    def f() -> float:
        calls.append(1)
        if len(calls) == 3:  # entry (0, 1), nudged up
            raise RuntimeError("the loss failed")
        return float(np.sin(a).sum())

    with pytest.raises(RuntimeError, match="the loss failed"):
        grad.finite_difference(f, a)
    assert a.tobytes() == before.tobytes(), a - before


def _weights(m: MultiHeadAttention) -> bytes:
    return b"".join(p.tobytes() for p in m.parameters())


def test_numerical_grads_with_a_wrong_dout_names_it_and_leaves_the_weights_alone(module):
    x, dout = _kw(module, "self-attention, no mask")["x"], np.ones((2, 4, module.d_model))
    before = _weights(module)
    with pytest.raises(ValueError, match=r"^dout must be \(B=2, T=5, d_model=8\), got \(2, 4, 8\)$"):
        grad.numerical_grads(module, x, dout)
    assert _weights(module) == before  # bit-identical: no weight was nudged, or all were restored
    with pytest.raises(TypeError, match="dout must be a floating-point array"):
        grad.numerical_grads(module, x, np.ones((2, 5, module.d_model), dtype=np.int64))
    assert _weights(module) == before


class _FailsOnThirdForward(MultiHeadAttention):
    """A module whose forward fails part-way through numerical_grads (say, interrupted)."""

    calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return super().forward(*args, **kwargs)


def test_numerical_grads_restores_the_weights_when_the_forward_raises(module):
    """The forward fails while Wq[0, 1] is nudged: the nudge must still be undone."""
    m = _FailsOnThirdForward(8, 2, seed=0)
    before = _weights(m)
    with pytest.raises(KeyboardInterrupt):
        grad.numerical_grads(m, **_kw(module, "self-attention, no mask"))
    assert _weights(m) == before
    with pytest.raises(ValueError, match=r"mask .*\(3, 3\)"):  # a bad mask fails before any nudge
        grad.numerical_grads(module, **_kw(module, "self-attention, no mask"),
                             mask=np.ones((3, 3), dtype=bool))


# ---- bad input --------------------------------------------------------------------------------
def test_bad_input_names_expected_and_got(module):
    rng = np.random.default_rng(0)
    n = rng.normal
    with pytest.raises(ValueError, match=r"dout must be \(2, 5, d_out=12\), got \(2, 5, 7\)"):
        grad.linear_backward(n(size=(2, 5, 7)), n(size=(2, 5, 12)), n(size=(12, 12)))
    with pytest.raises(ValueError, match=r"W must be \(d_in=12, d_out\), got \(10, 12\)"):
        grad.linear_backward(n(size=(2, 5, 12)), n(size=(2, 5, 12)), n(size=(10, 12)))
    with pytest.raises(ValueError, match=r"dweights must be \(B=2, h=3, T=4, S=5\), got \(2, 3, 4, 6\)"):
        grad.softmax_backward(n(size=(2, 3, 4, 6)), n(size=(2, 3, 4, 5)))
    with pytest.raises(ValueError, match=r"k must be \(B=2, h=3, S, d_k=16\), got \(2, 3, 5, 8\)"):
        grad.scaled_scores_backward(n(size=(2, 3, 5, 5)), n(size=(2, 3, 5, 16)), n(size=(2, 3, 5, 8)))
    with pytest.raises(ValueError, match=r"dscores must be \(B=2, h=3, T=5, S=7\), got \(2, 3, 5, 5\)"):
        grad.scaled_scores_backward(n(size=(2, 3, 5, 5)), n(size=(2, 3, 5, 16)), n(size=(2, 3, 7, 16)))
    with pytest.raises(ValueError, match=r"dheads must be \(B=2, h=3, T=5, d_k=4\), got \(2, 3, 5, 3\)"):
        grad.weighted_sum_backward(n(size=(2, 3, 5, 3)), n(size=(2, 3, 5, 7)), n(size=(2, 3, 7, 4)))
    with pytest.raises(ValueError, match="d_model=12 must be divisible by n_heads=5"):
        grad.merge_heads_backward(n(size=(2, 5, 12)), 5)
    with pytest.raises(ValueError, match=r"dsplit must be \(B, h, T, d_k\), got \(2, 5, 12\)"):
        grad.split_heads_backward(n(size=(2, 5, 12)))
    with pytest.raises(TypeError, match="allowed must be a boolean array, got dtype int64"):
        grad.apply_mask_backward(n(size=(2, 3, 5, 5)), np.tril(np.ones((5, 5), dtype=np.int64)))
    with pytest.raises(ValueError, match=r"allowed \(4, 4\) must broadcast to dscores \(2, 3, 5, 5\)"):
        grad.apply_mask_backward(n(size=(2, 3, 5, 5)), steps.causal_mask(4))
    x = n(size=(2, 5, module.d_model))
    with pytest.raises(ValueError, match=r"dout must be \(B=2, T=5, d_model=8\), got \(2, 4, 8\)"):
        grad.backward(module, x, n(size=(2, 4, module.d_model)))
    with pytest.raises(ValueError, match=r"x must be \(B, T, d_model=8\), got \(2, 5, 6\)"):
        grad.backward(module, n(size=(2, 5, 6)), x)
    for opts, said in ((dict(rope="half"), "rope='half'"), (dict(n_kv_heads=1), "n_kv_heads=1")):
        with pytest.raises(ValueError, match=f"plain multi-head attention; this module has {said}"):
            grad.backward(MultiHeadAttention(8, 2, **opts), x, x)
    with pytest.raises(TypeError, match="float64 numpy array to nudge, got float32"):
        grad.finite_difference(lambda: 0.0, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="eps must be a small positive number"):
        grad.finite_difference(lambda: 0.0, np.zeros(3), eps=0)
    with pytest.raises(TypeError, match="numerical_grads needs a float64 module, got float32"):
        grad.numerical_grads(MultiHeadAttention(8, 2, dtype=np.float32), x, x)
    with pytest.raises(ValueError, match=r"got \(3,\) and expected \(4,\) must have the same shape"):
        grad.relative_error(np.zeros(3), np.zeros(4))
