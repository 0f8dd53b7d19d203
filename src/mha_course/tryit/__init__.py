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

from mha_course.i18n import LANGUAGES, _, catalog, language
from mha_course.integrity import _LIBS, _PKG_DIR


class NotYet(AssertionError):
    """A self-check's verdict on a wrong answer: the message names the mistake."""


# The three verdicts, each a prefix and the check's words; the prefix is in the learner's language.
_NOT_TRIED, _RIGHT, _NOT_YET = "not tried yet: {what}", "right: {why}", "not yet: {why}"


def not_tried(what: str) -> str:
    """The message for the untouched placeholder: what to write, nothing about the answer."""
    return _("not tried yet: {what}").format(what=what)


def right(why: str) -> str:
    """The message for a right answer."""
    return _("right: {why}").format(why=why)


def not_yet_text(why: str) -> str:
    """The text of a 'not yet' verdict (what `not_yet` raises)."""
    return _("not yet: {why}").format(why=why)


def not_yet(why: str) -> NoReturn:
    """Reject a wrong answer with a message that names the mistake."""
    raise NotYet(not_yet_text(why))


@functools.cache
def _prefixes(template: str) -> tuple[str, ...]:
    """The verdict's prefix in every language ('right: ', '对了：'), longest first."""
    found = {template.split("{")[0]}
    found |= {catalog(lang).get(template, template).split("{")[0] for lang in LANGUAGES}
    return tuple(sorted(found, key=len, reverse=True))


def is_right(said: str) -> bool:
    """True for a 'right' verdict, in either language."""
    return str(said).startswith(_prefixes(_RIGHT))


def is_not_tried(said: str) -> bool:
    """True for a 'not tried yet' verdict, in either language."""
    return str(said).startswith(_prefixes(_NOT_TRIED))


def words_of(said: str) -> str:
    """A verdict without its prefix ('right: ', 'not yet: ', ...; either language)."""
    said = str(said)
    for template in (_NOT_TRIED, _RIGHT, _NOT_YET):
        for prefix in _prefixes(template):
            if said.startswith(prefix):
                return said[len(prefix):].strip()
    return said.strip()


def joined(parts: Iterable[str]) -> str:
    """Clauses joined as one sentence's list: '; ' in English, '；' in Chinese."""
    return ("；" if language() == "zh_CN" else "; ").join(parts)


def as_number(answer: Any, name: str, integer: bool = False) -> float | int:
    """The answer as a plain number, or NotYet saying what arrived instead (text, a list, ...)."""
    if isinstance(answer, bool | np.bool_) or isinstance(answer, str | bytes):
        not_yet(_("{name} must be a number, got {kind} {answer!r}").format(
            name=name, kind=type(answer).__name__, answer=answer))
    try:
        value = np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer)
    except Exception:  # noqa: BLE001 - anything that is not array-like
        not_yet(_("{name} must be a number, got {kind}").format(name=name,
                                                                 kind=type(answer).__name__))
    if value.shape == (1,) and not isinstance(answer, list | tuple):
        value = value.reshape(())  # a one-element array or tensor is one number
    if value.shape != () or not np.issubdtype(value.dtype, np.number):
        not_yet(_("{name} must be one number, got {kind} of shape {shape} and dtype {dtype}").format(
            name=name, kind=type(answer).__name__, shape=value.shape, dtype=value.dtype))
    if not np.isfinite(value):
        not_yet(_("{name} must be a finite number, got {value}").format(name=name,
                                                                         value=value.item()))
    if integer:
        if float(value) != int(value):
            not_yet(_("{name} must be a whole number, got {value}").format(name=name,
                                                                            value=value.item()))
        return int(value)
    return float(value)


def read_array(answer: Any, expected: str) -> np.ndarray:
    """Any array-like answer (a list, a numpy array, a torch tensor) as numpy, or NotYet.

    `expected` says what was wanted, e.g. "positions must be a (3, 5) int array".
    """
    if isinstance(answer, str | bytes):
        not_yet(_("{expected}, got text {answer!r:.40}").format(expected=expected, answer=answer))
    try:
        return np.asarray(answer.detach().cpu() if hasattr(answer, "detach") else answer)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        not_yet(_("{expected}, got {kind} that numpy cannot read as one (rows of different "
                  "lengths?)").format(expected=expected, kind=type(answer).__name__))


