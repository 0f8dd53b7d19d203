"""Self-checks for the lessons' Try-it exercises: one module per lesson, one contract for all.

A lesson imports its module as `from mha_course.tryit import <topic> as tryit` and calls
`print(tryit.check_<name>(answer))` under the exercise. Every `check_*` here is decorated with
`@self_check` and obeys one contract, which `tests/test_self_checks.py` enforces with the cases
in `tests/self_checks/`:

- the verdict is returned as plain text (a `Verdict`), never raised: a wrong answer prints
  "not yet: ..." and no traceback shows the checker's code or the answer;
- the placeholder `None` returns "not tried yet: ..." and shows neither the answer nor a hint
  that gives it away, so Run All passes before the student has written a line;
- the right answer, in any equivalent form (a float holding a whole number, a list or a tensor,
  a mask in another convention where the lesson allows it), returns "right: ...";
- each typical wrong answer returns "not yet: ..." naming that mistake; when one value fits two
  slips, both are named; an answer nobody listed is described by how it relates to the right
  one (`relate`: a ratio, an offset, a transpose, a shift, the first entry that differs);
- an answer of the wrong kind (text, a list of the wrong length) says what was expected and
  what arrived, and an error raised in the student's own code is named with its line;
- code that reaches for the package's reference (`guarded`) is told so, not praised.
"""

from __future__ import annotations

import ast
import dis
import functools
import inspect
import itertools
import linecache
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import CodeType, FrameType, ModuleType, TracebackType
from typing import Any, NoReturn

import numpy as np

from mha_course.integrity import _LIBS, _PKG_DIR


class NotYet(AssertionError):
    """A self-check's verdict on a wrong answer: the message names the mistake."""


def not_tried(what: str) -> str:
    """The message for the untouched placeholder: what to write, nothing about the answer."""
    return f"not tried yet: {what}"


def right(why: str) -> str:
    """The message for a right answer."""
    return f"right: {why}"


def not_yet(why: str) -> NoReturn:
    """Reject a wrong answer with a message that names the mistake."""
    raise NotYet(f"not yet: {why}")


def as_number(answer: Any, name: str, integer: bool = False) -> float | int:
    """The answer as a plain number, or NotYet saying what arrived instead (text, a list, ...)."""
    if isinstance(answer, bool | np.bool_) or isinstance(answer, str | bytes):
        not_yet(f"{name} must be a number, got {type(answer).__name__} {answer!r}")
    try:
        value = np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer)
    except Exception:  # noqa: BLE001 - anything that is not array-like
        not_yet(f"{name} must be a number, got {type(answer).__name__}")
    if value.shape == (1,) and not isinstance(answer, list | tuple):
        value = value.reshape(())  # a one-element array or tensor is one number
    if value.shape != () or not np.issubdtype(value.dtype, np.number):
        not_yet(f"{name} must be one number, got {type(answer).__name__} of shape {value.shape} "
                f"and dtype {value.dtype}")
    if not np.isfinite(value):
        not_yet(f"{name} must be a finite number, got {value.item()}")
    if integer:
        if float(value) != int(value):
            not_yet(f"{name} must be a whole number, got {value.item()}")
        return int(value)
    return float(value)


def read_array(answer: Any, expected: str) -> np.ndarray:
    """Any array-like answer (a list, a numpy array, a torch tensor) as numpy, or NotYet.

    `expected` says what was wanted, e.g. "positions must be a (3, 5) int array".
    """
    if isinstance(answer, str | bytes):
        not_yet(f"{expected}, got text {answer!r:.40}")
    try:
        return np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        not_yet(f"{expected}, got {type(answer).__name__} that numpy cannot read as one "
                f"(rows of different lengths?)")


def as_array(answer: Any, name: str, shape: Sequence[int] | None = None, kind: str = "number",
             ) -> np.ndarray:
    """The answer as an array of the expected shape and kind ("number", "int" or "bool").

    Raises NotYet, not a numpy error, for text, ragged lists, a wrong shape or a wrong dtype.
    Whole numbers stored as floats (1.0, 2.0) are read as ints.
    """
    value = read_array(answer, f"{name} must be an array")
    if kind == "int" and value.dtype.kind == "f" and value.size and np.isfinite(value).all() \
            and (value == np.round(value)).all():
        value = value.astype(np.int64)
    want = {"number": "numbers", "int": "whole numbers (an int array)",
            "bool": "booleans (True = may attend)"}[kind]
    ok = {"number": np.issubdtype(value.dtype, np.number) and value.dtype != np.bool_,
          "int": np.issubdtype(value.dtype, np.integer),
          "bool": value.dtype == np.bool_}[kind]
    if shape is not None and value.shape != tuple(shape):
        not_yet(f"{name} must have shape {tuple(shape)}, got shape {value.shape}")
    if not ok:
        hint = " (e.g. .astype(bool))" if kind == "bool" and np.issubdtype(value.dtype, np.number) else ""
        not_yet(f"{name} must hold {want}, got dtype {value.dtype}{hint}")
    return value


