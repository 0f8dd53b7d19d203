"""Did graded code do the work itself, or reach for the package's reference?

    with integrity.guard(softmax):                      # the whole package is off limits
        diagnose.check_step("softmax", softmax)
    with integrity.guard(forward, allow=(steps,)):       # the steps may be used, the module not
        diagnose.check_forward(lambda x: forward(m, x), m)

A grader wraps the test of one part in `guard`, naming the student's objects under test.
While the block runs, a trace function sees every Python call (not lines, not C calls). When code of a forbidden
package function starts, the stack above it is read: if a frame of the student's code (the
files, i.e. notebook cells, that define the work under test) comes before any frame of the
grader's (the test cell and the helpers it defines) or of an allowed function, the student's
code reached the reference. Frames of other cells (a setup cell's helpers, a scratch cell)
are looked through. That catches direct calls,
thin wrappers, helpers in other cells, calls "via another module" (`numpy_mha.steps.softmax`,
`diagnose._REAL["softmax"]`, the module's own forward) and lambdas; an object under test
that *is* package code (bound at import, `functools.partial`, a subclass) is caught at
the start. On leaving the block a `ReferenceUsed` (an AssertionError) names each
reference reached, so the part scores 0, and its message carries `[reference used: NAME]`
for the course's summary to report.

What it cannot see: reference source pasted in by hand (that is copying, for a person to
judge), and the reference called at the top level of a cell rather than inside the
graded function (the grader passes values, not code, there).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType, ModuleType
from typing import Any

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBS = tuple(sorted({os.path.abspath(p) + os.sep for k in ("stdlib", "platstdlib", "purelib",
                                                             "platlib")
                      if (p := sysconfig.get_paths().get(k))}))
# Package helpers that are not a reference for anything (error messages, showing source).
_ALWAYS_ALLOWED = ("validate.py", "source.py", "integrity.py")

MARK = "reference used"
"""Messages carry `[reference used: mha.steps.softmax]`; the course's summary looks for it."""


_NOT_REFERENCES: set[CodeType] = set()


def not_a_reference(fn):
    """Mark package code that graders hand to students as a stand-in (e.g. a refusal)."""
    _NOT_REFERENCES.add(fn.__code__)
    return fn


class ReferenceUsed(AssertionError):
    """Graded code ran the package's reference for the part it is graded on."""


def _package_name(filename: str) -> str:
    """'.../src/mha/steps.py' -> 'mha.steps'."""
    rel = os.path.relpath(filename, os.path.dirname(_PKG_DIR.rstrip(os.sep)))
    return os.path.splitext(rel)[0].replace(os.sep, ".")


def _dotted(code: CodeType) -> str:
    """'mha.steps.softmax' for a code object of the package."""
    return f"{_package_name(code.co_filename)}.{code.co_qualname}"