def as_array(answer: Any, name: str, shape: Sequence[int] | None = None, kind: str = "number",
             ) -> np.ndarray:
    """The answer as an array of the expected shape and kind ("number", "int" or "bool").

    Raises NotYet, not a numpy error, for text, ragged lists, a wrong shape or a wrong dtype.
    Whole numbers stored as floats (1.0, 2.0) are read as ints.
    """
    value = read_array(answer, _("{name} must be an array").format(name=name))
    if kind == "int" and value.dtype.kind == "f" and value.size and np.isfinite(value).all() \
            and (value == np.round(value)).all():
        value = value.astype(np.int64)
    want = {"number": _("numbers"), "int": _("whole numbers (an int array)"),
            "bool": _("booleans (True = may attend)")}[kind]
    ok = {"number": np.issubdtype(value.dtype, np.number) and value.dtype != np.bool_,
          "int": np.issubdtype(value.dtype, np.integer),
          "bool": value.dtype == np.bool_}[kind]
    if shape is not None and value.shape != tuple(shape):
        not_yet(_("{name} must have shape {want}, got shape {got}").format(
            name=name, want=tuple(shape), got=value.shape))
    if not ok:
        if kind == "bool" and np.issubdtype(value.dtype, np.number):
            not_yet(_("{name} must hold {want}, got dtype {dtype} (e.g. .astype(bool))").format(
                name=name, want=want, dtype=value.dtype))
        not_yet(_("{name} must hold {want}, got dtype {dtype}").format(name=name, want=want,
                                                                       dtype=value.dtype))
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
    slips = _("; or ").join(found)
    if len(found) == 2:
        return _("two slips give this same value: {slips}").format(slips=slips)
    return _("{n} slips give this same value: {slips}").format(n=len(found), slips=slips)


def transposed_match(got: np.ndarray, mistakes: Iterable[tuple[Any, str]]) -> str | None:
    """For a (T, S) answer that fits no mistake: does it fit one once turned round? Then both
    slips are named, the transpose and the other."""
    got = np.asarray(got)
    if got.ndim < 2 or got.shape[-1] != got.shape[-2]:
        return None
    why = first_match(np.swapaxes(got, -1, -2), mistakes)
    if why is None:
        return None
    return _("two slips: it is transposed (rows must be the queries, columns the keys), and "
             "turned round, {why}").format(why=why)


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
            return _("two slips: it is inverted, True where attention is blocked (torch's "
                     "key_padding_mask convention; here True means may attend), and transposed "
                     "(rows must be the queries, columns the keys)")
    mistakes = list(mistakes)
    why = first_match(~got, mistakes) or transposed_match(~got, mistakes)
    if why is None:
        return None
    return _("two slips: it is inverted, True where attention is blocked (torch's "
             "key_padding_mask convention; here True means may attend), and negated back, "
             "{why}").format(why=why)


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
                found.append(_("{a} together with {b}").format(a=why_a, b=why_b))
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
        return is_right(self)

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
    if code.co_name == "<module>":
        if line:
            return _("line {lineno}: `{line}`").format(lineno=lineno, line=line)
        return _("line {lineno}").format(lineno=lineno)
    if line:
        return _("line {lineno} in your {fn}: `{line}`").format(lineno=lineno, fn=code.co_name,
                                                                 line=line)
    return _("line {lineno} in your {fn}").format(lineno=lineno, fn=code.co_name)


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
            if text:
                return Verdict(not_yet_text(_("your code raised {error}: {text} ({where})").format(
                    error=type(err).__name__, text=text[:300], where=where)))
            return Verdict(not_yet_text(_("your code raised {error} ({where})").format(
                error=type(err).__name__, where=where)))
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
    if all(is_right(s) for s in said.values()):
        return right(joined(f"{n}: {words_of(s)}" for n, s in said.items()))
    if all(is_not_tried(s) for s in said.values()):
        return not_tried(joined(f"{n}: {words_of(s)}" for n, s in said.items()))
    n_right = sum(is_right(s) for s in said.values())
    lines = "\n".join(f"  - {n}: {s}" for n, s in said.items())
    not_yet(_("{n_right} of {n} parts right\n{lines}").format(n_right=n_right, n=len(said),
                                                              lines=lines))