def first_match(got: np.ndarray, mistakes: Iterable[tuple[Any, str]],
                atol: float = 0.0) -> str | None:
    """A message naming every typical mistake whose value `got` equals, or None.

    When two slips give the same value, both are named: the student learns which two to check.
    """
    found = all_matches(got, mistakes, atol)
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    return "two slips give this same value: " + "; or ".join(found) if len(found) == 2 else \
        f"{len(found)} slips give this same value: " + "; or ".join(found)


def transposed_match(got: np.ndarray, mistakes: Iterable[tuple[Any, str]]) -> str | None:
    """For a (T, S) answer that fits no mistake: does it fit one once turned round? Then both
    slips are named, the transpose and the other."""
    got = np.asarray(got)
    if got.ndim < 2 or got.shape[-1] != got.shape[-2]:
        return None
    why = first_match(np.swapaxes(got, -1, -2), mistakes)
    if why is None:
        return None
    return (f"two slips: it is transposed (rows must be the queries, columns the keys), and "
            f"turned round, {why}")


def inverted_match(got: np.ndarray, mistakes: Iterable[tuple[Any, str]],
                   want: Any = None) -> str | None:
    """For a boolean mask that fits no mistake: does its negation fit one (perhaps turned round
    too)? Then both slips are named: the convention (True = blocked) and the other. A mask that
    is just the right one inverted (`want` given) is left to mask_verdict."""
    got = np.asarray(got)
    if got.dtype != np.bool_ or not got.any() or got.all():  # all or nothing: said plainly
        return None
    if want is not None:
        want = np.asarray(want, dtype=bool)
        if np.array_equal(~got, want):
            return None
        if got.ndim >= 2 and np.array_equal(np.swapaxes(~got, -1, -2), want):
            return ("two slips: it is inverted, True where attention is blocked (torch's "
                    "key_padding_mask convention; here True means may attend), and transposed "
                    "(rows must be the queries, columns the keys)")
    mistakes = list(mistakes)
    why = first_match(~got, mistakes) or transposed_match(~got, mistakes)
    if why is None:
        return None
    return (f"two slips: it is inverted, True where attention is blocked (torch's "
            f"key_padding_mask convention; here True means may attend), and negated back, {why}")


def slip_readings(got: float, want: float, slips: Sequence[tuple[str, float, str]],
                  rtol: float = 1e-9) -> list[str]:
    """Every single slip, and every pair of slips of different kinds, whose factors turn `want`
    into `got`. slips: (kind, factor, words); two of one kind (two itemsizes) never pair, and
    a slip of kind "solo" (rare, its factor a power of 2 that would pair with anything) is
    named alone only."""
    found: list[str] = []
    for _kind, a, why_a in slips:
        if math.isclose(got, want * a, rel_tol=rtol):
            found.append(why_a)
    for i, (kind_a, a, why_a) in enumerate(slips):
        for kind_b, b, why_b in slips[i + 1:]:
            if kind_a != kind_b and "solo" not in (kind_a, kind_b) and \
                    not math.isclose(a * b, 1.0) and \
                    math.isclose(got, want * a * b, rel_tol=rtol):
                found.append(f"{why_a} together with {why_b}")
    return list(dict.fromkeys(found))


def all_matches(got: np.ndarray, mistakes: Iterable[tuple[Any, str]],
                atol: float = 0.0) -> list[str]:
    """The messages of every typical mistake whose value `got` equals (no repeats)."""
    found: list[str] = []
    got = np.asarray(got)
    for wrong, why in mistakes:
        w = np.asarray(wrong)
        if w.shape != got.shape:
            continue
        same = (np.array_equal(got, w) if w.dtype == np.bool_ or got.dtype == np.bool_
                else np.allclose(got, w, rtol=0.0, atol=atol))
        if same and why not in found:
            found.append(why)
    return found


# --- The verdict: plain text, never a traceback --------------------------------------------


class Verdict(str):
    """A self-check's verdict, printed as plain text: 'right: ...', 'not yet: ...' or
    'not tried yet: ...'. `.ok` is True only for a right answer."""

    @property
    def ok(self) -> bool:
        return self.startswith("right")

    def __repr__(self) -> str:  # a bare `tryit.check_x(...)` at the end of a cell shows the text
        return str(self)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))


def _is_students(filename: str) -> bool:
    """True for a file of the student's code: a notebook cell or their own script."""
    if filename.startswith(_PKG_DIR) or filename.startswith("<frozen"):
        return False
    return filename.startswith("<") or not os.path.abspath(filename).startswith(_LIBS)


