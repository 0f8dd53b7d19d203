"""The Try-it self-check contract in the Chinese edition (issue 31, item 4).

Under `use_language("zh_CN")` every case of `tests/self_checks` must keep the contract of
`tests/test_self_checks.py` in Chinese: the placeholder gets the Chinese "not tried yet" and no
answer, the right answers the Chinese "right", each typical wrong answer a Chinese "not yet"
that is really translated (not the English fallen back) and as distinct from the others as the
English is; answers of the wrong kind get a Chinese message; no message gives the answer away.
The catalogs (`tools.book.messages`) are complete, and a `.mha-language` file in the working
folder chooses the language.
"""

from __future__ import annotations

import re

import pytest

from mha_course import i18n
from mha_course.i18n import use_language
from mha_course.tryit import NotYet, Verdict
from tests.self_checks import Case
from tests.test_self_checks import CASES, _verdict
from tools.book import messages

RIGHT, NOT_YET, NOT_TRIED = "对了：", "还不对：", "还没试："
CJK = re.compile(r"[\u3400-\u9fff]")

# Try-it modules whose messages may still be English only: none (every module has its catalog).
STILL_ENGLISH: set[str] = set()


def _translated() -> set[str]:
    """The Try-it modules that have a catalog: their messages are checked in Chinese."""
    return {m for m in messages.modules() if messages.po_path(m).exists()}


ZH_CASES = [c for c in CASES if c.name.split(".")[0] in _translated()]


def _said(case: Case, args: tuple, lang: str = "zh_CN") -> Verdict:
    """The check's verdict in `lang`, returned as plain text (the English contract's `_verdict`)."""
    with use_language(lang):
        return _verdict(case, args)


def test_every_tryit_module_has_a_catalog():
    missing = {m for m in messages.modules() if m not in _translated()}
    assert "__init__" not in missing
    assert missing <= STILL_ENGLISH, f"Try-it modules with no Chinese catalog: {sorted(missing - STILL_ENGLISH)}"


def test_the_catalogs_are_complete():
    stats = messages.stat()
    bad = [s for s in stats if not s.complete]
    assert not bad, "catalogs with untranslated, fuzzy or invalid messages " \
        "(python -m tools.book.messages stat): " + ", ".join(
            f"tryit.{s.domain} ({s.untranslated} untranslated, {s.fuzzy} fuzzy, "
            f"{s.invalid} invalid)" for s in bad)
    assert not messages.conflicts(), "messages translated differently in two catalogs: " \
        f"{messages.conflicts()}"
    assert messages.main(["stat", "--strict"]) == 0


def test_a_translation_that_breaks_a_placeholder_or_is_not_chinese_is_invalid():
    assert not messages.problems("{name} is right", "{name} 是对的")
    assert messages.problems("{name} is right", "{nom} 是对的")
    assert messages.problems("got {answer!r:.60}", "收到 {answer!r}")
    assert messages.problems("{name} is right", "{name} is right")
    assert not messages.problems("{said}. {extra}", "{said}。{extra}")


@pytest.mark.parametrize("case", ZH_CASES, ids=lambda c: c.name)
def test_placeholder_says_not_tried_in_chinese(case):
    said = _said(case, case.untried())
    assert said.startswith(NOT_TRIED) and not said.ok, said
    assert CJK.search(said.removeprefix(NOT_TRIED)), f"{case.name}: {said}"
    praise = _said(case, case.right()).removeprefix(RIGHT).strip()
    assert praise not in said, "the placeholder shows the praise"


@pytest.mark.parametrize("case", ZH_CASES, ids=lambda c: c.name)
def test_right_answer_is_right_in_chinese_in_every_form(case):
    said = _said(case, case.right())
    assert said.startswith(RIGHT) and said.ok, said
    assert CJK.search(said.removeprefix(RIGHT)), f"{case.name}: {said}"
    for i, form in enumerate(case.right_forms):
        said = _said(case, form())
        assert said.startswith(RIGHT) and said.ok, f"{case.name}: right form {i} told: {said}"


@pytest.mark.parametrize("case", ZH_CASES, ids=lambda c: c.name)
def test_each_typical_mistake_is_named_in_chinese(case):
    english, chinese = {}, {}
    for phrase, args in case.wrong.items():
        en = _said(case, args(), "en")
        zh = _said(case, args())
        assert zh.startswith(NOT_YET) and not zh.ok, f"{case.name}, {phrase!r}: {zh}"
        assert CJK.search(zh.removeprefix(NOT_YET)), f"{case.name}, {phrase!r} not translated: {zh}"
        assert zh.removeprefix(NOT_YET) != en.removeprefix("not yet: "), \
            f"{case.name}, {phrase!r}: the English fell back: {zh}"
        english[phrase], chinese[phrase] = en, zh
    same = [(a, b) for a in chinese for b in chinese
            if a < b and chinese[a] == chinese[b] and english[a] != english[b]]
    assert not same, f"{case.name}: mistakes {same} get the same Chinese message"


@pytest.mark.parametrize("case", ZH_CASES, ids=lambda c: c.name)
def test_an_answer_of_the_wrong_kind_gets_a_chinese_message(case):
    for args in case.garbage:
        said = _said(case, args())
        assert said.startswith(NOT_YET), f"{case.name}: {said}"
        assert CJK.search(said.removeprefix(NOT_YET)), f"{case.name}: {said}"


@pytest.mark.parametrize("case", ZH_CASES, ids=lambda c: c.name)
def test_no_chinese_message_gives_the_answer_away(case):
    said = [_said(case, case.untried())]
    said += [_said(case, args()) for args in case.wrong.values()]
    said += [_said(case, args()) for args in case.garbage]
    for text in said:
        for secret in case.secret:
            assert secret.lower() not in text.lower(), f"{case.name} shows {secret!r}: {text}"


def test_a_language_file_in_the_working_folder_chooses_chinese(tmp_path, monkeypatch):
    monkeypatch.delenv("MHA_LANG", raising=False)
    monkeypatch.chdir(tmp_path)
    from mha_course.tryit import as_number

    def said() -> str:
        try:
            as_number("seven", "d_k")
        except NotYet as verdict:
            return str(verdict)
        raise AssertionError("as_number took text")

    assert i18n.language() == "en"
    assert said().startswith("not yet: ")
    (tmp_path / i18n.MARKER).write_text("zh_CN\n", encoding="utf-8")
    assert i18n.language() == "zh_CN"
    assert said().startswith(NOT_YET) and CJK.search(said())
    monkeypatch.setenv("MHA_LANG", "en")  # the environment wins over the file
    assert said().startswith("not yet: ")