def guarded(fn: Callable[..., Any], *args: Any, forbid: tuple | None = None, allow: tuple = (),
            rule: str | None = None, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) under the grading guard: reaching the package's reference is NotYet.

    forbid / allow as in mha_course.integrity.guard (default: the whole package is off limits).
    """
    from mha_course import integrity  # the course's guard; imported late to keep this module light

    name = getattr(fn, "__name__", _("your function"))
    rule = _("this exercise asks you to write it yourself") if rule is None else rule
    try:
        with integrity.guard(fn, forbid=forbid, allow=allow, grader=()) as watch:
            result = fn(*args, **kwargs)
    except integrity.ReferenceUsed:
        refs = ", ".join(sorted(watch.found))
        not_yet(_("{rule}: your {name} used the package's own {refs}, so this checks the "
                  "package, not your work").format(rule=rule, name=name, refs=refs))
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
        not_yet(_("{rule}: the code that made your answer uses the package's own {refs}, so the "
                  "answer is the package's, not yours").format(rule=rule, refs=", ".join(found)))


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
            if len(params) < 7 and language() == "en" else str(len(params))
        not_yet(_("{what} must take {count} arguments, ({params}), in that order; yours is "
                  "{fn}{signature}").format(what=what, count=count, params=", ".join(params),
                                            fn=getattr(fn, "__name__", _("a function")),
                                            signature=signature))


def run_student(fn: Callable[..., Any], *args: Any, said_as: str | None = None,
                hint: Callable[[str], str] | None = None, forbid: tuple | None = None,
                allow: tuple = (), rule: str | None = None, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) under the grading guard; an error raised in the student's code becomes
    NotYet: '<said_as> raised ValueError: ... (line 3 in your fn: `...`)', plus hint(message)."""
    said_as = said_as or _("your {fn}").format(fn=getattr(fn, "__name__", "function"))
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
            not_yet(_("{said_as} cannot be called with these arguments ({text}): check the "
                      "parameters it takes").format(said_as=said_as, text=text[:200]))
        if where is None:
            raise  # the checker's own bug
        extra = hint(text) if hint is not None else ""
        if text:
            said = _("{said_as} raised {error}: {text} ({where})").format(
                said_as=said_as, error=type(err).__name__, text=text[:200], where=where)
        else:
            said = _("{said_as} raised {error} ({where})").format(
                said_as=said_as, error=type(err).__name__, where=where)
        not_yet(_("{said}. {extra}").format(said=said, extra=extra) if extra else said)


# --- How a wrong answer relates to the right one -------------------------------------------


def _factor_table(factors: dict[str, float] | None) -> list[tuple[float, str]]:
    """(ratio, words) for each named factor, its reciprocal and products of two of them."""
    named = dict(factors or {})
    table: list[tuple[float, str]] = []
    items = [(v, k) for k, v in named.items() if v not in (0, 1)]
    for v, k in items:
        table += [(v, _("a factor {k} too big").format(k=k)),
                  (1 / v, _("a factor {k} too small ({k} missing)").format(k=k))]
    for i, (v, k) in enumerate(items):
        for w, j in items[i + 1:]:
            table += [(v * w, _("factors {k} and {j} both too big").format(k=k, j=j)),
                      (1 / (v * w), _("factors {k} and {j} both missing").format(k=k, j=j))]
    return table


def _ratio_words(r: float, most: int = 16) -> str:
    """'exactly 2 times', 'exactly 1/8 of', or '3.14 times' (whole ratios up to `most`)."""
    for k in (round(r), round(1 / r) if r else 0):
        if 2 <= k <= most and math.isclose(r, k, rel_tol=1e-9):
            return _("exactly {k} times").format(k=k)
        if 2 <= k <= most and math.isclose(r, 1 / k, rel_tol=1e-9):
            return _("exactly 1/{k} of").format(k=k)
    return _("{r:.3g} times").format(r=r)


def _exact(words: str) -> bool:
    """True for the words of an exact ratio ('exactly 2 times', in either language)."""
    return words.startswith(_prefixes("exactly {k} times")) or \
        words.startswith(_prefixes("exactly 1/{k} of"))