def where_in_students_code(tb: TracebackType | None) -> str | None:
    """'line 3 of your code: `x = q @ k`' for the last frame of the student's code, or None."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if _is_students(code.co_filename):
            found = (code, tb.tb_lineno)
        tb = tb.tb_next
    if found is None:
        return None
    code, lineno = found
    line = linecache.getline(code.co_filename, lineno).strip()
    where = "" if code.co_name == "<module>" else f" in your {code.co_name}"
    return f"line {lineno}{where}" + (f": `{line}`" if line else "")


def self_check(fn: Callable[..., str]) -> Callable[..., Verdict]:
    """Make a check return its verdict as plain text: NotYet and errors raised in the
    student's own code become a 'not yet' message instead of a traceback."""

    @functools.wraps(fn)
    def check(*args: Any, **kwargs: Any) -> Verdict:
        try:
            said = fn(*args, **kwargs)
        except NotYet as verdict:
            return Verdict(str(verdict))
        except Exception as err:  # noqa: BLE001 - an error of the student's code becomes a message
            where = where_in_students_code(err.__traceback__)
            if where is None:
                raise  # the checker's own bug: show it, do not blame the student
            text = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return Verdict(f"not yet: your code raised {type(err).__name__}"
                           f"{': ' + text[:300] if text else ''} ({where})")
        return Verdict(said)

    check.__self_check__ = True
    return check


# --- Parts, guards ----------------------------------------------------------------------------


def judge_parts(**parts: Callable[[], str]) -> str:
    """Judge every part (a zero-argument callable returning a verdict or raising NotYet).

    Right only if every part is right; otherwise NotYet listing each part's verdict, so a wrong
    first part never hides the second.
    """
    said: dict[str, str] = {}
    for name, part in parts.items():
        try:
            said[name] = str(part())
        except NotYet as verdict:
            said[name] = str(verdict)
    if all(s.startswith("right") for s in said.values()):
        return right("; ".join(f"{n}: {s.removeprefix('right:').strip()}" for n, s in said.items()))
    if all(s.startswith("not tried") for s in said.values()):
        return not_tried("; ".join(f"{n}: {s.removeprefix('not tried yet:').strip()}"
                                   for n, s in said.items()))
    n_right = sum(s.startswith("right") for s in said.values())
    lines = "\n".join(f"  - {n}: {s}" for n, s in said.items())
    not_yet(f"{n_right} of {len(said)} parts right\n{lines}")


def guarded(fn: Callable[..., Any], *args: Any, forbid: tuple | None = None, allow: tuple = (),
            rule: str = "this exercise asks you to write it yourself", **kwargs: Any) -> Any:
    """fn(*args, **kwargs) under the grading guard: reaching the package's reference is NotYet.

    forbid / allow as in mha_course.integrity.guard (default: the whole package is off limits).
    """
    from mha_course import integrity  # the course's guard; imported late to keep this module light

    name = getattr(fn, "__name__", "your function")
    try:
        with integrity.guard(fn, forbid=forbid, allow=allow, grader=()) as watch:
            result = fn(*args, **kwargs)
    except integrity.ReferenceUsed:
        refs = ", ".join(sorted(watch.found))
        not_yet(f"{rule}: your {name} used the package's own {refs}, so this checks the package, "
                f"not your work")
    return result