def _nested(code: CodeType) -> Iterator[CodeType]:
    """A code object and every function, lambda and class body defined inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _nested(const)


def _unwrap(obj: Any) -> Any:
    """Through partials, bound methods, decorators and np.vectorize to the function itself."""
    for _ in range(20):
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif inspect.ismethod(obj):
            obj = obj.__func__
        elif hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        elif hasattr(obj, "pyfunc") and callable(obj.pyfunc):  # np.vectorize
            obj = obj.pyfunc
        else:
            break
    return obj


def _codes_of(obj: Any) -> tuple[set[CodeType], set[str]]:
    """(code objects, whole files) that an allow/forbid entry stands for."""
    obj = _unwrap(obj)
    if isinstance(obj, ModuleType):
        return set(), {os.path.abspath(obj.__file__)}
    if inspect.isclass(obj):
        codes: set[CodeType] = set()
        for klass in obj.__mro__:
            if klass is object:
                continue
            for member in vars(klass).values():
                for part in (member, getattr(member, "fget", None), getattr(member, "fset", None)):
                    code = getattr(_unwrap(part), "__code__", None)
                    if code is not None:
                        codes |= set(_nested(code))
        return codes, set()
    code = getattr(obj, "__code__", None)
    if code is None:
        raise TypeError(f"integrity.guard: cannot tell the code of {obj!r}; pass a module, "
                        f"class or function")
    return set(_nested(code)), set()


def _codes_of_work(obj: Any) -> set[CodeType]:
    """The code objects of one piece of work under test (nothing for a non-function)."""
    try:
        return _codes_of(obj)[0]
    except TypeError:
        return set()


def _is_package(obj: Any) -> str | None:
    """The package name behind `obj` if it is (or subclasses) package code, else None."""
    obj = _unwrap(obj)
    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if (getattr(klass, "__module__", "") or "").split(".")[0] == "mha":
                return f"{klass.__module__}.{klass.__qualname__}"
        return None
    code = getattr(obj, "__code__", None)
    if code is not None and code.co_filename.startswith(_PKG_DIR):
        return _dotted(code)
    if code is None and callable(obj) and not inspect.isroutine(obj):  # an instance: a module
        return _is_package(type(obj))
    return None


class _Watch:
    """The profiler's state for one guarded block."""

    def __init__(self, work: tuple, forbid: tuple | None, allow: tuple, grader: set[str]):
        self.work_names = [getattr(_unwrap(w), "__name__", repr(w)) for w in work]
        self.forbid_all = forbid is None
        self.forbid_codes: set[CodeType] = set()
        self.forbid_files: set[str] = set()
        for f in forbid or ():
            codes, files = _codes_of(f)
            self.forbid_codes |= codes
            self.forbid_files |= files
        self.allow_codes: set[CodeType] = set()
        self.allow_files = {_PKG_DIR + name for name in _ALWAYS_ALLOWED}
        for a in allow:
            codes, files = _codes_of(a)
            self.allow_codes |= codes
            self.allow_files |= files
        self.grader = grader
        self.student = {c.co_filename for w in work for c in _codes_of_work(w)}
        self.kinds: dict[str, str] = {}
        self.watched: dict[CodeType, bool] = {}  # code -> is it forbidden package code?
        self.found: dict[str, str] = {}  # reference -> how it was reached

    def kind(self, filename: str) -> str:
        """'package', 'library', 'neutral' (generated code), 'grader' (the test), 'student'
        (the files that define the work) or 'other' (any other cell: setup, scratch)."""
        k = self.kinds.get(filename)
        if k is None:
            if filename.startswith(_PKG_DIR):
                k = "package"
            elif filename.startswith("<") and not filename.startswith("<ipython-input"):
                k = "neutral"  # <frozen ...>, <string> of dataclasses and namedtuples
            elif os.path.abspath(filename).startswith(_LIBS):
                k = "library"
            elif filename in self.grader:
                k = "grader"
            else:  # the cells that define the work, or other cells (setup, scratch): look on
                k = "student" if filename in self.student else "other"
            self.kinds[filename] = k
        return k

    def allowed(self, code: CodeType) -> bool:
        return code in self.allow_codes or code in _NOT_REFERENCES \
            or code.co_filename in self.allow_files

    def forbidden(self, code: CodeType) -> bool:
        if self.allowed(code):
            return False
        if self.forbid_all:
            return True
        return code in self.forbid_codes or code.co_filename in self.forbid_files

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        """The trace function: look at each call; return None so no line is traced."""
        code = frame.f_code
        watched = self.watched.get(code)
        if watched is None:  # first call of this code: decide once
            watched = self.watched[code] = not (
                code.co_name == "<module>"  # an import runs a module's body: not a use
                or self.kind(code.co_filename) != "package" or not self.forbidden(code))
        if not watched or event != "call":
            return
        ref = _dotted(code)
        if ref in self.found:
            return
        f = frame.f_back
        while f is not None:
            c = f.f_code
            if self.allowed(c):
                return
            if c.co_name == "<module>":
                return  # inside an import (class bodies, decorators)
            k = self.kind(c.co_filename)
            if k == "package" and _dotted(c) in self.found:
                return  # reached inside a reference already named
            if k == "grader":
                return
            if k == "student":
                self.found[ref] = f"called from your {c.co_qualname}"
                return
            f = f.f_back


def _grader_files(frame: FrameType | None) -> set[str]:
    """Files of the frames that entered the guard (the test cell and its helpers)."""
    files = set()
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_PKG_DIR) and not os.path.abspath(name).startswith(_LIBS):
            files.add(name)
        frame = frame.f_back
    return files


def message(found: dict[str, str], work_names: list[str]) -> str:
    """'your softmax reached the package's reference mha.steps.softmax (...)'."""
    what = ", ".join(work_names) or "your code"
    refs = "; ".join(f"{ref} ({how})" for ref, how in found.items())
    marks = " ".join(f"[{MARK}: {ref}]" for ref in found)
    return (f"{what} reached the package's reference: {refs}. This part earns no points: "
            f"write it yourself (the reference is what it is compared with). {marks}")


@contextmanager
def guard(*work: Any, forbid: tuple | None = None, allow: tuple = (),
          grader: tuple | None = None) -> Iterator[_Watch]:
    """Within the block, the student's `work` must not run forbidden package code.

    forbid: modules, classes or functions that are the reference (default: the whole
    package); allow: package code the part may use (and all it calls). Raises
    ReferenceUsed on leaving the block if any was reached, even if the block raised.
    grader: the files of the grader's code; by default those of the frames that entered the
    block. A Try-it self-check passes () because there the package is the grader and the cell
    that calls it also defines the student's work.
    """
    __tracebackhide__ = True
    files = _grader_files(sys._getframe(2)) if grader is None else set(grader)
    watch = _Watch(work, forbid, allow, files)
    for w in work:
        code = getattr(_unwrap(w), "__code__", None)
        if (ref := _is_package(w)) and not (code is not None and watch.allowed(code)):
            watch.found[ref] = "it is the package's own, not yours"
    previous = sys.gettrace()
    sys.settrace(watch)  # 'call' events of Python functions only: no C calls, no lines
    failure: BaseException | None = None
    try:
        yield watch
    except Exception as e:  # report the reference first: that decides the part
        failure = e
    finally:
        sys.settrace(previous)
    if watch.found:
        raise ReferenceUsed(message(watch.found, watch.work_names)) from failure
    if failure is not None:
        raise failure