def describe_number(got: float, want: float, name: str | None = None,
                    factors: dict[str, float] | None = None, rtol: float = 1e-9) -> str:
    """How one number relates to the right one (ratio, offset, sign, square), without showing it."""
    got, want = float(got), float(want)
    name = _("your answer") if name is None else name

    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)

    if close(got, want):
        return _("{name} is right").format(name=name)
    said: list[str] = []
    if want != 0:
        r = got / want
        fits = [words for value, words in _factor_table(factors) if close(r, value)]
        if fits and len(set(fits)) > 1:
            said.append(_("{name} is {ratio} the right value: {why} (two slips give this "
                          "value)").format(name=name, ratio=_ratio_words(r, most=2**40),
                                           why=_("; or ").join(dict.fromkeys(fits))))
        elif fits:
            said.append(_("{name} is {ratio} the right value: {why}").format(
                name=name, ratio=_ratio_words(r, most=2**40), why=fits[0]))
        elif close(r, -1):
            said.append(_("{name} has the right size but the wrong sign").format(name=name))
        elif want > 0 and got > 0 and close(got, want * want):
            said.append(_("{name} is the right value squared").format(name=name))
        elif want > 0 and got > 0 and close(got * got, want):
            said.append(_("{name} is the square root of the right value").format(name=name))
    diff = got - want
    if not said and float(diff).is_integer() and abs(diff) <= 2 and float(want).is_integer():
        if diff > 0:
            said.append(_("{name} is off by {n}: {n} more than the right value (an off-by-one in "
                          "a count or a range?)").format(name=name, n=abs(int(diff))))
        else:
            said.append(_("{name} is off by {n}: {n} less than the right value (an off-by-one in "
                          "a count or a range?)").format(name=name, n=abs(int(diff))))
    if not said:
        if want == 0:
            said.append(_("{name} should be zero").format(name=name))
        else:
            said.append(_("{name} is {ratio} the right value").format(name=name,
                                                                      ratio=_bracket(got / want)))
    return said[0]


def _ratio_story(r: float, name: str, factors: dict[str, float] | None) -> str:
    """'every entry is exactly 2 times the right one: a factor 2 (K and V) too big' for a ratio."""
    fits = [words for value, words in _factor_table(factors)
            if math.isclose(r, value, rel_tol=1e-9)]
    if math.isclose(r, -1.0, rel_tol=1e-9):
        return _("{name} has the right size but the wrong sign").format(name=name)
    if not fits:
        words = _bracket(r)
        if r > 0 and not _exact(words):  # the same factor everywhere is itself the clue
            return _("{name} is the same multiple of the right one, {ratio} it: a constant "
                     "factor that does not belong (a scale, a rescaling, a count divided "
                     "by?)").format(name=name, ratio=words)
        return _("{name} is {ratio} the right one").format(name=name, ratio=words)
    named = _("; or ").join(dict.fromkeys(fits))
    if len(set(fits)) > 1:
        return _("{name} is {ratio} the right one: {why} (two slips give this value)").format(
            name=name, ratio=_ratio_words(r, most=2**40), why=named)
    return _("{name} is {ratio} the right one: {why}").format(
        name=name, ratio=_ratio_words(r, most=2**40), why=named)


def _bracket(r: float) -> str:
    """A whole ratio exactly ('exactly 3 times'); any other only by the powers of 2 around it
    ('between 1/2 and 1 times'), so dividing it out cannot recover the answer."""
    words = _ratio_words(r)
    if _exact(words):
        return words
    if r == 0:
        return _("zero, not")
    if r < 0:
        return _("of the opposite sign to")
    lo = 2.0 ** math.floor(math.log2(r))

    def frac(x: float) -> str:
        return f"{x:g}" if x >= 1 else f"1/{1 / x:g}"

    return _("between {lo} and {hi} times").format(lo=frac(lo), hi=frac(2 * lo))


def _index(ix: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(int(i)) for i in ix) + "]"


