"""The Try-it self-check contract (see mha_course.tryit), for every lesson's exercise.

Each check: None -> "not tried yet", the right answer (in every listed form) -> "right", each
typical wrong answer (at least three) -> its own message naming the mistake, an answer of the
wrong kind -> a message, not a raw error. Every verdict is returned as plain text, never raised
(no traceback shows the checker or the answer), and no message shows the case's secret text.
And every lesson's Try-it calls checks that are under contract, so a new lesson cannot add an
exercise without them.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
import re

import nbformat
import pytest

import mha_course.tryit
from mha_course.tryit import NotYet, Verdict
from tests.self_checks import Case

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRY_IT = re.compile(r"^(#+\s*|\*\*)Try it", re.M)
IMPORT = re.compile(r"from mha_course\.tryit import (\w+) as tryit")
CALL = re.compile(r"\btryit\.(check_\w+)\(")


def _tryit_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(mha_course.tryit.__path__))


def _cases() -> list[Case]:
    found = []
    for name in _tryit_modules():
        try:
            module = importlib.import_module(f"tests.self_checks.{name}")
        except ModuleNotFoundError:  # reported by the coverage test below, not at collection
            continue
        found += module.CASES
    return found


CASES = _cases()


def _checks_in(name: str) -> set[str]:
    module = importlib.import_module(f"mha_course.tryit.{name}")
    return {n for n, f in inspect.getmembers(module, inspect.isfunction)
            if n.startswith("check_") and f.__module__ == module.__name__}


def test_every_check_has_a_case_with_at_least_three_wrong_answers():
    covered = {c.name: c for c in CASES}
    for name in _tryit_modules():
        for fn in _checks_in(name):
            case = covered.get(f"{name}.{fn}")
            assert case is not None, f"mha_course.tryit.{name}.{fn} has no Case in tests/self_checks/{name}.py"
            assert len(case.wrong) >= 3, f"{case.name}: {len(case.wrong)} wrong answers, want >= 3"


def _verdict(case: Case, args: tuple) -> Verdict:
    """The check's verdict, which it must return as plain text rather than raise."""
    try:
        said = case.check(*args)
    except NotYet as raised:
        pytest.fail(f"{case.name} raised its verdict (a traceback for the student): {raised}")
    assert isinstance(said, Verdict), f"{case.name} returned {type(said).__name__}, not a Verdict"
    return said


def test_every_check_returns_its_verdict_as_text():
    for name in _tryit_modules():
        module = importlib.import_module(f"mha_course.tryit.{name}")
        for fn in _checks_in(name):
            assert getattr(getattr(module, fn), "__self_check__", False), \
                f"mha_course.tryit.{name}.{fn} is not decorated with @self_check"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_placeholder_says_not_tried_and_gives_nothing_away(case):
    said = _verdict(case, case.untried())
    assert said.startswith("not tried yet") and not said.ok, said
    right_said = case.check(*case.right())
    assert right_said.removeprefix("right:").strip() not in said, "the placeholder shows the praise"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_right_answer_is_right_in_every_form(case):
    said = _verdict(case, case.right())
    assert said.startswith("right") and said.ok, said
    for i, form in enumerate(case.right_forms):
        said = _verdict(case, form())
        assert said.ok, f"{case.name}: right form {i} told: {said}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_typical_mistake_is_named_with_its_own_message(case):
    messages = {}
    for phrase, args in case.wrong.items():
        text = _verdict(case, args())
        assert text.startswith("not yet") and not text.ok, f"{case.name}, {phrase!r}: {text}"
        assert phrase.lower() in text.lower(), f"{case.name}, mistake {phrase!r} got: {text}"
        messages[phrase] = text
    same = [(a, b) for a in messages for b in messages if a < b and messages[a] == messages[b]]
    assert not same, f"{case.name}: mistakes {same} get the same message"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_an_answer_of_the_wrong_kind_gets_a_message_not_a_raw_error(case):
    for args in case.garbage:
        said = _verdict(case, args())
        assert said.startswith("not yet"), f"{case.name}: {said}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_no_message_gives_the_answer_away(case):
    said = [_verdict(case, case.untried())]
    said += [_verdict(case, args()) for args in case.wrong.values()]
    said += [_verdict(case, args()) for args in case.garbage]
    for text in said:
        for secret in case.secret:
            assert secret.lower() not in text.lower(), f"{case.name} shows {secret!r}: {text}"


def _lessons() -> list[pathlib.Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))[1:]  # 00 is the map


def _try_it_calls(path: pathlib.Path) -> list[tuple[str, set[str]]]:
    """For each Try-it of a lesson: (its module, the tryit.check_* its code cells call)."""
    cells = nbformat.read(path, as_version=4).cells
    found = []
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown" or not TRY_IT.search(cell.source):
            continue
        code = []
        for later in cells[i + 1:]:
            if later.cell_type == "markdown" and re.search(r"^#+ ", later.source, re.M) \
                    and "Show answer" not in later.source:
                break
            if later.cell_type == "code":
                code.append(later.source)
        text = "\n".join(code)
        module = IMPORT.search(text) or IMPORT.search("\n".join(c.source for c in cells[:i]))
        found.append((module.group(1) if module else "", set(CALL.findall(text))))
    return found


@pytest.mark.parametrize("path", _lessons(), ids=lambda p: p.stem)
def test_every_try_it_calls_self_checks_under_the_contract(path):
    covered = {c.name for c in CASES}
    tries = _try_it_calls(path)
    assert tries, f"{path.stem} has no Try it"
    for module, calls in tries:
        assert module, f"{path.stem}: a Try it without `from mha_course.tryit import <topic> as tryit`"
        assert calls, f"{path.stem}: a Try it whose cells call no tryit.check_*"
        for fn in calls:
            assert f"{module}.{fn}" in covered, f"{path.stem} calls tryit.{fn}, not under contract"
