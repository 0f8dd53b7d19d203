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

Code made at run time (`exec`, `compile`, `types.FunctionType`, a copied `__code__`) is judged
by what it is, not where its text came from: a graded function whose code was made that way is
the student's (its file is `<string>`, once looked through as generated code), and generated
code that runs in the student's globals is a cell like any other; only code generated inside a
library or the package (dataclasses, namedtuples) is looked through. A class (or instance)
whose attributes are package functions (`update = kv_cache._Cache.update` in the class body)
is caught at the start, and a package method that runs on an instance of the student's class
is caught when it runs (a method borrowed any other way).

What it cannot see: reference source pasted in by hand (that is copying, for a person to
judge), and the reference called at the top level of a cell rather than inside the
graded function (the grader passes values, not code, there).
"""

from __future__ import annotations

import builtins
import functools
import inspect
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType, ModuleType
from typing import Any

_SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("mha", "mha_course")  # the library and the course: both are "the package"
_PKG_DIR = tuple(os.path.join(_SRC_DIR, p) + os.sep for p in PACKAGES)  # for startswith
_LIBS = tuple(sorted({os.path.abspath(p) + os.sep for k in ("stdlib", "platstdlib", "purelib",
                                                             "platlib")
                      if (p := sysconfig.get_paths().get(k))}))
# Package helpers that are not a reference for anything (error messages, showing source).
_ALWAYS_ALLOWED = ("mha/validate.py", "mha_course/source.py", "mha_course/integrity.py")

MARK = "reference used"
"""Messages carry `[reference used: mha.steps.softmax]`; the course's summary looks for it."""


_NOT_REFERENCES: set[CodeType] = set()


def not_a_reference(fn):
    """Mark package code that graders hand to students as a stand-in (e.g. a refusal)."""
    _NOT_REFERENCES.add(fn.__code__)
    return fn


class ReferenceUsed(AssertionError):
    """Graded code ran the package's reference for the part it is graded on."""


def is_library_code(code: CodeType) -> bool:
    """Code of the package, the standard library or an installed library (not a student's)."""
    name = os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else ""
    return name.startswith(_PKG_DIR) or name.startswith(_LIBS)


def _package_name(filename: str) -> str:
    """'.../src/mha/steps.py' -> 'mha.steps'."""
    rel = os.path.relpath(filename, _SRC_DIR)
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
            if (getattr(klass, "__module__", "") or "").split(".")[0] in PACKAGES:
                return f"{klass.__module__}.{klass.__qualname__}"
        return None
    code = getattr(obj, "__code__", None)
    if code is not None and code.co_filename.startswith(_PKG_DIR):
        return _dotted(code)
    if code is None and callable(obj) and not inspect.isroutine(obj):  # an instance: a module
        return _is_package(type(obj))
    return None


def _library_module(name: str | None) -> bool:
    """Is `name` a module of the package, the standard library or an installed library?
    (Never `__main__`: the notebook's, even when a library's script runs it.)"""
    if name == "__main__":
        return False
    path = getattr(sys.modules.get(name or ""), "__file__", None)
    return path is not None and (os.path.abspath(path).startswith(_LIBS)
                                 or os.path.abspath(path).startswith(_PKG_DIR))


def _library_class(klass: Any) -> bool:
    """A class of a library, the package or Python itself (not the student's)."""
    module = getattr(klass, "__module__", None)
    if module == "builtins":
        return getattr(builtins, getattr(klass, "__name__", ""), None) is klass
    return _library_module(module)


def _members(klass: type) -> Iterator[tuple[str, Any]]:
    """(name, function) for each attribute of `klass` and its own (non-library) bases."""
    for k in klass.__mro__:
        if _library_class(k):
            continue
        for name, member in vars(k).items():
            for part in (member, getattr(member, "fget", None), getattr(member, "fset", None)):
                if part is not None:
                    yield name, _unwrap(part)


def borrowed(obj: Any, allowed: Callable[[CodeType], bool] = lambda c: False) -> dict[str, str]:
    """{package function: how} for attributes of the student's class or instance that are the
    package's own functions (`update = kv_cache._Cache.update` in a class body)."""
    obj = _unwrap(obj)
    found: dict[str, str] = {}
    klass = obj if inspect.isclass(obj) else type(obj)
    if _library_class(klass) or _is_package(klass):
        return found
    pairs = list(_members(klass))
    if not inspect.isclass(obj):
        pairs += [(n, _unwrap(v)) for n, v in getattr(obj, "__dict__", {}).items()]
    for name, fn in pairs:
        code = getattr(fn, "__code__", None)
        if isinstance(code, CodeType) and code.co_filename.startswith(_PKG_DIR) \
                and not allowed(code):
            found[_dotted(code)] = f"your {klass.__qualname__}.{name} is the package's own"
    return found


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
        self.allow_files = {os.path.join(_SRC_DIR, name) for name in _ALWAYS_ALLOWED}
        for a in allow:
            codes, files = _codes_of(a)
            self.allow_codes |= codes
            self.allow_files |= files
        self.grader = grader
        self.student_codes = {c for w in work for c in _codes_of_work(w)}
        self.student = {c.co_filename for c in self.student_codes}
        self.kinds: dict[str, str] = {}
        self.generated: dict[CodeType, str] = {}
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

    def kind_of(self, frame: FrameType) -> str:
        """kind() of a frame's file; code generated at run time (`<string>`) by its globals:
        the student's when it is the work or runs outside a library and the package."""
        code = frame.f_code
        k = self.kind(code.co_filename)
        if k != "neutral":
            return k
        k = self.generated.get(code)
        if k is None:
            if code in self.student_codes:
                k = "student"
            elif _library_module(frame.f_globals.get("__name__")):
                k = "neutral"
            else:
                k = "other"  # made by the student's exec / compile: a cell like any other
            self.generated[code] = k
        return k

    def method_of_yours(self, frame: FrameType) -> str | None:
        """The student's class when a package method it holds (in its class or instance) runs on
        its instance: a method borrowed from the package."""
        code = frame.f_code
        if not code.co_argcount or code.co_varnames[0] not in ("self", "cls"):
            return None
        obj = frame.f_locals.get(code.co_varnames[0])
        klass = obj if inspect.isclass(obj) else type(obj)
        if _library_class(klass) or _is_package(klass):
            return None
        held = [fn for _, fn in _members(klass)]
        if not inspect.isclass(obj):
            held += [_unwrap(v) for v in getattr(obj, "__dict__", {}).values()]
        if not any(getattr(fn, "__code__", None) is code for fn in held):
            return None  # the grader ran the package's method on the student's object itself
        return klass.__qualname__

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
        if (klass := self.method_of_yours(frame)) is not None:
            self.found[ref] = f"it ran as a method of your {klass}: borrowed from the package"
            return
        f = frame.f_back
        while f is not None:
            c = f.f_code
            if self.allowed(c):
                return
            if c.co_name == "<module>":
                return  # inside an import (class bodies, decorators)
            k = self.kind_of(f)
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
        for ref, how in borrowed(w, watch.allowed).items():
            watch.found.setdefault(ref, how)
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