def _shape_story(g: np.ndarray, w: np.ndarray, name: str, show_shape: bool, close) -> str:
    """Why the shapes differ: axes in another order, a missing reshape, an extra axis..."""
    wanted = _(" (wanted {shape})").format(shape=w.shape) if show_shape else ""
    shape = g.shape
    if g.size == w.size and g.ndim == w.ndim and sorted(g.shape) == sorted(w.shape):
        for perm in itertools.permutations(range(w.ndim)):
            if w.transpose(perm).shape == g.shape and close(g, w.transpose(perm)):
                return _("{name} has the right numbers with its axes in another order: shape "
                         "{shape}{wanted}; a transpose is missing or one too many").format(
                    name=name, shape=shape, wanted=wanted)
    if g.squeeze().shape == w.squeeze().shape and close(g.reshape(w.shape), w):
        if g.ndim > w.ndim:
            return _("{name} has the right numbers in the wrong shape {shape}{wanted}: an extra "
                     "axis of size 1").format(name=name, shape=shape, wanted=wanted)
        return _("{name} has the right numbers in the wrong shape {shape}{wanted}: a missing "
                 "axis of size 1").format(name=name, shape=shape, wanted=wanted)
    if g.size == w.size and close(g.reshape(w.shape), w):
        return _("{name} has the right numbers in the wrong shape {shape}{wanted}: a reshape "
                 "is missing").format(name=name, shape=shape, wanted=wanted)
    if g.size == w.size:
        return _("{name} has the right number of entries but shape {shape}{wanted}, and its "
                 "numbers are not the right ones rearranged: a reshape before the transpose it "
                 "needs mixes entries (e.g. .view on a transposed tensor)").format(
            name=name, shape=shape, wanted=wanted)
    if g.squeeze().shape == w.squeeze().shape:
        if g.ndim > w.ndim:
            return _("{name} has an extra axis of size 1: shape {shape}{wanted}").format(
                name=name, shape=shape, wanted=wanted)
        return _("{name} has a missing axis of size 1: shape {shape}{wanted}").format(
            name=name, shape=shape, wanted=wanted)
    if w.size and g.size % w.size == 0:
        return _("{name} has {k} times as many entries as wanted: shape {shape}{wanted}").format(
            name=name, k=g.size // w.size, shape=shape, wanted=wanted)
    if g.size and w.size % g.size == 0:
        return _("{name} has 1/{k} of the entries wanted: shape {shape}{wanted}").format(
            name=name, k=w.size // g.size, shape=shape, wanted=wanted)
    return _("{name} has shape {shape}{wanted}").format(name=name, shape=shape, wanted=wanted)


def _bool_story(g: np.ndarray, w: np.ndarray, name: str) -> str:
    """How a boolean mask differs: inverted, transposed, shifted, too open or too closed."""
    if np.array_equal(g, w):
        return _("{name} is right").format(name=name)
    if np.array_equal(g, ~w):
        return _("{name} is inverted: True exactly where it should be False. True here means "
                 "'may attend'; a mask with True = blocked (torch's key_padding_mask convention) "
                 "is its negation, ~mask").format(name=name)
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2] and np.array_equal(g, np.swapaxes(w, -1, -2)):
        return _("{name} is transposed: rows are queries and columns keys, not the other way "
                 "round").format(name=name)
    differ = g != w
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2]:
        on_diagonal = np.broadcast_to(np.eye(g.shape[-1], dtype=bool), g.shape)
        if not (differ & ~on_diagonal).any():
            if (w & ~g).any():
                return _("{name} blocks the diagonal wrongly: whether a query may see the key at "
                         "its own position (< where <= belongs, or the other way "
                         "round)").format(name=name)
            return _("{name} allows the diagonal wrongly: whether a query may see the key at "
                     "its own position (< where <= belongs, or the other way "
                     "round)").format(name=name)
    for axis in range(g.ndim):
        for shift in (1, -1):
            if g.shape[axis] > 2 and _shifted_close(g, w, axis, shift, np.array_equal):
                return _("{name} is shifted by one along axis {axis}: a boundary is off by one "
                         "(< instead of <=, or a length minus one?)").format(name=name, axis=axis)
    extra = g & ~w
    missing = w & ~g
    said = []
    if extra.any():
        n, at = int(extra.sum()), _index(np.argwhere(extra)[0])
        said.append(_("allows {n} entry that should be blocked (first at {at})").format(n=n, at=at)
                    if n == 1 else
                    _("allows {n} entries that should be blocked (first at {at})").format(n=n, at=at))
    if missing.any():
        n, at = int(missing.sum()), _index(np.argwhere(missing)[0])
        said.append(_("blocks {n} entry that should be allowed (first at {at})").format(n=n, at=at)
                    if n == 1 else
                    _("blocks {n} entries that should be allowed (first at {at})").format(n=n, at=at))
    if len(said) == 2:
        return _("{name} {this} and {that}").format(name=name, this=said[0], that=said[1])
    return f"{name} {said[0]}"