def students_frame() -> FrameType | None:
    """The frame of the student's code that called the check (a notebook cell, a script)."""
    frame = sys._getframe(1)
    while frame is not None and not _is_students(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _named_objects(code: CodeType, frame: FrameType) -> Iterator[Any]:
    """Every object a chain `name.attr.attr` in `code` names, resolved in the frame's
    namespace (modules and classes followed statically: no property runs)."""
    from mha_course.integrity import _nested

    space = {**frame.f_builtins, **frame.f_globals, **frame.f_locals}
    for inner in _nested(code):
        current: Any = None
        for ins in dis.get_instructions(inner):
            if ins.opname in ("LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_FAST",
                              "LOAD_CLOSURE"):
                name = ins.argval if isinstance(ins.argval, str) else ""
                current = space.get(name, frame.f_locals.get(name))
                if current is not None:
                    yield current
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and current is not None:
                owner = current if isinstance(current, ModuleType) or inspect.isclass(current) \
                    else type(current)
                try:
                    current = inspect.getattr_static(owner, ins.argval)
                except AttributeError:
                    current = None
                if isinstance(current, staticmethod | classmethod):
                    current = current.__func__
                if isinstance(current, property):
                    current = current.fget
                if current is not None:
                    yield current
            elif not ins.opname.startswith(("CACHE", "PRECALL", "PUSH_NULL", "EXTENDED_ARG")):
                current = None


def last_assignment(name: str) -> tuple[ast.expr, dict] | None:
    """The expression of the last `name = ...` the student ran, and the namespace it ran in.

    In a notebook it is read from IPython's input history, so it says what code made a value
    however it was converted afterwards; in a script, from the calling file above the line that
    called the check. None if no such assignment is found.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None  # noqa: N806 - IPython is optional
    ip = get_ipython() if get_ipython is not None else None
    if ip is not None:
        ns = ip.user_ns
        for cell in reversed(ns.get("In", [])[-100:]):
            try:
                tree = ast.parse(ip.transform_cell(cell))
            except SyntaxError:
                continue
            values = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
            if values:
                return max(values, key=lambda v: (v.lineno, v.col_offset)), ns
        return None
    frame = students_frame()
    if frame is None:
        return None
    try:
        tree = ast.parse("".join(linecache.getlines(frame.f_code.co_filename)))
    except (SyntaxError, ValueError):
        return None
    values = [node.value for node in _scope(tree, frame) if isinstance(node, ast.Assign)
              and node.lineno <= frame.f_lineno
              and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
    if not values:
        return None
    return max(values, key=lambda v: (v.lineno, v.col_offset)), {**frame.f_globals,
                                                                   **frame.f_locals}


def _scope(tree: ast.Module, frame: FrameType) -> list[ast.stmt]:
    """The statements of the frame's own scope (a cell, or the function it runs in), not those
    in branches or loops, which may not have run."""
    if frame.f_code.co_name == "<module>":
        return tree.body
    line = frame.f_lineno
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
              and n.name == frame.f_code.co_name and n.lineno <= line <= (n.end_lineno or 0)]
    return scopes[-1].body if scopes else []


def answer_sources(frame: FrameType | None = None) -> tuple[list[ast.AST], str] | None:
    """The code that made the answer, as syntax trees, and the file they come from: the
    positional arguments of the check call on the calling line, and (followed back through the cell) the
    last assignment of each name they use and the functions they call; a name the cell does not
    assign is followed into earlier cells (IPython's input history). None where the calling
    code's source cannot be read."""
    frame = frame or students_frame()
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <=
             (n.end_lineno or n.lineno) and getattr(n.func, "attr", getattr(n.func, "id", ""))
             .startswith("check_")]
    if not calls:
        return None
    parts: list[ast.AST] = list(calls[-1].args)  # keywords pass the setup (T=..., read=...)
    body = _scope(tree, frame)
    defs: dict[str, list[ast.stmt]] = {}
    for stmt in [*body, *(n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef))]:
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign) and stmt.lineno < line:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        defs.setdefault(n.id, []).append(stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.ClassDef) and stmt.lineno < line:
            defs.setdefault(stmt.name, []).append(stmt)
    seen: set[str] = set()
    queue = list(parts)
    found: list[ast.AST] = list(parts)
    while queue:
        node = queue.pop()
        for n in ast.walk(node):
            if not isinstance(n, ast.Name) or n.id in seen:
                continue
            seen.add(n.id)
            if n.id in defs:
                stmt = max(defs[n.id], key=lambda d: d.lineno)  # the last one before the call
                found.append(stmt)
                queue.append(stmt)
            elif len(seen) < 20 and (earlier := last_assignment(n.id)) is not None:
                found.append(earlier[0])  # made in an earlier cell
                queue.append(earlier[0])
    return found, filename


def _answer_codes(frame: FrameType) -> list[CodeType]:
    """The code that made the answer, compiled (the whole calling cell where it cannot be read)."""
    sources = answer_sources(frame)
    if sources is None:
        return [frame.f_code]
    nodes, filename = sources
    codes = []
    for node in nodes:
        if isinstance(node, ast.expr):
            codes.append(compile(ast.Expression(node), filename, "eval"))
        else:
            codes.append(compile(ast.Module(body=[node], type_ignores=[]), filename, "exec"))
    return codes


def reached_in_cell(forbid: tuple, allow: tuple = ()) -> list[str]:
    """The package functions and classes in `forbid` that the student's calling cell names.

    A value answer (a number, a mask) cannot run under the guard, so the code that made it is
    read instead: the check call's arguments and, back through the calling cell, the last
    assignment of each name they use (and the functions they call). Each name chain in it
    (`masks.padding_mask`, an alias imported earlier, `KVCache(...).nbytes`) is resolved in the
    cell's namespace to the object it names, and objects of the forbidden package code are
    reported by their dotted name. In a notebook, a name the calling cell does not assign is
    followed into the cell that last assigned it (IPython's input history); in a script, only
    the calling file is read.
    """
    from mha_course.integrity import _codes_of, _dotted, _is_package

    frame = students_frame()
    if frame is None:
        return []
    answer_codes = _answer_codes(frame)
    codes: set[CodeType] = set()
    files: set[str] = set()
    for f in forbid:
        c, fl = _codes_of(f)
        codes |= c
        files |= fl
    allowed: set[CodeType] = set()
    for a in allow:
        allowed |= _codes_of(a)[0]
    found: list[str] = []
    objects = itertools.chain.from_iterable(_named_objects(c, frame) for c in answer_codes)
    for obj in objects:
        if isinstance(obj, ModuleType):
            continue
        target = inspect.unwrap(obj) if callable(obj) else obj
        code = getattr(target, "__code__", None)
        if code is not None:
            if code in allowed or not (code in codes or code.co_filename in files):
                continue
            ref = _dotted(code)
        elif inspect.isclass(target) and (ref := _is_package(target)):
            module_file = os.path.abspath(getattr(sys.modules.get(target.__module__), "__file__",
                                                  "") or "")
            if target not in forbid and module_file not in files:
                continue
        else:
            continue
        if ref not in found:
            found.append(ref)
    return found


