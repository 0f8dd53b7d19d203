"""mha_course.diagnose.backward names each planted backward bug, calls correct code correct, and names
nothing it can't tell.

Contracts:
  * check_step_backward and check_backward call correct, independent code correct (einsum, an
    explicit Jacobian, torch autograd);
  * every planted bug they can see is named, with its step, and a step bug only if it also
    explains the earlier cases; "no known mistake fits" (with the index) when none does;
  * student code that raises, returns None or the wrong shape is reported, not raised;
  * the verdicts do not lean on module state: a grader's refusing(grad, ...) cannot break them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mha.training import grad
from mha_course import diagnose, planted
from mha_course.diagnose import backward as diagnose_backward
from tests.reference import autograd_grads

STEP_BUGS = sorted(n for n, b in planted.BACKWARD_BUGS.items() if b.step != "backward")
MODULE_VISIBLE = sorted(n for n in planted.BACKWARD_BUGS if n != "mask_backward_skipped")


@pytest.fixture(scope="module")
def module():
    return diagnose_backward.default_module()


# ---- correct, independent code is called correct ------------------------------------------
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
    verdict = diagnose_backward.step_backward(name, INDEPENDENT[name])
    assert verdict.ok, verdict.message
    assert "matches the reference" in diagnose_backward.check_step_backward(name, INDEPENDENT[name], own=True)


def test_short_names_and_torch_outputs_are_accepted():
    assert diagnose_backward.step_backward("softmax", softmax_torch_out).ok


def test_autograd_backward_is_called_correct(module):
    verdict = diagnose_backward.backward_diagnosis(autograd_grads, module)
    assert verdict.ok, verdict.message
    assert diagnose_backward.check_backward(grad.backward).startswith("backward matches the reference on 4 cases")


# ---- the checks name every planted bug --------------------------------------------------------
@pytest.mark.parametrize("name", STEP_BUGS)
def test_check_step_backward_names_each_planted_bug(name):
    b = planted.BACKWARD_BUGS[name]
    verdict = diagnose_backward.step_backward(b.step, b.fn)
    assert not verdict.ok and verdict.bug == name, verdict.message
    assert verdict.message.startswith(f"{b.step} (step {b.number})"), verdict.message
    assert f"matches planted bug '{name}'" in verdict.message
    with pytest.raises(AssertionError, match=name):
        diagnose_backward.check_step_backward(b.step, b.fn)


@pytest.mark.parametrize("name", MODULE_VISIBLE)
def test_check_backward_names_each_planted_bug(module, name):
    verdict = diagnose_backward.backward_diagnosis(planted.backward_with(name), module)
    assert not verdict.ok and verdict.bug == name, verdict.message
    assert f"matches planted bug '{name}'" in verdict.message
    assert verdict.step == planted.BACKWARD_BUGS[name].number
    with pytest.raises(AssertionError, match=f"matches planted bug '{name}'"):
        diagnose_backward.check_backward(planted.backward_with(name), module)


def test_unknown_mistakes_are_not_given_a_name(module):
    def softmax_mean(dw, w):  # wrong, and like no planted bug
        return w * (dw - dw.mean(-1, keepdims=True))

    msg = diagnose_backward.step_backward("softmax_backward", softmax_mean).message
    assert "differs at index" in msg and "no known mistake fits" in msg, msg
    assert "planted" not in msg

    def off_by_a_bit(m, x, dout, **kw):
        g = grad.backward(m, x, dout, **kw)
        g.dWv = g.dWv + 1e-3 * np.eye(m.d_model)
        return g

    msg = diagnose_backward.backward_diagnosis(off_by_a_bit, module).message
    assert "wrong dWv; right dWo, dbo, dbv" in msg and "no known mistake fits" in msg, msg
    assert "at index (0, 0)" in msg or "at index (" in msg


def test_a_nan_in_a_fully_masked_row_gets_the_case_hint():
    def divides_by_row_sum(dw, w):  # right wherever a row has weight, NaN where it has none
        return w * (dw - (w * dw).sum(-1, keepdims=True) / w.sum(-1, keepdims=True))

    msg = diagnose_backward.step_backward("softmax_backward", divides_by_row_sum).message
    assert "yours nan, expected 0 (a NaN or inf where a number belongs)" in msg, msg
    assert "[case: a fully masked row (all its weights 0)]" in msg and "needs no division" in msg

    def jacobian_diagonal_only(dw, w):  # the Try it's likely slip: J = w * eye, no outer product
        J = w[..., :, None] * np.eye(w.shape[-1])
        return np.einsum("...ij,...i->...j", J, dw)

    assert diagnose_backward.step_backward("softmax", jacobian_diagonal_only).bug == "softmax_no_outer_product"


def test_student_code_problems_are_reported_not_raised(module):
    cases = {
        lambda dw, w: None: "returned None",
        lambda dw, w: (w, w): "returned 2 array(s); it must return 1",
        lambda dw, w: 1 / 0: "raised ZeroDivisionError",
        lambda dout, x, W: dout @ W.T: None,
    }
    for fn, want in list(cases.items())[:3]:
        assert want in diagnose_backward.step_backward("softmax_backward", fn).message

    def not_written(dw, w):
        raise NotImplementedError

    assert "not written yet" in diagnose_backward.step_backward("softmax_backward", not_written).message
    msg = diagnose_backward.step_backward("linear_backward", lambda dout, x, W: (dout @ W.T, dout)).message
    assert "returned 2 array(s); it must return 3 (dx, dW, db)" in msg, msg
    refused = diagnose_backward.step_backward("softmax_backward", grad.softmax_backward, own=True)
    assert not refused.ok and "write your own version" in refused.message
    assert "returned None" in diagnose_backward.backward_diagnosis(lambda *a, **k: None, module).message
    only_self = lambda m, x, dout, context=None, causal=False, mask=None: grad.backward(  # noqa: E731
        m, x, dout, causal=causal, mask=mask)
    msg = diagnose_backward.backward_diagnosis(only_self, module).message
    assert "cross-attention" in msg and "dcontext" in msg, msg


def test_shape_mistakes_are_named():
    def dW_transposed_any(dout, x, W):  # on the non-square case the shape gives it away
        dx, dW, db = grad.linear_backward(dout, x, W)
        return dx, dW.T, db

    msg = diagnose_backward.step_backward("linear_backward", dW_transposed_any).message
    assert "matches planted bug 'linear_dW_transposed'" in msg, msg

    def dW_shape_only(dout, x, W):
        dx, dW, db = grad.linear_backward(dout, x, W)
        return dx, (dW.T if W.shape[0] != W.shape[1] else dW), db

    msg = diagnose_backward.step_backward("linear_backward", dW_shape_only).message
    assert "should return dW of shape (12, 20), got (20, 12). It is transposed" in msg, msg

    def dk_no_transpose_fixed_for_square(ds, q, k):  # right when T == S, crashes when T != S
        if ds.shape[-1] == ds.shape[-2]:
            return grad.scaled_scores_backward(ds, q, k)
        return ds @ k / 4, ds @ q / 4

    msg = diagnose_backward.step_backward("scaled_scores_backward", dk_no_transpose_fixed_for_square).message
    assert "raised ValueError" in msg and "T != S" in msg and "dscores^T @ q" in msg, msg


def test_every_step_bug_has_evidence_and_every_step_a_bug():
    """_EVIDENCE covers the step bugs (whole-pass bugs say `wrong`), and each step has cases."""
    assert set(diagnose_backward._EVIDENCE) == set(STEP_BUGS)
    assert {b.step for b in planted.BACKWARD_BUGS.values()} - {"backward"} == set(diagnose_backward.STEPS)
    for name in diagnose_backward.STEPS:
        assert len(diagnose_backward.step_cases(name, np.random.default_rng(0))) >= 2, name


def test_the_verdicts_survive_a_grader_refusing_the_reference(module):
    """A5 wraps each check in diagnose.refusing(grad, ...): the references were bound at import."""
    parts = ("backward", "numerical_grads", *diagnose_backward.STEPS)
    with diagnose.refusing(grad, parts):
        with pytest.raises(AssertionError, match="reference's backward"):
            grad.backward(module, **diagnose_backward.backward_cases(module)[0][1])
        for name in ("linear_dW_transposed", "softmax_no_outer_product", "backward_ignores_mask",
                     "dx_query_path_only"):
            b = planted.BACKWARD_BUGS[name]
            assert diagnose_backward.backward_diagnosis(planted.backward_with(name), module).bug == name
            if b.step != "backward":
                assert diagnose_backward.step_backward(b.step, b.fn).bug == name
    assert diagnose_backward.backward_diagnosis(grad.backward, module).ok


def test_unknown_step_names_are_refused():
    with pytest.raises(ValueError, match="unknown step 'softmx'"):
        diagnose_backward.check_step_backward("softmx", softmax_jacobian)
    with pytest.raises(ValueError, match="unknown step 'softmx'"):
        diagnose_backward.step_cases("softmx", np.random.default_rng(0))


# ---- slips that are not planted bugs are named too --------------------------------------------
def _jacobian(w):
    return w[..., :, None] * np.eye(w.shape[-1]) - w[..., :, None] * w[..., None, :]  # (..., S, S)


SOFTMAX_SLIPS = {  # a student's softmax backward -> (the words its verdict must hold, looks like)
    "sign flipped": (lambda dw, w: np.einsum("...ij,...i->...j", -_jacobian(w), dw), "sign_flipped"),
    "w * w (elementwise)": (lambda dw, w: w * dw - w * w * dw, "w_times_w"),
    "0 everywhere": (lambda dw, w: np.einsum("...ij,...j->...j", _jacobian(w), dw),
                     "einsum_wrong_axis"),
    "summed over the whole array": (lambda dw, w: w * (dw - (w * dw).sum()), "sum_over_everything"),
    "factor w in front is missing": (lambda dw, w: dw - (w * dw).sum(-1, keepdims=True),
                                     "no_leading_w"),
}


@pytest.mark.parametrize("words", sorted(SOFTMAX_SLIPS))
def test_softmax_slips_outside_planted_are_named(words):
    fn, slip = SOFTMAX_SLIPS[words]
    verdict = diagnose_backward.step_backward("softmax_backward", fn)
    assert not verdict.ok and verdict.bug is None, verdict.message
    assert words in verdict.message and f"looks like: {slip}]" in verdict.message, verdict.message
    assert "no known mistake fits" not in verdict.message


def test_a_slip_is_named_only_if_it_explains_the_earlier_cases():
    """Right on the ordinary cases, then a slip's numbers: the slip would have failed them too."""
    def sign_flipped_late(dw, w):
        right = grad.softmax_backward(dw, w)
        return right if w.shape[-1] == 6 else -right  # ordinary and peaked right, causal flipped

    msg = diagnose_backward.step_backward("softmax_backward", sign_flipped_late).message
    assert "[case: causal weights" in msg and "no known mistake fits" in msg, msg
    assert "looks like" not in msg
    zeros_late = lambda dw, w: grad.softmax_backward(dw, w) if w.shape[-1] == 6 else 0 * w  # noqa: E731
    msg = diagnose_backward.step_backward("softmax_backward", zeros_late).message
    assert "no known mistake fits" in msg and "looks like" not in msg, msg