def relate(got: Any, want: Any, name: str | None = None,
           factors: dict[str, float] | None = None, atol: float = 1e-8, rtol: float = 1e-6,
           show_shape: bool = True) -> str:
    """A sentence saying how `got` differs from `want`, without showing `want`.

    Tries, in order: shape (axes permuted, a missing reshape, an extra axis), non-finite
    entries, booleans (inverted, transposed, shifted, too open or closed), then numbers:
    transposed, axes permuted, reversed or shifted along an axis, a constant ratio (named from
    `factors`), a constant offset, and finally the first entry that differs.
    """
    name = _("your answer") if name is None else name
    g = read_array(got, _("{name} must be an array").format(name=name))
    w = np.asarray(want)
    if g.dtype == object or (g.dtype.kind not in "biuf" and g.size):
        return _("{name} holds {dtype} entries, not numbers").format(name=name, dtype=g.dtype)
    if w.ndim == 0 and g.ndim == 0:
        if g.dtype == np.bool_ or w.dtype == np.bool_:
            return _("{name} is {value}, which is not right").format(name=name, value=bool(g))
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
        if bad.sum() == 1:
            return _("{name} has {n} non-finite entry where a number belongs (first at {at}: "
                     "{kind}; NaN often comes from -inf - (-inf) or 0/0, e.g. a row that is "
                     "masked everywhere)").format(name=name, n=int(bad.sum()), at=first, kind=kind)
        return _("{name} has {n} non-finite entries where a number belongs (first at {at}: "
                 "{kind}; NaN often comes from -inf - (-inf) or 0/0, e.g. a row that is masked "
                 "everywhere)").format(name=name, n=int(bad.sum()), at=first, kind=kind)
    if close(g, w):
        return _("{name} is right").format(name=name)
    if g.ndim >= 2 and g.shape[-1] == g.shape[-2] and close(g, np.swapaxes(w, -1, -2)):
        return _("{name} is transposed: its last two axes are swapped").format(name=name)
    if g.ndim <= 5:
        for perm in itertools.permutations(range(g.ndim)):
            if perm != tuple(range(g.ndim)) and close(g, w.transpose(perm)):
                return _("{name} has its axes mixed up: the entries are right but axis order "
                         "{perm} of the right layout; a transpose is wrong").format(name=name,
                                                                                    perm=perm)
    for axis in range(g.ndim):
        if g.shape[axis] > 1 and close(g, np.flip(w, axis)):
            return _("{name} is reversed along axis {axis}").format(name=name, axis=axis)
    for axis in range(g.ndim):
        for shift in (1, -1):
            if g.shape[axis] > 2 and _shifted_close(g, w, axis, shift, close):
                return _("{name} is shifted by one along axis {axis}: entry i holds what belongs "
                         "at i {sign} 1 (an off-by-one in an index or a range)").format(
                    name=name, axis=axis, sign="-" if shift > 0 else "+")
    nonzero = np.abs(w) > atol
    if nonzero.any() and np.allclose(g[~nonzero], 0, atol=atol):
        ratios = g[nonzero] / w[nonzero]
        r = float(np.median(ratios))
        if r != 0 and np.allclose(ratios, r, rtol=max(rtol, 1e-9), atol=0):
            return _ratio_story(r, _("every entry of {name}").format(name=name), factors)
    d = g - w
    if np.allclose(d, d.flat[0], rtol=0, atol=max(atol, rtol * float(np.abs(w).max()))):
        c = float(d.flat[0])
        if math.isclose(abs(c), 1.0):
            return _("every entry of {name} is {c:+.3g} away from the right one (off by "
                     "one?)").format(name=name, c=c)
        return _("every entry of {name} is {c:+.3g} away from the right one").format(name=name,
                                                                                      c=c)
    scale = float(np.abs(w).max()) or 1.0
    rel = float(np.abs(g - w).max()) / scale
    if rel < 2e-2:  # every entry close: the rounding of a low-precision dtype, not a slip
        return _("{name} is close to right everywhere but not equal: off by up to {rel:.1g} of "
                 "the largest entry, the size of float16 or bfloat16 rounding (float32's is "
                 "about 1e-7): was a step computed in low precision?").format(name=name, rel=rel)
    wrong = ~np.isclose(g, w, rtol=rtol, atol=atol)
    first = tuple(int(i) for i in np.argwhere(wrong)[0])
    n_ok = int((~wrong).sum())
    story = _slices_story(wrong)
    return _("{name}: {n_ok} of {size} entries are right{story}; the first that differs is at "
             "{at}, where you have {value:.4g}").format(name=name, n_ok=n_ok, size=g.size,
                                                       story=story, at=_index(first),
                                                       value=g[first])


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
            return _(" (all the wrong ones sit where axis {axis} is {shown})").format(axis=axis,
                                                                                       shown=shown)
    return ""


