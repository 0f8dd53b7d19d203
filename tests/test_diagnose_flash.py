"""mha_course.diagnose.flash names each usual FlashAttention mistake, calls correct code correct, and names
nothing it can't tell.

Contracts:
  * correct code in several styles passes every check (the package's own kernels wrapped to the
    assignment's signatures, in-place updates, every tile computed, bytes as a float);
  * each mistake A8's hidden tests name is named, by value: the online update, the tiled forward,
    the tiled backward (their planted versions) and the bytes (each usual slip);
  * student code that raises, returns None or the wrong shape is reported, not raised;
  * the forward runs with the reference update: a wrong update does not fail it, a missing one is
    put in with a note, and a forward that never calls it is told so;
  * the verdicts do not lean on module state: a grader's refusing(flash, ...) cannot break them.
"""

from __future__ import annotations

import numpy as np
import pytest

from mha.attention import flash
from mha.perf import traffic
from mha_course import diagnose
from mha_course.diagnose import flash as df


# ---- part 1: the online update -------------------------------------------------------------------
def update_in_place(m, ell, acc, scores, v_block):
    """Another right style: flash._update's in-place arithmetic, written out."""
    m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))
    base = np.where(np.isfinite(m_new), m_new, 0.0)
    np.exp(np.subtract(scores, base, out=scores), out=scores)
    alpha = np.exp(m - base)
    acc *= alpha
    acc += scores @ v_block
    return m_new, alpha * ell + scores.sum(axis=-1, keepdims=True), acc


@pytest.mark.parametrize("fn", [df.reference_online_update, update_in_place])
def test_correct_updates_pass(fn):
    d = df.update_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(df.UPDATE_MISTAKES))
def test_each_planted_update_is_named(name):
    d = df.update_diagnosis(df.UPDATE_MISTAKES[name][0])
    assert not d.ok and d.bug == name, d.message


@pytest.mark.parametrize("wrong, words", [
    (lambda m, ell, acc, s, v: None, "returned None"),
    (lambda m, ell, acc, s, v: (m, ell), "must return 3 things"),
    (lambda m, ell, acc, s, v: (m[..., 0], ell, acc), "keep the last axis"),
    (lambda m, ell, acc, s, v: 1 / 0, "raised ZeroDivisionError"),
])
def test_broken_updates_are_reported_not_raised(wrong, words):
    d = df.update_diagnosis(wrong)
    assert not d.ok and words in d.message, d.message


def test_an_unwritten_part_says_so():
    def todo(*args):
        raise NotImplementedError()
    for diagnosis in (df.update_diagnosis, df.backward_diagnosis, df.bytes_diagnosis):
        d = diagnosis(todo)
        assert not d.ok and "not written yet" in d.message, d.message


# ---- part 2: the tiled forward -------------------------------------------------------------------
def package_forward(q, k, v, causal=False, block_q=16, block_k=16, offset=0):
    return flash.flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, offset=offset)


def forward_from_update(q, k, v, causal=False, block_q=16, block_k=16, offset=0):
    """A right forward that calls online_update from its namespace (as a student's does)."""
    B, h, T, d_k = q.shape
    S = k.shape[2]
    out, lse = np.zeros_like(q), np.full((B, h, T), -np.inf)
    for t0 in range(0, T, block_q):
        t1 = min(t0 + block_q, T)
        m = np.full((B, h, t1 - t0, 1), -np.inf)
        ell, acc = np.zeros_like(m), np.zeros((B, h, t1 - t0, d_k))
        for s0 in range(0, S, block_k):
            s1 = min(s0 + block_k, S)
            scores = q[:, :, t0:t1] @ k[:, :, s0:s1].swapaxes(-1, -2) / np.sqrt(d_k)
            if causal:
                scores = np.where(np.arange(s0, s1)[None, :] <= np.arange(t0, t1)[:, None] + offset,
                                  scores, -np.inf)
            m, ell, acc = NS["online_update"](m, ell, acc, scores, v[:, :, s0:s1])
        out[:, :, t0:t1] = np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)
        with np.errstate(divide="ignore"):
            lse[:, :, t0:t1] = (m + np.log(ell))[..., 0]
    return out, lse


NS: dict = {}


@pytest.mark.parametrize("fn", [package_forward, df.planted_forward(), df.planted_forward(skip=False)])
def test_correct_forwards_pass(fn):
    d = df.forward_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(df.FORWARD_MISTAKES))