@pytest.mark.parametrize(("fn", "words"), [
    (lambda dw, w: w * (dw - (w * dw).sum(-1)), "Missing keepdims"),
    (lambda dw, w: (np.diag(w) - np.outer(w, w)) @ dw, "np.diag builds one (S, S) matrix"),
    (lambda dw, w: _jacobian(w) @ dw, "as a stack of (T, S) matrices"),
])
def test_errors_a_softmax_backward_raises_are_explained(fn, words):
    msg = diagnose_backward.step_backward("softmax_backward", fn).message
    assert "raised ValueError" in msg and words in msg, msg


def test_every_suggested_fix_runs_as_typed():
    """The fixes the messages suggest, typed as they read, give the reference gradient."""
    rng = np.random.default_rng(0)
    w = diagnose_backward._softmax(rng.normal(size=(2, 3, 4, 6)))
    g = rng.normal(size=w.shape)
    typed = w * (g - np.sum(w * g, axis=-1, keepdims=True))  # "w * (g - sum(w * g, axis=-1, keepdims=True))"
    np.testing.assert_allclose(typed, grad.softmax_backward(g, w), rtol=0, atol=1e-15)
    J = _jacobian(w)
    np.testing.assert_allclose((J @ g[..., :, None])[..., 0], typed, rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.einsum("...ij,...i->...j", J, g), typed, rtol=0, atol=1e-15)
    for said in (diagnose_backward._CASE_HINTS["a fully masked row (all its weights 0)"],
                 diagnose_backward._EVIDENCE["softmax_no_outer_product"]((w * g,), (typed,), (g, w))):
        assert "keepdims=True" in said, said
