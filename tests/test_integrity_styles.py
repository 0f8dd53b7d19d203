"""Integrity by mechanism (issue 28): each way a student's code can reach the package, and each way
a later part can reach an earlier one, written as a student would, in a file of its own.

(a) code made at run time (exec, compile, types.FunctionType, a copied __code__) is the student's;
(b) package functions borrowed by a class (its body, staticmethod, bound in __init__) are caught;
(c) the reference swapped in for an earlier part follows the student's alias, default and closure.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from mha.inference import kv_cache
from mha_course import diagnose, integrity
from mha_course.diagnose import flash as diagnose_flash

STUDENT = '''
import math
import types

import numpy as np

from mha.inference import kv_cache
from mha import steps


def own(s):
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    t = e.sum(axis=-1, keepdims=True)
    return np.divide(e, t, out=np.zeros_like(e), where=t > 0)


# ---- (a) code made at run time
exec("def exec_wrapper(s):\\n    return steps.softmax(s)\\n", globals())
exec("def exec_honest(s):\\n    return own(s)\\n", globals())
_ns = {"steps": steps}
exec(compile("def compiled(s):\\n    return steps.softmax(s)\\n", "<student>", "exec"), _ns)
compile_wrapper = _ns["compiled"]
_code = compile("def f(s):\\n    return steps.softmax(s)\\n", "<string>", "exec").co_consts[0]
function_type = types.FunctionType(_code, globals(), "function_type")


def copied_code(s):
    return own(s)


copied_code.__code__ = compile_wrapper.__code__
exec("def make(f):\\n    def g(s):\\n        return f(s)\\n    return g\\n", _ns)
exec_closure = _ns["make"](steps.softmax)
exec("def _helper(s):\\n    return steps.softmax(s)\\n", globals())


def calls_exec_helper(s):
    return _helper(s)


alias = steps.softmax
package_code = types.FunctionType(steps.softmax.__code__, globals(), "package_code")


# ---- (b) classes that borrow the package's methods
class BorrowsUpdate:
    update = kv_cache._Cache.update


class BorrowsStatic:
    softmax = staticmethod(steps.softmax)


class BindsInInit:
    def __init__(self):
        self.update = types.MethodType(kv_cache._Cache.update, self)


class OwnCache(dict):
    def update(self, k, v, positions):
        return k


# ---- (c) a later part reaching an earlier one through the student's own handles
def online_update(m, ell, acc, scores, v_block):
    return m, ell, acc  # part 1 is wrong: that must cost part 1 only


def _forward(q, k, v, causal, block_q, block_k, offset, fold):
    B, h, T, d_k = q.shape
    S = k.shape[2]
    out = np.zeros((B, h, T, v.shape[-1]))
    lse = np.full((B, h, T), -np.inf)
    for t0 in range(0, T, block_q):
        t1 = min(t0 + block_q, T)
        m = np.full((B, h, t1 - t0, 1), -np.inf)
        ell = np.zeros_like(m)
        acc = np.zeros((B, h, t1 - t0, v.shape[-1]))
        for s0 in range(0, S, block_k):
            s1 = min(s0 + block_k, S)
            if causal and s0 > t1 - 1 + offset:
                break
            scores = q[:, :, t0:t1] @ k[:, :, s0:s1].swapaxes(-1, -2) / math.sqrt(d_k)
            if causal:
                allowed = np.arange(s0, s1)[None, :] <= np.arange(t0, t1)[:, None] + offset
                scores = np.where(allowed, scores, -np.inf)
            m, ell, acc = fold(m, ell, acc, scores, v[:, :, s0:s1])
        out[:, :, t0:t1] = np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)
        with np.errstate(divide="ignore"):
            lse[:, :, t0:t1] = (m + np.log(ell))[..., 0]
    return out, lse


update = online_update


def flash_alias(q, k, v, causal=False, block_q=16, block_k=16, offset=0):
    return _forward(q, k, v, causal, block_q, block_k, offset, update)


def flash_default(q, k, v, causal=False, block_q=16, block_k=16, offset=0, fold=online_update):
    return _forward(q, k, v, causal, block_q, block_k, offset, fold)


def flash_kwdefault(q, k, v, causal=False, block_q=16, block_k=16, offset=0, *, fold=online_update):
    return _forward(q, k, v, causal, block_q, block_k, offset, fold)


def _make(fold):
    def forward(q, k, v, causal=False, block_q=16, block_k=16, offset=0):
        return _forward(q, k, v, causal, block_q, block_k, offset, fold)
    return forward


flash_closure = _make(online_update)


def flash_by_name(q, k, v, causal=False, block_q=16, block_k=16, offset=0):
    return _forward(q, k, v, causal, block_q, block_k, offset, online_update)
'''


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The student's code, in a file of its own as a notebook cell is."""
    path = tmp_path_factory.mktemp("student") / "student_styles.py"
    path.write_text(STUDENT)
    spec = importlib.util.spec_from_file_location("student_styles", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["student_styles"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("student_styles", None)


def _verdict(fn) -> str:
    """'clean' or the guard's message, for a softmax graded as the course does."""
    try:
        with integrity.guard(fn):
            diagnose.check_step("softmax", fn)
    except integrity.ReferenceUsed as e:
        return str(e)
    return "clean"


@pytest.mark.parametrize("name", ["exec_wrapper", "compile_wrapper", "function_type", "copied_code",
                                  "exec_closure", "calls_exec_helper", "alias",
                                  "package_code"])
def test_code_made_at_run_time_is_the_students(student, name):
    said = _verdict(getattr(student, name))
    assert "[reference used: mha.steps.softmax]" in said, f"{name}: {said}"


@pytest.mark.parametrize("name", ["own", "exec_honest"])
def test_honest_code_made_at_run_time_passes(student, name):
    assert _verdict(getattr(student, name)) == "clean"


def test_generated_code_of_a_library_is_still_looked_through():
    import dataclasses

    @dataclasses.dataclass
    class Point:  # its __init__ is made by exec inside dataclasses
        x: float = 0.0

    with integrity.guard(Point):
        Point(1.0)


@pytest.mark.parametrize("name,ref", [("BorrowsUpdate", "mha.inference.kv_cache._Cache.update"),
                                      ("BorrowsStatic", "mha.steps.softmax")])
def test_a_class_that_borrows_the_package_is_caught_at_the_start(student, name, ref):
    with pytest.raises(integrity.ReferenceUsed, match=rf"{ref} \(your {name}\.\w+ is the package's own"):
        with integrity.guard(getattr(student, name)):
            pass


def test_a_package_method_bound_to_the_students_instance_is_caught_when_it_runs(student):
    with pytest.raises(integrity.ReferenceUsed, match=r"_Cache\.update \(it ran as a method of your "
                                                      r"BindsInInit"):
        with integrity.guard(student.BindsInInit):
            cache = student.BindsInInit()
            cache.update(np.zeros((1, 1, 1, 2)), np.zeros((1, 1, 1, 2)), np.zeros((1, 1), int))


def test_an_honest_class_passes(student):
    with integrity.guard(student.OwnCache):
        assert student.OwnCache().update(1, 2, 3) == 1


@pytest.mark.parametrize("name", ["flash_alias", "flash_default", "flash_kwdefault", "flash_closure",
                                  "flash_by_name"])
def test_a_later_part_is_judged_with_the_reference_through_any_handle(student, name):
    fn = getattr(student, name)
    with integrity.guard(fn, allow=diagnose_flash.ALLOWED["forward"]):
        d = diagnose_flash.forward_diagnosis(fn, vars(student), cases=diagnose_flash.FORWARD_CASES[:3])
    assert d.ok, d.message


def test_the_students_handles_are_put_back(student):
    before = (student.update, student.flash_default.__defaults__, student.flash_kwdefault.__kwdefaults__,
              student.flash_closure.__closure__[0].cell_contents)
    diagnose_flash.forward_diagnosis(student.flash_default, vars(student), cases=diagnose_flash.FORWARD_CASES[:1])
    after = (student.update, student.flash_default.__defaults__, student.flash_kwdefault.__kwdefaults__,
             student.flash_closure.__closure__[0].cell_contents)
    assert all(a is b or a == b for a, b in zip(before, after, strict=True))
    assert student.update is student.online_update


def test_swapped_in_leaves_the_package_and_other_values_alone():
    def later(x, fold=np.add):
        return fold(x, x)

    ns = {"step": np.add, "other": np.add, "keep": 3, "later": later, "pkg": diagnose.as_bool}
    pkg_defaults = diagnose.as_bool.__defaults__
    with diagnose.swapped_in(ns, {"step": np.subtract}):
        assert ns["step"] is np.subtract and ns["other"] is np.subtract and ns["keep"] == 3
        assert later(np.ones(1))[0] == 0
    assert ns["step"] is np.add and ns["other"] is np.add and later.__defaults__ == (np.add,)
    assert diagnose.as_bool.__defaults__ is pkg_defaults


def test_the_grader_may_run_a_package_method_on_the_students_object(student):
    cache = student.OwnCache()
    cache.length = 3
    with integrity.guard(student.OwnCache):
        assert kv_cache._Cache.__len__(cache) == 3  # the grader's own call, not a borrowed method