def test_each_planted_forward_is_named(name):
    d = df.forward_diagnosis(df.FORWARD_MISTAKES[name][0])
    assert not d.ok and d.bug == name, d.message


def test_the_forward_runs_with_the_reference_update():
    NS.clear()
    NS["online_update"] = df.UPDATE_MISTAKES["no_rescale"][0]  # wrong: swapped out while graded
    d = df.forward_diagnosis(forward_from_update, NS)
    assert d.ok, d.message
    assert NS["online_update"] is df.UPDATE_MISTAKES["no_rescale"][0], "the student's update is put back"


def test_a_missing_update_is_put_in_with_a_note(capsys):
    NS.clear()
    d = df.forward_diagnosis(forward_from_update, NS)
    assert d.ok, d.message
    assert "online_update is not defined" in capsys.readouterr().out
    assert "online_update" not in NS


def test_a_forward_that_never_calls_the_update_is_told_so():
    d = df.forward_diagnosis(package_forward, {"online_update": df.reference_online_update})
    assert not d.ok and d.bug == "no_update_calls" and "never called online_update" in d.message


def test_a_forward_with_the_wrong_shape_is_reported():
    d = df.forward_diagnosis(lambda q, k, v, *a: (q[..., :1], q[..., 0]))
    assert not d.ok and "returned out of shape" in d.message, d.message


# ---- part 3: the tiled backward ------------------------------------------------------------------
def package_backward(q, k, v, out, lse, dout, causal=False, block_q=16, block_k=16, offset=0):
    return flash.flash_attention_backward(q, k, v, out, lse, dout, causal=causal, block_q=block_q,
                                          block_k=block_k, offset=offset)


@pytest.mark.parametrize("fn", [package_backward, df.planted_backward()])
def test_correct_backwards_pass(fn):
    d = df.backward_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(df.BACKWARD_MISTAKES))
def test_each_planted_backward_is_named(name):
    d = df.backward_diagnosis(df.BACKWARD_MISTAKES[name][0])
    assert not d.ok and d.bug == name, d.message


def test_the_reference_gradients_match_finite_differences():
    """The verdicts' own reference is right: one direction, central differences."""
    case = df.BACKWARD_CASES[0]
    (q, k, v, out, lse, dout, causal, *_), (dq, dk, dv) = df.backward_inputs(case)
    rng = np.random.default_rng(0)
    dirs = [rng.standard_normal(x.shape) for x in (q, k, v)]
    eps = 1e-6

    def loss(qq, kk, vv):
        return float((df._attend(qq, kk, vv, case.allowed)[0] * dout).sum())
    fd = (loss(q + eps * dirs[0], k + eps * dirs[1], v + eps * dirs[2])
          - loss(q - eps * dirs[0], k - eps * dirs[1], v - eps * dirs[2])) / (2 * eps)
    analytic = sum(float((g * e).sum()) for g, e in zip((dq, dk, dv), dirs, strict=True))
    assert abs(fd - analytic) < 1e-6 * max(1.0, abs(fd))


# ---- part 4: the bytes ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda T, S, d, i: traffic.forward_math(1, 1, T, S, d, i).bytes,
    lambda T, S, d, i: float(i * (2 * T * d + 2 * S * d + 4 * T * S)),
    lambda T, S, d, i: np.int64(i) * (2 * T * d + 2 * S * d + 4 * T * S),
])
def test_correct_bytes_pass(fn):
    d = df.bytes_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(df._byte_slips(3, 5, 7, 8)))
def test_each_byte_slip_is_named(name):
    d = df.bytes_diagnosis(lambda T, S, dd, i: df._byte_slips(T, S, dd, i)[name][0])
    assert not d.ok and d.bug == name, d.message


def test_bytes_that_are_not_a_number_are_reported():
    d = df.bytes_diagnosis(lambda *a: "many")
    assert not d.ok and "one number of bytes" in d.message, d.message


# ---- independence from module state ---------------------------------------------------------------
def test_a_refused_flash_module_does_not_break_the_verdicts():
    with diagnose.refusing(flash, ("_update", "flash_attention", "flash_attention_backward")):
        assert df.update_diagnosis(df.reference_online_update).ok
        assert df.forward_diagnosis(df.planted_forward()).ok
        assert df.backward_diagnosis(df.planted_backward()).ok