# --- Masks in every convention ----------------------------------------------------------------


def read_mask(answer: Any, name: str | None = None,
              shape: Sequence[int] | None = None) -> tuple[np.ndarray, str]:
    """(allowed, convention) for a mask in any convention: booleans ("bool", True = may
    attend as read), 0/1 numbers ("0/1"), or additive 0 / -inf or a big negative ("additive")."""
    name = _("the mask") if name is None else name
    value = read_array(answer, _("{name} must be an array of booleans").format(name=name))
    if shape is not None and value.shape != tuple(shape):
        not_yet(_("{name} must have shape {want}, got shape {got}").format(
            name=name, want=tuple(shape), got=value.shape))
    if value.dtype == np.bool_:
        return value, "bool"
    if value.dtype.kind not in "iuf":
        not_yet(_("{name} must hold booleans (True = may attend), got dtype {dtype}").format(
            name=name, dtype=value.dtype))
    if value.size == 0:
        return value.astype(bool), "bool"
    if np.isin(value, (0, 1)).all():
        return value == 1, "0/1"
    finite = np.isfinite(value)
    if value.dtype.kind == "f" and np.all((value == 0) | (value <= -1e4) | (~finite & (value < 0))):
        return value == 0, "additive"
    not_yet(_("{name} must be a mask: booleans (True = may attend), or an additive float mask "
              "of 0 (attend) and -inf (blocked); got numbers that are neither, e.g. "
              "{example:.4g}").format(name=name,
                                      example=value[(value != 0) & (value != 1)].flat[0]))


def _convention(kind: str) -> str:
    return {"bool": _("booleans"), "0/1": _("0/1 numbers"),
            "additive": _("an additive mask (0 = attend, -inf = blocked)")}[kind]


def mask_verdict(answer: Any, want_allowed: Any, name: str | None = None,
                 accept: Sequence[str] = ("bool", "0/1", "additive")) -> str | None:
    """None if the answer is the wanted mask in an accepted convention, else what differs."""
    name = _("the mask") if name is None else name
    want = np.asarray(want_allowed, dtype=bool)
    got, convention = read_mask(answer, name)
    if got.shape != want.shape:
        return _shape_story(got, want, name, True, np.array_equal)
    if np.array_equal(got, want):
        if convention in accept:
            return None
        if convention == "additive":
            return _("{name} marks the right places, as {convention}; this exercise wants "
                     "booleans with True = may attend (mask == 0 gives them)").format(
                name=name, convention=_convention(convention))
        return _("{name} marks the right places, as {convention}; this exercise wants booleans "
                 "with True = may attend (mask == 1 gives them)").format(
            name=name, convention=_convention(convention))
    if np.array_equal(got, ~want):
        if convention == "additive":
            return _("{name} has 0 and -inf swapped: an additive mask adds 0 where attention is "
                     "allowed and -inf where it is blocked").format(name=name)
        if convention == "0/1":
            return _("{name} is inverted: 1 where attention is blocked; here 1 (True) means may "
                     "attend, so flip it with mask == 0 (not ~mask: on integers ~ is a bitwise "
                     "not, giving -1 and -2; and not .astype(bool), which keeps it "
                     "inverted)").format(name=name)
        return _("{name} is inverted: True where attention is blocked, the convention of torch's "
                 "key_padding_mask and of nn.MultiheadAttention's boolean attn_mask; here (as in "
                 "SDPA's boolean attn_mask) True means may attend, so negate it with ~mask "
                 "(not .astype(bool), which keeps it inverted)").format(name=name)
    if convention == "bool":
        return _bool_story(got, want, name)
    return _("{said} (read as {convention})").format(said=_bool_story(got, want, name),
                                                     convention=_convention(convention))