def refuse_if_reached(forbid: tuple, rule: str, allow: tuple = ()) -> None:
    """NotYet when the calling cell names package code in `forbid` (see reached_in_cell)."""
    found = reached_in_cell(forbid, allow)
    if found:
        not_yet(f"{rule}: the code that made your answer uses the package's own "
                f"{', '.join(found)}, so the answer is the package's, not yours")


def require_params(fn: Callable[..., Any], params: Sequence[str], what: str) -> None:
    """NotYet unless fn can be called with len(params) positional arguments; `what` names it."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call say
        return
    try:
        signature.bind(*params)
    except TypeError:
        count = ("no", "one", "two", "three", "four", "five", "six")[len(params)] \
            if len(params) < 7 else str(len(params))
        not_yet(f"{what} must take {count} arguments, ({', '.join(params)}), in that "
                f"order; yours is {getattr(fn, '__name__', 'a function')}{signature}")


def run_student(fn: Callable[..., Any], *args: Any, said_as: str | None = None,
                hint: Callable[[str], str] | None = None, forbid: tuple | None = None,
                allow: tuple = (), rule: str = "this exercise asks you to write it yourself",
                **kwargs: Any) -> Any:
    """fn(*args, **kwargs) under the grading guard; an error raised in the student's code becomes
    NotYet: '<said_as> raised ValueError: ... (line 3 in your fn: `...`)', plus hint(message)."""
    said_as = said_as or f"your {getattr(fn, '__name__', 'function')}"
    try:
        return guarded(fn, *args, forbid=forbid, allow=allow, rule=rule, **kwargs)
    except NotYet:
        raise
    except Exception as err:  # noqa: BLE001 - the student's function may raise anything
        where = where_in_students_code(err.__traceback__)
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if where is None and isinstance(err, TypeError) and err.__traceback__ is not None \
                and err.__traceback__.tb_next is not None \
                and err.__traceback__.tb_next.tb_next is None:  # raised by the call itself
            not_yet(f"{said_as} cannot be called with these arguments ({text[:200]}): check the "
                    f"parameters it takes")
        if where is None:
            raise  # the checker's own bug
        extra = hint(text) if hint is not None else ""
        not_yet(f"{said_as} raised {type(err).__name__}{': ' + text[:200] if text else ''} "
                f"({where})" + (f". {extra}" if extra else ""))


# --- How a wrong answer relates to the right one -------------------------------------------


def _factor_table(factors: dict[str, float] | None) -> list[tuple[float, str]]:
    """(ratio, words) for each named factor, its reciprocal and products of two of them."""
    named = dict(factors or {})
    table: list[tuple[float, str]] = []
    items = [(v, k) for k, v in named.items() if v not in (0, 1)]
    for v, k in items:
        table += [(v, f"a factor {k} too big"), (1 / v, f"a factor {k} too small ({k} missing)")]
    for i, (v, k) in enumerate(items):
        for w, j in items[i + 1:]:
            table += [(v * w, f"factors {k} and {j} both too big"),
                      (1 / (v * w), f"factors {k} and {j} both missing")]
    return table


def _ratio_words(r: float, most: int = 16) -> str:
    """'exactly 2 times', 'exactly 1/8 of', or '3.14 times' (whole ratios up to `most`)."""
    for k in (round(r), round(1 / r) if r else 0):
        if 2 <= k <= most and math.isclose(r, k, rel_tol=1e-9):
            return f"exactly {k} times"
        if 2 <= k <= most and math.isclose(r, 1 / k, rel_tol=1e-9):
            return f"exactly 1/{k} of"
    return f"{r:.3g} times"


def describe_number(got: float, want: float, name: str = "your answer",
                    factors: dict[str, float] | None = None, rtol: float = 1e-9) -> str:
    """How one number relates to the right one (ratio, offset, sign, square), without showing it."""
    got, want = float(got), float(want)

    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)

    if close(got, want):
        return f"{name} is right"
    said: list[str] = []
    if want != 0:
        r = got / want
        fits = [words for value, words in _factor_table(factors) if close(r, value)]
        if fits:
            said.append(f"{name} is {_ratio_words(r, most=2**40)} the right value: "
                        + ("; or ".join(dict.fromkeys(fits)) if len(fits) > 1 else fits[0])
                        + (" (two slips give this value)" if len(set(fits)) > 1 else ""))
        elif close(r, -1):
            said.append(f"{name} has the right size but the wrong sign")
        elif want > 0 and got > 0 and close(got, want * want):
            said.append(f"{name} is the right value squared")
        elif want > 0 and got > 0 and close(got * got, want):
            said.append(f"{name} is the square root of the right value")
    diff = got - want
    if not said and float(diff).is_integer() and abs(diff) <= 2 and float(want).is_integer():
        said.append(f"{name} is off by {abs(int(diff))}: {int(abs(diff))} "
                    f"{'more' if diff > 0 else 'less'} than the right value (an off-by-one in a "
                    f"count or a range?)")
    if not said:
        if want == 0:
            said.append(f"{name} should be zero")
        else:
            said.append(f"{name} is {_bracket(got / want)} the right value")
    return said[0]


def _ratio_story(r: float, name: str, factors: dict[str, float] | None) -> str:
    """'every entry is exactly 2 times the right one: a factor 2 (K and V) too big' for a ratio."""
    fits = [words for value, words in _factor_table(factors)
            if math.isclose(r, value, rel_tol=1e-9)]
    if math.isclose(r, -1.0, rel_tol=1e-9):
        return f"{name} has the right size but the wrong sign"
    if not fits:
        words = _bracket(r)
        if words.startswith("between"):  # the same factor everywhere is itself the clue
            return (f"{name} is the same multiple of the right one, {words} it: a "
                    f"constant factor that does not belong (a scale, a rescaling, a count "
                    f"divided by?)")
        return f"{name} is {words} the right one"
    named = "; or ".join(dict.fromkeys(fits))
    if len(set(fits)) > 1:
        named += " (two slips give this value)"
    return f"{name} is {_ratio_words(r, most=2**40)} the right one: {named}"


def _bracket(r: float) -> str:
    """A whole ratio exactly ('exactly 3 times'); any other only by the powers of 2 around it
    ('between 1/2 and 1 times'), so dividing it out cannot recover the answer."""
    words = _ratio_words(r)
    if words.startswith("exactly"):
        return words
    if r == 0:
        return "zero, not"
    if r < 0:
        return "of the opposite sign to"
    lo = 2.0 ** math.floor(math.log2(r))

    def frac(x: float) -> str:
        return f"{x:g}" if x >= 1 else f"1/{1 / x:g}"

    return f"between {frac(lo)} and {frac(2 * lo)} times"


def _index(ix: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(int(i)) for i in ix) + "]"


def _shape_story(g: np.ndarray, w: np.ndarray, name: str, show_shape: bool, close) -> str:
    """Why the shapes differ: axes in another order, a missing reshape, an extra axis..."""
    wanted = f" (wanted {w.shape})" if show_shape else ""
    if g.size == w.size and g.ndim == w.ndim and sorted(g.shape) == sorted(w.shape):
        for perm in itertools.permutations(range(w.ndim)):
            if w.transpose(perm).shape == g.shape and close(g, w.transpose(perm)):
                return (f"{name} has the right numbers with its axes in another order: shape "
                        f"{g.shape}{wanted}; a transpose is missing or one too many")
    if g.squeeze().shape == w.squeeze().shape and close(g.reshape(w.shape), w):
        extra = "an extra" if g.ndim > w.ndim else "a missing"
        return (f"{name} has the right numbers in the wrong shape {g.shape}{wanted}: {extra} "
                f"axis of size 1")
    if g.size == w.size and close(g.reshape(w.shape), w):
        return (f"{name} has the right numbers in the wrong shape {g.shape}{wanted}: a reshape "
                f"is missing")
    if g.size == w.size:
        return (f"{name} has the right number of entries but shape {g.shape}{wanted}, and its "
                f"numbers are not the right ones rearranged: a reshape before the transpose it "
                f"needs mixes entries (e.g. .view on a transposed tensor)")
    if g.squeeze().shape == w.squeeze().shape:
        extra = "an extra" if g.ndim > w.ndim else "a missing"
        return f"{name} has {extra} axis of size 1: shape {g.shape}{wanted}"
    if w.size and g.size % w.size == 0:
        return f"{name} has {g.size // w.size} times as many entries as wanted: shape {g.shape}{wanted}"
    if g.size and w.size % g.size == 0:
        return f"{name} has 1/{w.size // g.size} of the entries wanted: shape {g.shape}{wanted}"
    return f"{name} has shape {g.shape}{wanted}"


def _bool_story(g: np.ndarray, w: np.ndarray, name: str) -> str:
    """How a boolean mask differs: inverted, transposed, shifted, too open or too closed."""
    if np.array_equal(g, w):
        return f"{name} is right"
    if np.array_equal(g, ~w):
        return (f"{name} is inverted: True exactly where it should be False. True here means "
                f"'may attend'; a mask with True = blocked (torch's key_padding_mask convention) "
                f"is its negation, ~mask")
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2] and np.array_equal(g, np.swapaxes(w, -1, -2)):
        return f"{name} is transposed: rows are queries and columns keys, not the other way round"
    differ = g != w
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2]:
        on_diagonal = np.broadcast_to(np.eye(g.shape[-1], dtype=bool), g.shape)
        if not (differ & ~on_diagonal).any():
            how = "blocks" if (w & ~g).any() else "allows"
            return (f"{name} {how} the diagonal wrongly: whether a query may see the key at its "
                    f"own position (< where <= belongs, or the other way round)")
    for axis in range(g.ndim):
        for shift in (1, -1):
            if g.shape[axis] > 2 and _shifted_close(g, w, axis, shift, np.array_equal):
                return (f"{name} is shifted by one along axis {axis}: a boundary is off by one "
                        f"(< instead of <=, or a length minus one?)")
    extra = g & ~w
    missing = w & ~g
    said = []
    if extra.any():
        said.append(f"allows {int(extra.sum())} entr{'y' if extra.sum() == 1 else 'ies'} that "
                    f"should be blocked (first at {_index(np.argwhere(extra)[0])})")
    if missing.any():
        said.append(f"blocks {int(missing.sum())} entr{'y' if missing.sum() == 1 else 'ies'} that "
                    f"should be allowed (first at {_index(np.argwhere(missing)[0])})")
    return f"{name} " + " and ".join(said)


def relate(got: Any, want: Any, name: str = "your answer",
           factors: dict[str, float] | None = None, atol: float = 1e-8, rtol: float = 1e-6,
           show_shape: bool = True) -> str:
    """A sentence saying how `got` differs from `want`, without showing `want`.

    Tries, in order: shape (axes permuted, a missing reshape, an extra axis), non-finite
    entries, booleans (inverted, transposed, shifted, too open or closed), then numbers:
    transposed, axes permuted, reversed or shifted along an axis, a constant ratio (named from
    `factors`), a constant offset, and finally the first entry that differs.
    """
    g = read_array(got, f"{name} must be an array")
    w = np.asarray(want)
    if g.dtype == object or (g.dtype.kind not in "biuf" and g.size):
        return f"{name} holds {g.dtype} entries, not numbers"
    if w.ndim == 0 and g.ndim == 0:
        if g.dtype == np.bool_ or w.dtype == np.bool_:
            return f"{name} is {bool(g)}, which is not right"
        return describe_number(float(g), float(w), name, factors)

    def close(a: np.ndarray, b: np.ndarray) -> bool:
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol))

    if g.shape != w.shape:
        if g.dtype == np.bool_ or w.dtype == np.bool_:
            return _shape_story(g.astype(bool), w.astype(bool), name, show_shape, np.array_equal)
        return _shape_story(g.astype(np.float64), w.astype(np.float64), name, show_shape, close)
    if g.dtype == np.bool_ and w.dtype == np.bool_:
        return _bool_story(g, w, name)
    g = g.astype(np.float64)
    w = w.astype(np.float64)
    bad = ~np.isfinite(g) & np.isfinite(w)
    if bad.any():
        first = _index(np.argwhere(bad)[0])
        kind = "NaN" if np.isnan(g[tuple(np.argwhere(bad)[0])]) else "inf"
        return (f"{name} has {int(bad.sum())} non-finite entr{'y' if bad.sum() == 1 else 'ies'} "
                f"where a number belongs (first at {first}: {kind}; NaN often comes from "
                f"-inf - (-inf) or 0/0, e.g. a row that is masked everywhere)")
    if close(g, w):
        return f"{name} is right"
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2] and close(g, np.swapaxes(w, -1, -2)):
        return f"{name} is transposed: its last two axes are swapped"
    if g.ndim <= 5:
        for perm in itertools.permutations(range(g.ndim)):
            if perm != tuple(range(g.ndim)) and close(g, w.transpose(perm)):
                return (f"{name} has its axes mixed up: the entries are right but axis order "
                        f"{perm} of the right layout; a transpose is wrong")
    for axis in range(g.ndim):
        if g.shape[axis] > 1 and close(g, np.flip(w, axis)):
            return f"{name} is reversed along axis {axis}"
    for axis in range(g.ndim):
        for shift in (1, -1):
            if g.shape[axis] > 2 and _shifted_close(g, w, axis, shift, close):
                return (f"{name} is shifted by one along axis {axis}: entry i holds what belongs "
                        f"at i {'-' if shift > 0 else '+'} 1 (an off-by-one in an index or a range)")
    nonzero = np.abs(w) > atol
    if nonzero.any() and np.allclose(g[~nonzero], 0, atol=atol):
        ratios = g[nonzero] / w[nonzero]
        r = float(np.median(ratios))
        if r != 0 and np.allclose(ratios, r, rtol=max(rtol, 1e-9), atol=0):
            return _ratio_story(r, f"every entry of {name}", factors)
    d = g - w
    if np.allclose(d, d.flat[0], rtol=0, atol=max(atol, rtol * float(np.abs(w).max()))):
        c = float(d.flat[0])
        one = " (off by one?)" if math.isclose(abs(c), 1.0) else ""
        return f"every entry of {name} is {c:+.3g} away from the right one{one}"
    scale = float(np.abs(w).max()) or 1.0
    rel = float(np.abs(g - w).max()) / scale
    if rel < 2e-2:  # every entry close: the rounding of a low-precision dtype, not a slip
        return (f"{name} is close to right everywhere but not equal: off by up to {rel:.1g} of "
                f"the largest entry, the size of float16 or bfloat16 rounding (float32's is "
                f"about 1e-7): was a step computed in low precision?")
    wrong = ~np.isclose(g, w, rtol=rtol, atol=atol)
    first = tuple(int(i) for i in np.argwhere(wrong)[0])
    n_ok = int((~wrong).sum())
    story = _slices_story(wrong)
    return (f"{name}: {n_ok} of {g.size} entries are right{story}; the first that differs is at "
            f"{_index(first)}, where you have {g[first]:.4g}")


def _shifted_close(g: np.ndarray, w: np.ndarray, axis: int, shift: int, close) -> bool:
    """g[i] == w[i - shift] along `axis` on the overlap."""
    n = g.shape[axis]
    a = [slice(None)] * g.ndim
    b = [slice(None)] * g.ndim
    a[axis], b[axis] = (slice(shift, None), slice(None, n - shift)) if shift > 0 else \
        (slice(None, n + shift), slice(-shift, None))
    return close(g[tuple(a)], w[tuple(b)])


def _slices_story(wrong: np.ndarray) -> str:
    """' (wrong only where axis 1 is 2, 3)' when the wrong entries sit in a few slices of one axis."""
    if wrong.ndim < 2:
        return ""
    for axis in range(wrong.ndim):
        other = tuple(a for a in range(wrong.ndim) if a != axis)
        bad_idx = np.flatnonzero(wrong.any(axis=other))
        if 0 < len(bad_idx) < wrong.shape[axis] and wrong.take(bad_idx, axis=axis).all():
            shown = ", ".join(str(int(i)) for i in bad_idx[:6]) + (", ..." if len(bad_idx) > 6 else "")
            return f" (all the wrong ones sit where axis {axis} is {shown})"
    return ""


# --- Masks in every convention ----------------------------------------------------------------


def read_mask(answer: Any, name: str = "the mask",
              shape: Sequence[int] | None = None) -> tuple[np.ndarray, str]:
    """(allowed, convention) for a mask in any convention: booleans ("bool", True = may
    attend as read), 0/1 numbers ("0/1"), or additive 0 / -inf or a big negative ("additive")."""
    value = read_array(answer, f"{name} must be an array of booleans")
    if shape is not None and value.shape != tuple(shape):
        not_yet(f"{name} must have shape {tuple(shape)}, got shape {value.shape}")
    if value.dtype == np.bool_:
        return value, "bool"
    if value.dtype.kind not in "iuf":
        not_yet(f"{name} must hold booleans (True = may attend), got dtype {value.dtype}")
    if value.size == 0:
        return value.astype(bool), "bool"
    if np.isin(value, (0, 1)).all():
        return value == 1, "0/1"
    finite = np.isfinite(value)
    if value.dtype.kind == "f" and np.all((value == 0) | (value <= -1e4) | (~finite & (value < 0))):
        return value == 0, "additive"
    not_yet(f"{name} must be a mask: booleans (True = may attend), or an additive float mask of "
            f"0 (attend) and -inf (blocked); got numbers that are neither, e.g. "
            f"{value[(value != 0) & (value != 1)].flat[0]:.4g}")


_CONVENTION = {"bool": "booleans", "0/1": "0/1 numbers",
               "additive": "an additive mask (0 = attend, -inf = blocked)"}


def mask_verdict(answer: Any, want_allowed: Any, name: str = "the mask",
                 accept: Sequence[str] = ("bool", "0/1", "additive")) -> str | None:
    """None if the answer is the wanted mask in an accepted convention, else what differs."""
    want = np.asarray(want_allowed, dtype=bool)
    got, convention = read_mask(answer, name)
    if got.shape != want.shape:
        return _shape_story(got, want, name, True, np.array_equal)
    if np.array_equal(got, want):
        if convention in accept:
            return None
        return (f"{name} marks the right places, as {_CONVENTION[convention]}; this exercise wants "
                f"booleans with True = may attend" + (" (mask == 0 gives them)"
                                                      if convention == "additive" else
                                                      " (mask == 1 gives them)"))
    if np.array_equal(got, ~want):
        if convention == "additive":
            return (f"{name} has 0 and -inf swapped: an additive mask adds 0 where attention is "
                    f"allowed and -inf where it is blocked")
        if convention == "0/1":
            return (f"{name} is inverted: 1 where attention is blocked; here 1 (True) means may "
                    f"attend, so flip it with mask == 0 (not ~mask: on integers ~ is a bitwise "
                    f"not, giving -1 and -2; and not .astype(bool), which keeps it inverted)")
        return (f"{name} is inverted: True where attention is blocked, the convention of torch's "
                f"key_padding_mask and of nn.MultiheadAttention's boolean attn_mask; here (as in "
                f"SDPA's boolean attn_mask) True means may attend, so negate it with ~mask "
                f"(not .astype(bool), which keeps it inverted)")
    read = "" if convention == "bool" else f" (read as {_CONVENTION[convention]})"
    return _bool_story(got, want, name) + read
