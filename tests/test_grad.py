"""mha.grad: hand-derived gradients equal finite differences and torch autograd; checks name planted bugs.

Contracts:
  * every step backward equals central finite differences (float64) and torch autograd of the
    same forward step, on numpy arrays and on torch tensors (one parametrised test);
  * the module backward equals finite differences (relative < 1e-6) and torch autograd on the
    same weights (relative < 1e-10), plain, causal, with a padding mask that fully masks rows,
    and for cross-attention with T != S;
  * check_step_backward and check_backward call correct, independent code correct, name every
    planted bug they can see, and say "no known mistake fits" (with the index) when none does;
  * bad input raises errors that name what was expected and what arrived.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mha import grad, masks, steps
from mha.numpy_mha import MultiHeadAttention
from mha.torch_mha import MultiHeadAttention as TorchMHA
from mha.torch_mha import merge_heads as torch_merge_heads
from mha.torch_mha import safe_softmax
from mha.torch_mha import split_heads as torch_split_heads

STEP_BUGS = sorted(n for n, b in grad.BACKWARD_BUGS.items() if b.step != "backward")
MODULE_VISIBLE = sorted(n for n in grad.BACKWARD_BUGS if n != "mask_backward_skipped")
CASES = [c for c, _ in grad.backward_cases(grad.default_module())]


@pytest.fixture(scope="module")
def module() -> MultiHeadAttention:
    return grad.default_module()


def _kw(module, case: str) -> dict:
    return dict(grad.backward_cases(module))[case]


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
@pytest.mark.parametrize("name", sorted(grad.STEPS))
def test_step_backward_equals_torch_autograd(name, backend):
    for case, args in grad._step_cases(name, np.random.default_rng(5)):
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
        for label, g, w in zip(grad.STEPS[name][1], got, want, strict=True):
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
    for case, args in grad._step_cases(name, np.random.default_rng(6)):
        got = getattr(grad, name)(*args)
        got = got if isinstance(got, tuple) else (got,)
        for label, g, want in zip(grad.STEPS[name][1], got, _fd_step(name, args), strict=True):
            assert grad.relative_error(g, want) < 1e-6, f"{name} [{case}] {label}"


# ---- the whole module -------------------------------------------------------------------------
def _autograd(module, x, dout, context=None, causal=False, mask=None, use_sdpa=False) -> grad.Grads:
    """The same gradients from torch autograd on the module's weights (float64)."""
    tm = TorchMHA.from_numpy(module, dtype=torch.float64, use_sdpa=use_sdpa)
    xt = torch.from_numpy(x).requires_grad_()
    ct = None if context is None else torch.from_numpy(context).requires_grad_()
    tm(xt, context=ct, causal=causal, mask=mask).backward(torch.from_numpy(dout))
    W = {n: (getattr(tm, p).weight.grad.T.numpy(), getattr(tm, p).bias.grad.numpy())
         for n, p in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj"))}
    return grad.Grads(xt.grad.numpy(), *W["q"], *W["k"], *W["v"], *W["o"],
                      dcontext=None if ct is None else ct.grad.numpy())


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
    got, want = grad.backward(module, **kw), _autograd(module, **kw, use_sdpa=use_sdpa)
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
    got, want = grad.backward(m, x, dout, ctx, mask=mask), _autograd(m, x, dout, ctx, mask=mask)
    for name, g in got.items():
        if name != "dbk":
            assert grad.relative_error(g, getattr(want, name)) < 1e-10, name


def test_finite_differences_and_autograd_catch_every_visible_planted_bug(module):
    """The two references above can fail: each planted bug is far outside their tolerances."""
    kw = _kw(module, "causal self-attention")
    fd, ag = grad.numerical_grads(module, **kw), _autograd(module, **kw)
    for name in MODULE_VISIBLE:
        planted = grad.backward_with(name)(module, **kw)
        worst = max(grad.relative_error(g, getattr(fd, n)) for n, g in planted.items() if n != "dbk")
        assert worst > 1e-2, f"{name}: finite differences would miss it (worst {worst:.3g})"
        worst = max(grad.relative_error(g, getattr(ag, n)) for n, g in planted.items() if n != "dbk")
        assert worst > 1e-2, f"{name}: autograd comparison would miss it (worst {worst:.3g})"


def test_record_forward_is_the_module_forward_bit_for_bit(module):
    for case, kw in grad.backward_cases(module):
        kw = {k: v for k, v in kw.items() if k != "dout"}
        tape = grad.record_forward(module, **kw)
        assert np.array_equal(tape.out, module(**kw)), case
        assert tape.weights.shape == (2, module.n_heads, 5, tape.k.shape[2])


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


# ---- the checks: correct independent code is correct ------------------------------------------
def linear_einsum(dout, x, W):
    return (np.einsum("bto,io->bti", dout, W), np.einsum("bti,bto->io", x, dout),
            np.einsum("bto->o", dout))


def split_einsum(d):
    B, h, T, d_k = d.shape
    return np.einsum("bhtk->bthk", d).reshape(B, T, h * d_k)


def merge_loop(d, n_heads):
    return np.stack(np.split(d, n_heads, axis=-1), axis=1)  # (B, h, T, d_k)


def scores_einsum(ds, q, k):
    s = math.sqrt(q.shape[-1])
    return np.einsum("bhts,bhsd->bhtd", ds, k) / s, np.einsum("bhts,bhtd->bhsd", ds, q) / s


def mask_multiply(ds, allowed):
    return np.where(np.broadcast_to(allowed, ds.shape), ds, 0.0)


def softmax_jacobian(dw, w):
    S = w.shape[-1]
    J = w[..., :, None] * np.eye(S) - w[..., :, None] * w[..., None, :]  # (..., S, S)
    return np.einsum("...ij,...i->...j", J, dw)


def weighted_einsum(dh, w, v):
    return np.einsum("bhtd,bhsd->bhts", dh, v), np.einsum("bhts,bhtd->bhsd", w, dh)


def softmax_torch_out(dw, w):  # a student working in torch: tensors back are fine
    wt, gt = torch.from_numpy(w), torch.from_numpy(dw)
    return wt * (gt - (wt * gt).sum(-1, keepdim=True))


INDEPENDENT = {"linear_backward": linear_einsum, "split_heads_backward": split_einsum,
               "merge_heads_backward": merge_loop, "scaled_scores_backward": scores_einsum,
               "apply_mask_backward": mask_multiply, "softmax_backward": softmax_jacobian,
               "weighted_sum_backward": weighted_einsum}


@pytest.mark.parametrize("name", sorted(INDEPENDENT))
def test_independent_step_backward_is_called_correct(name):
    verdict = grad.step_backward(name, INDEPENDENT[name])
    assert verdict.ok, verdict.message
    assert "matches the reference" in grad.check_step_backward(name, INDEPENDENT[name], own=True)


def test_short_names_and_torch_outputs_are_accepted():
    assert grad.step_backward("softmax", softmax_torch_out).ok


def test_autograd_backward_is_called_correct(module):
    verdict = grad.backward_diagnosis(_autograd, module)
    assert verdict.ok, verdict.message
    assert grad.check_backward(grad.backward).startswith("backward matches the reference on 4 cases")


# ---- the checks name every planted bug --------------------------------------------------------
@pytest.mark.parametrize("name", STEP_BUGS)
def test_check_step_backward_names_each_planted_bug(name):
    b = grad.BACKWARD_BUGS[name]
    verdict = grad.step_backward(b.step, b.fn)
    assert not verdict.ok and verdict.bug == name, verdict.message
    assert verdict.message.startswith(f"{b.step} (step {b.number})"), verdict.message
    assert f"matches planted bug '{name}'" in verdict.message
    with pytest.raises(AssertionError, match=name):
        grad.check_step_backward(b.step, b.fn)


@pytest.mark.parametrize("name", MODULE_VISIBLE)
def test_check_backward_names_each_planted_bug(module, name):
    verdict = grad.backward_diagnosis(grad.backward_with(name), module)
    assert not verdict.ok and verdict.bug == name, verdict.message
    assert f"matches planted bug '{name}'" in verdict.message
    assert verdict.step == grad.BACKWARD_BUGS[name].number
    with pytest.raises(AssertionError, match=f"matches planted bug '{name}'"):
        grad.check_backward(grad.backward_with(name), module)


def test_a_skipped_mask_backward_cannot_be_seen_from_the_module(module):
    """softmax_backward already gives 0 where w = 0, so only the step check can see it."""
    for _, kw in grad.backward_cases(module):
        with grad.bug("mask_backward_skipped"):
            planted = grad.backward(module, **kw)
        ref = grad.backward(module, **kw)
        assert all(np.array_equal(g, getattr(ref, n)) for n, g in planted.items())
    assert grad.step_backward("apply_mask", grad.mask_backward_skipped).bug == "mask_backward_skipped"


def test_bug_context_restores_the_reference_even_after_an_error(module):
    kw = _kw(module, "causal self-attention")
    with pytest.raises(RuntimeError), grad.bug("softmax_no_outer_product"):
        assert grad.softmax_backward is grad.softmax_no_outer_product
        raise RuntimeError("boom")
    assert grad.softmax_backward is grad._REAL["softmax_backward"]
    assert grad.backward_diagnosis(grad.backward, module).ok
    with pytest.raises(ValueError, match="backward_with"):
        with grad.bug("dx_query_path_only"):
            pass
    with pytest.raises(ValueError, match="unknown planted bug"):
        grad.backward_with("softmax_typo")
    assert grad.backward(module, **kw).dx.shape == (2, 5, module.d_model)


def test_unknown_mistakes_are_not_given_a_name(module):
    def softmax_mean(dw, w):  # wrong, and like no planted bug
        return w * (dw - dw.mean(-1, keepdims=True))

    msg = grad.step_backward("softmax_backward", softmax_mean).message
    assert "differs at index" in msg and "no known mistake fits" in msg, msg
    assert "planted" not in msg

    def off_by_a_bit(m, x, dout, **kw):
        g = grad.backward(m, x, dout, **kw)
        g.dWv = g.dWv + 1e-3 * np.eye(m.d_model)
        return g

    msg = grad.backward_diagnosis(off_by_a_bit, module).message
    assert "wrong dWv; right dWo, dbo, dbv" in msg and "no known mistake fits" in msg, msg
    assert "at index (0, 0)" in msg or "at index (" in msg


def test_a_nan_in_a_fully_masked_row_gets_the_case_hint():
    def divides_by_row_sum(dw, w):  # right wherever a row has weight, NaN where it has none
        return w * (dw - (w * dw).sum(-1, keepdims=True) / w.sum(-1, keepdims=True))

    msg = grad.step_backward("softmax_backward", divides_by_row_sum).message
    assert "yours nan, expected 0 (a NaN or inf where a number belongs)" in msg, msg
    assert "[case: a fully masked row (all its weights 0)]" in msg and "needs no division" in msg

    def jacobian_diagonal_only(dw, w):  # the Try it's likely slip: J = w * eye, no outer product
        J = w[..., :, None] * np.eye(w.shape[-1])
        return np.einsum("...ij,...i->...j", J, dw)

    assert grad.step_backward("softmax", jacobian_diagonal_only).bug == "softmax_no_outer_product"


def test_student_code_problems_are_reported_not_raised(module):
    cases = {
        lambda dw, w: None: "returned None",
        lambda dw, w: (w, w): "returned 2 array(s); it must return 1",
        lambda dw, w: 1 / 0: "raised ZeroDivisionError",
        lambda dout, x, W: dout @ W.T: None,
    }
    for fn, want in list(cases.items())[:3]:
        assert want in grad.step_backward("softmax_backward", fn).message

    def not_written(dw, w):
        raise NotImplementedError

    assert "not written yet" in grad.step_backward("softmax_backward", not_written).message
    msg = grad.step_backward("linear_backward", lambda dout, x, W: (dout @ W.T, dout)).message
    assert "returned 2 array(s); it must return 3 (dx, dW, db)" in msg, msg
    refused = grad.step_backward("softmax_backward", grad.softmax_backward, own=True)
    assert not refused.ok and "write your own version" in refused.message
    assert "returned None" in grad.backward_diagnosis(lambda *a, **k: None, module).message
    only_self = lambda m, x, dout, context=None, causal=False, mask=None: grad.backward(  # noqa: E731
        m, x, dout, causal=causal, mask=mask)
    msg = grad.backward_diagnosis(only_self, module).message
    assert "cross-attention" in msg and "dcontext" in msg, msg


def test_shape_mistakes_are_named():
    def dW_transposed_any(dout, x, W):  # on the non-square case the shape gives it away
        dx, dW, db = grad.linear_backward(dout, x, W)
        return dx, dW.T, db

    msg = grad.step_backward("linear_backward", dW_transposed_any).message
    assert "matches planted bug 'linear_dW_transposed'" in msg, msg

    def dW_shape_only(dout, x, W):
        dx, dW, db = grad.linear_backward(dout, x, W)
        return dx, (dW.T if W.shape[0] != W.shape[1] else dW), db

    msg = grad.step_backward("linear_backward", dW_shape_only).message
    assert "should return dW of shape (12, 20), got (20, 12). It is transposed" in msg, msg

    def dk_no_transpose_fixed_for_square(ds, q, k):  # right when T == S, crashes when T != S
        if ds.shape[-1] == ds.shape[-2]:
            return grad.scaled_scores_backward(ds, q, k)
        return ds @ k / 4, ds @ q / 4

    msg = grad.step_backward("scaled_scores_backward", dk_no_transpose_fixed_for_square).message
    assert "raised ValueError" in msg and "T != S" in msg and "dscores^T @ q" in msg, msg


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
    with pytest.raises(TypeError, match="float64 numpy array to nudge, got float32"):
        grad.finite_difference(lambda: 0.0, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="eps must be a small positive number"):
        grad.finite_difference(lambda: 0.0, np.zeros(3), eps=0)
    with pytest.raises(TypeError, match="numerical_grads needs a float64 module, got float32"):
        grad.numerical_grads(MultiHeadAttention(8, 2, dtype=np.float32), x, x)
    with pytest.raises(ValueError, match="unknown step 'softmx'"):
        grad.check_step_backward("softmx", softmax_jacobian)
    with pytest.raises(ValueError, match=r"got \(3,\) and expected \(4,\) must have the same shape"):
        grad.relative_error(np.zeros(3), np.zeros(4))
