"""mha_course.diagnose names each planted bug, calls correct code correct, and names nothing it can't tell."""

import math

import numpy as np
import pytest
import torch

from mha import steps
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import MultiHeadAttention as TorchMHA
from mha_course import diagnose, planted

BUGS = sorted(planted.CATALOGUE)


@pytest.fixture(scope="module")
def module():
    return MultiHeadAttention(16, 4, seed=0)


# Correct code, written differently from mha.steps, is called correct --------------------------
def split_einsum(x, n_heads):
    B, T, d = x.shape
    return np.einsum("bthk->bhtk", x.reshape(B, T, n_heads, d // n_heads))


def merge_loop(x):
    return np.concatenate([x[:, j] for j in range(x.shape[1])], axis=-1)  # heads side by side


def scores_einsum(q, k):
    return np.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(q.shape[-1])


def mask_compare(T, S=None):
    S = T if S is None else S
    return np.arange(S)[None, :] <= np.arange(T)[:, None]


def softmax_logsumexp(scores):
    m = np.max(scores, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(scores - m)
    s = e.sum(-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


ALTERNATIVES = {"split_heads": split_einsum, "merge_heads": merge_loop,
                "scaled_scores": scores_einsum, "causal_mask": mask_compare,
                "softmax": softmax_logsumexp, "linear": lambda x, W, b: np.einsum("...i,io->...o", x, W) + b,
                "weighted_sum": lambda w, v: np.einsum("bhts,bhsd->bhtd", w, v)}


@pytest.mark.parametrize("name", sorted(diagnose.STEPS))
def test_the_reference_steps_are_correct(name):
    d = diagnose.step(name, getattr(steps, name))
    assert d.ok and d.bug is None, d.message
    assert d.check().startswith(f"{name} (step {diagnose.STEPS[name]}) matches the reference")


@pytest.mark.parametrize("name", sorted(ALTERNATIVES))
def test_independent_correct_code_is_called_correct(name):
    d = diagnose.step(name, ALTERNATIVES[name])
    assert d.ok, d.message


def test_a_correct_forward_is_correct_in_numpy_and_torch(module):
    assert diagnose.forward(lambda x: module(x, causal=True), module).ok
    t64 = TorchMHA.from_numpy(module)
    assert diagnose.forward(lambda x: t64(torch.from_numpy(x), causal=True), module).ok
    t32 = TorchMHA.from_numpy(module, dtype=torch.float32)  # float32: looser derived tolerance
    assert diagnose.forward(lambda x: t32(torch.from_numpy(x).float(), causal=True), module).ok
    assert diagnose.forward(t64, module, causal=False).ok  # an nn.Module is fed a tensor


def test_a_correct_pipeline_is_correct(module):
    d = diagnose.pipeline(ALTERNATIVES, module)
    assert d.ok, d.message


# Each planted bug is named, at the step and through the whole module ----------------------------
@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_step_is_named(bug):
    b = planted.CATALOGUE[bug]
    d = diagnose.step(b.step, b.fn)
    assert not d.ok and d.bug == bug and d.step == b.number, d.message
    assert f"matches planted bug '{bug}'" in d.message
    with pytest.raises(AssertionError, match=f"planted bug '{bug}'"):
        diagnose.check_step(b.step, b.fn)


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_module_is_named_with_its_step(module, bug):
    b = planted.CATALOGUE[bug]
    d = diagnose.forward(planted.forward_with(module, bug, causal=True), module)
    assert not d.ok and d.bug == bug and d.step == b.number, d.message
    assert f"a bug at step {b.number}" in d.message


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_step_is_found_first_in_the_pipeline(module, bug):
    b = planted.CATALOGUE[bug]
    fns = dict(ALTERNATIVES, **{b.step: b.fn})
    d = diagnose.pipeline(fns, module)
    assert d.bug == bug and d.step == b.number, d.message


def test_the_messages_the_issue_asks_for():
    d = diagnose.step("masked_softmax", planted.mask_after_softmax)
    assert "rows sum to" in d.message and "not 1: did you zero the weights after softmax " \
        "instead of masking the scores with -inf before it?" in d.message
    d = diagnose.step("merge_heads", planted.merge_no_transpose)
    assert "right shape (2, 5, 12), wrong values after merging: did you reshape " \
           "(B, h, T, d_k) without transposing back first?" in d.message
    d = diagnose.step("scaled_scores", planted.scores_unscaled)
    assert "4 times too large, and sqrt(d_k) = 4" in d.message  # d_k = 16 in that case


def test_messages_print_plain_numbers(module):
    msgs = [diagnose.step(b.step, b.fn).message for b in planted.CATALOGUE.values()]
    msgs.append(diagnose.step("softmax", lambda s: 0.9 * steps.softmax(s)).message)
    assert not any("np.float" in m or "np.int" in m for m in msgs)


# Wrong code that is none of the planted bugs gets no name --------------------------------------
UNRELATED = {
    "softmax": lambda s: 0.9 * steps.softmax(s),
    "scaled_scores": lambda q, k: steps.scaled_scores(q, k) + 1.0,
    "split_heads": lambda x, h: steps.split_heads(x, h)[:, ::-1],  # heads in reverse order
    "merge_heads": lambda x: steps.merge_heads(x[:, ::-1]),
    "causal_mask": lambda T, S=None: np.ones((T, T if S is None else S), dtype=bool),  # no mask
    "weighted_sum": lambda w, v: w @ v[..., ::-1, :],
    "linear": lambda x, W, b: x @ W,  # forgot the bias
}


@pytest.mark.parametrize("name", sorted(UNRELATED))
def test_unrelated_wrong_code_gets_the_step_and_no_name(name):
    d = diagnose.step(name, UNRELATED[name])
    assert not d.ok and d.bug is None, d.message
    assert f"differs from the reference at step {diagnose.STEPS[name]}" in d.message
    assert "planted bug" not in d.message


def test_unrelated_wrong_forward_gets_no_name_and_the_step_when_steps_are_given(module):
    bad = lambda x: 1.01 * module(x, causal=True)  # noqa: E731
    d = diagnose.forward(bad, module)
    assert not d.ok and d.bug is None and "No single known mistake matches" in d.message
    fns = dict(ALTERNATIVES, weighted_sum=UNRELATED["weighted_sum"])
    d = diagnose.forward(bad, module, steps=fns)
    assert d.step == 6 and d.bug is None and "differs from the reference at step 6" in d.message


def test_a_bug_is_named_only_if_it_explains_the_earlier_cases_too():
    # A max-subtracting softmax without the fully-masked-row guard passes the large-score
    # case, then gives NaN on an all -inf row, as softmax_no_max would. It is not that bug.
    def stable_but_unguarded(s):
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    d = diagnose.step("softmax", stable_but_unguarded)
    assert d.bug is None and "fully masked row" in d.message and "zeros, not NaN" in d.message


def test_the_pipeline_reports_the_first_wrong_step(module):
    fns = dict(ALTERNATIVES, split_heads=planted.split_no_transpose,
               softmax=planted.softmax_wrong_axis)
    d = diagnose.pipeline(fns, module)
    assert d.step == 2 and d.bug == "split_no_transpose", d.message


# What a student sees when the code does not run ------------------------------------------------
def not_written(x, n_heads):
    raise NotImplementedError()


def no_return(x, n_heads):
    x.reshape(x.shape[0], x.shape[1], n_heads, -1).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("fn, expected", [
    (not_written, "is not written yet"),
    (no_return, "returned None: did you forget the `return`?"),
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1),
     r"should return shape \(2, 3, 5, 4\), got \(2, 5, 3, 4\).*did not transpose"),
    (lambda x, h: x.reshape(7, -1), "raised ValueError"),
])
def test_code_that_does_not_run_or_has_the_wrong_shape(fn, expected):
    d = diagnose.step("split_heads", fn)
    assert not d.ok and d.bug is None
    with pytest.raises(AssertionError, match=expected):
        d.check()


def test_a_mask_must_be_boolean():
    d = diagnose.step("causal_mask", lambda T, S=None: np.tril(np.ones((T, T))))
    assert not d.ok and "return a boolean array" in d.message


def test_student_code_cannot_change_the_reference_inputs(module):
    def in_place(x, n_heads):
        out = steps.split_heads(x, n_heads).copy()
        x[...] = 0.0  # vandalise the input
        return out

    assert diagnose.step("split_heads", in_place).ok
    assert diagnose.pipeline({"split_heads": in_place, "softmax": steps.softmax}, module).ok


def test_a_masked_fill_other_than_minus_inf_is_fine():
    d = diagnose.step("apply_mask", lambda s, a: np.where(a, s, -1e9))
    assert d.ok, d.message


def test_unknown_names_are_refused(module):
    with pytest.raises(ValueError, match="unknown step 'sofmax'"):
        diagnose.step("sofmax", steps.softmax)
    with pytest.raises(ValueError, match=r"unknown step\(s\) \['sofmax'\]"):
        diagnose.pipeline({"sofmax": steps.softmax}, module)


def test_scores_ratio_is_measured_not_assumed():
    d = diagnose.step("scaled_scores", lambda q, k: steps.scaled_scores(q, k) * math.sqrt(3))
    assert d.bug is None  # 1.73x too large is not "forgot sqrt(d_k) = 4"


@pytest.mark.parametrize("bug", ["mask_after_softmax", "softmax_wrong_axis", "merge_no_transpose"])
def test_references_stay_right_while_a_bug_is_planted(bug):
    for name in ("masked_softmax", "softmax", "merge_heads"):
        with planted.bug(bug):
            d = diagnose.step(name, ALTERNATIVES.get(name, _masked_softmax_own))
        assert d.ok, f"with {bug} planted, a correct {name} was judged wrong: {d.message}"


def _masked_softmax_own(scores, allowed):
    return softmax_logsumexp(np.where(allowed, scores, -np.inf))


def test_refusing_blocks_the_named_methods_and_restores_them(module):
    with diagnose.refusing(TorchMHA, ("from_numpy",)):
        with pytest.raises(AssertionError, match="called the reference's from_numpy"):
            TorchMHA.from_numpy(module)
    assert diagnose.forward(TorchMHA.from_numpy(module), module, causal=False).ok


def test_a_forward_that_ignores_the_causal_flag_is_told_so(module):
    d = diagnose.forward(lambda x: module(x, causal=False), module, causal=True)
    assert not d.ok and d.step == 4 and "ignores causal=True" in d.message, d.message
    d = diagnose.forward(lambda x: module(x, causal=True), module, causal=False)
    assert not d.ok and "masks although causal=False" in d.message, d.message


def test_check_by_hand_names_the_first_tensor_that_differs(module):
    x = np.random.default_rng(5).normal(size=(2, 5, 16))
    rows = {label: out for _, label, _, out in diagnose.trace_values(module, x, causal=True)}
    yours = {"q": rows["split_heads (q)"], "scores": rows["apply_mask"], "weights": rows["softmax"],
             "heads": rows["weighted_sum"], "merged": rows["merge_heads"],
             "out": rows["linear (out = merged Wo + bo)"]}
    assert diagnose.check_by_hand(yours, module, x).startswith("by hand == module")
    bad = dict(yours, weights=planted.softmax_wrong_axis(rows["apply_mask"]),
               merged=planted.merge_no_transpose(rows["weighted_sum"]))
    with pytest.raises(AssertionError, match=r"weights \(step 5\) is the first tensor"):
        diagnose.check_by_hand(bad, module, x)
    with pytest.raises(AssertionError, match=r"q \(step 1-2\) should have shape"):
        diagnose.check_by_hand({"q": rows["split_heads (q)"][0]}, module, x)
