"""mha_course.integrity: graded code that reaches the package's reference is caught, honest code is not.

"Student" code is compiled here with the file name of a notebook cell, the way IPython does;
the test functions themselves play the grader (the frames that enter the guard).
"""

from __future__ import annotations

import numpy as np
import pytest

from mha import steps
from mha.inference import kv_cache
from mha.modules.numpy_mha import MultiHeadAttention
from mha_course import diagnose, integrity, planted

STUDENT = '''
import functools
import numpy as np
from mha_course import diagnose
from mha import steps
from mha import steps as st
from mha.inference.kv_cache import KVCache


def own(s):
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    t = e.sum(axis=-1, keepdims=True)
    return np.divide(e, t, out=np.zeros_like(e), where=t > 0)


def wrapper(s):
    return steps.softmax(s)


def via_other_module(s):
    return diagnose._REAL["softmax"](s)


def helper_elsewhere(s):
    return wrapper(s)


def masked_instead(s):
    return st.masked_softmax(s, np.ones(s.shape[-2:], dtype=bool))


def imports_inside(s):
    from mha import checks  # importing is not using
    return own(s)


bound_at_import = steps.softmax
partial_of_it = functools.partial(steps.softmax)
a_lambda = lambda s: steps.softmax(s)  # noqa: E731


class SubclassCache(KVCache):
    pass


def forward_by_module(module, x):
    return module(x, causal=True)


def is_causal(forward_fn, x, t):
    out = forward_fn(x)
    later = x.copy()
    later[:, t + 1:] += 1.0
    return bool(np.array_equal(out[:, :t + 1], forward_fn(later)[:, :t + 1]))
'''


@pytest.fixture(scope="module")
def student() -> dict:
    ns: dict = {}
    exec(compile(STUDENT, "/tmp/ipykernel_4242/3517.py", "exec"), ns)  # a notebook cell
    return ns


def _verdict(fn, **kw) -> str:
    try:
        with integrity.guard(fn, **kw):
            diagnose.check_step("softmax", fn)
    except integrity.ReferenceUsed as e:
        return str(e)
    return "clean"


@pytest.mark.parametrize("name", ["wrapper", "via_other_module", "helper_elsewhere",
                                  "masked_instead", "bound_at_import", "partial_of_it",
                                  "a_lambda"])
def test_each_way_of_reaching_the_reference_is_caught_and_named(student, name):
    said = _verdict(student[name])
    assert said != "clean", f"{name} reached steps.softmax but was not caught"
    assert "[reference used: mha.steps." in said and "earns no points" in said, said


@pytest.mark.parametrize("name", ["own", "imports_inside"])
def test_honest_code_passes(student, name):
    assert _verdict(student[name]) == "clean"


def test_allowed_code_may_be_used(student):
    assert _verdict(student["wrapper"], allow=(steps,)) == "clean"
    assert _verdict(student["wrapper"], forbid=(kv_cache,)) == "clean"


def test_the_module_forward_counts_when_the_module_is_the_reference(student):
    m = MultiHeadAttention(8, 2)
    x = np.random.default_rng(0).normal(size=(1, 3, 8))
    with pytest.raises(integrity.ReferenceUsed, match=r"MultiHeadAttention\.__call__"):
        with integrity.guard(student["forward_by_module"], allow=(steps,)):
            student["forward_by_module"](m, x)


def test_callbacks_from_the_grader_and_its_own_calls_are_not_the_students(student):
    m = MultiHeadAttention(8, 2)
    x = np.random.default_rng(0).normal(size=(1, 4, 8))
    with integrity.guard(student["is_causal"], allow=(planted,)):
        assert student["is_causal"](lambda a: m(a, causal=True), x, 1)  # the grader's lambda
        assert not student["is_causal"](planted.forward_with(m, "anti_causal_mask", causal=True),
                                        x, 1)
        m(x)  # the grader itself may run anything


def test_a_subclass_of_the_reference_is_caught(student):
    with pytest.raises(integrity.ReferenceUsed, match="mha.inference.kv_cache.KVCache"):
        with integrity.guard(student["SubclassCache"]):
            pass


def test_the_reference_is_reported_even_when_the_check_fails_too(student):
    def bad_check():
        raise AssertionError("rows sum to 0.8")

    with pytest.raises(integrity.ReferenceUsed) as err:
        with integrity.guard(student["wrapper"]):
            student["wrapper"](np.zeros((2, 3)))
            bad_check()
    assert isinstance(err.value.__cause__, AssertionError)


def test_the_profiler_is_put_back(student):
    import sys

    before = sys.gettrace()
    with integrity.guard(student["own"]):
        pass
    assert sys.gettrace() is before


def test_a_suspect_keeps_its_bug_out_of_its_attributes():
    for s in planted.suspects(2026).values():
        text = repr(s) + repr({k: v for k, v in vars(s).items() if k != "_run"})
        assert not any(bug in text for bug in planted.BUGS), text
        assert not hasattr(planted, "suspect_bugs"), "the answer key is the teacher's"
