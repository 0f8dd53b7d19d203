"""The feedback page a student reads (notebooks/assignments/feedback.py).

On a small synthetic autograded notebook (a failed test whose traceback quotes a hidden line,
a passed test, a timeout, a NameError, a written answer): the header and one row per part with
the diagnosis in full; no line of the hidden tests anywhere in the page (and the check does
find them when they are left in); every traceback folded into a <details>. Then the page in
headless Chromium: the summary is on the first screen and nothing in it scrolls sideways.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import feedback as fb  # noqa: E402  (notebooks/assignments/feedback.py)

CHROMIUM = "/usr/bin/chromium"
REPORTS = ROOT / ".ci-reports" / "feedback"
TIMEOUT_S = 30

LONG = ("double (step 2) differs from the reference [case: x of shape (3, 7, 24), seed 2]: "
        "12 of 504 values differ, the largest by 3.5 at index (1, 4, 17) (expected 1.25, got "
        "4.75). Every value is off by exactly the input, so the function adds x once more "
        "than it should: did you write x + x + x instead of x + x? The visible test only "
        "checks x = 2, where that mistake is easy to miss; the end of this message is here.")
assert len(LONG) > 300

HIDDEN_FAIL = "assert double(3) == secret_reference_alpha(3), 'hidden check alpha'"
HIDDEN_PASS = "hidden_pass_value_beta = double(secret_reference_alpha(10))"
HIDDEN_TIME = "for k_ in range(secret_reference_gamma):"


def _meta(grade_id: str, *, grade=False, solution=False, locked=False, points=None) -> dict:
    m = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
         "solution": solution, "task": False}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def _ansi(text: str, code: str = "31") -> str:
    return f"\x1b[{code}m{text}\x1b[39m"


def _error(ename: str, evalue: str, frames: list[str]) -> nbformat.NotebookNode:
    tb = [_ansi("-" * 75), _ansi(ename) + " " * 20 + "Traceback (most recent call last)",
          *frames, _ansi(ename) + ": " + evalue]
    return new_output("error", ename=ename, evalue=evalue, traceback=tb)


def _frame(head: str, lines: list[tuple[int, str]], arrow: int) -> str:
    body = "".join(("----> " if n == arrow else "      ") + _ansi(str(n), "32") + " " + s + "\n"
                   for n, s in lines)
    return _ansi(head, "36") + "\n" + body


def autograded() -> nbformat.NotebookNode:
    """A small autograded notebook, as nbgrader leaves it (hidden tests restored)."""
    fail_src = ("# Part 1 test (2 points)\nassert double(2) == 4, 'double(2) should be 4'\n"
                f"### BEGIN HIDDEN TESTS\n{HIDDEN_FAIL}\n### END HIDDEN TESTS")
    fail_out = _error("AssertionError", LONG, [
        _frame("Cell \x1b[32mIn[3]\x1b[39m, line 4", [(2, "assert double(2) == 4"),
                                                      (3, "### BEGIN HIDDEN TESTS"),
                                                      (4, HIDDEN_FAIL)], 4),
        # a frame that does not name the test cell but quotes a hidden line
        _frame("File \x1b[32m/tmp/ipykernel_4242/3141592.py:4\x1b[39m", [(4, HIDDEN_FAIL)], 4),
        _frame("File \x1b[32m/home/student/.venv/lib/python3.11/site-packages/mha/diagnose.py:52"
               "\x1b[39m, in check(self)", [(52, "raise AssertionError(self.message)")], 52),
    ])
    time_out = [
        _error("KeyboardInterrupt", "", [
            _frame("Cell In[6], line 2", [(2, "print(slow(3))")], 2),
            _frame("Cell In[5], line 3, in slow(n)", [(2, "while True:"), (3, "    n += 1")], 3)]),
        new_output("error", ename="CellTimeoutError", evalue="",
                   traceback=["\x1b[0;31mCellTimeoutError\x1b[0m: No reply from kernel before timeout"]),
    ]
    name_out = _error("NameError", "name 'triple' is not defined",
                      [_frame("Cell In[8], line 2", [(2, "assert triple(1) == 3")], 2)])
    cells = [
        new_markdown_cell("# A9 · A demo assignment\n\nWrite `double`, `slow` and `triple`."),
        new_code_cell("import math", metadata=_meta("a9-setup", locked=True), execution_count=1),
        new_code_cell("def double(x):\n    return x + x", metadata=_meta("a9-double", solution=True),
                      execution_count=2),
        new_code_cell(fail_src, metadata=_meta("a9-double-tests", grade=True, locked=True, points=2),
                      execution_count=3, outputs=[fail_out]),
        new_code_cell("# Part 2 test (1 point)\nprint('checking double')\n"
                      "print(f'double: right on {3} cases')\n"
                      f"### BEGIN HIDDEN TESTS\n{HIDDEN_PASS}\n### END HIDDEN TESTS",
                      metadata=_meta("a9-double-more", grade=True, locked=True, points=1),
                      execution_count=4,
                      outputs=[new_output("stream", name="stdout",
                                          text="checking double\ndouble: right on 3 cases\n")]),
        new_code_cell("def slow(n):\n    while True:\n        n += 1",
                      metadata=_meta("a9-slow", solution=True), execution_count=5),
        new_code_cell("# Part 3 test (1 point)\nprint(slow(3))\n"
                      f"### BEGIN HIDDEN TESTS\n{HIDDEN_TIME}\n    slow(k_)\n### END HIDDEN TESTS",
                      metadata=_meta("a9-slow-tests", grade=True, locked=True, points=1),
                      execution_count=6, outputs=time_out),
        new_code_cell("def tripel(x):  # renamed by mistake\n    return 3 * x",
                      metadata=_meta("a9-triple", solution=True), execution_count=7),
        new_code_cell("# Part 4 test (1 point)\nassert triple(1) == 3",
                      metadata=_meta("a9-triple-tests", grade=True, locked=True, points=1),
                      execution_count=8, outputs=[name_out]),
        new_markdown_cell("## Part 5 · In your own words\n\n**5a (2 points).** Why does "
                          "`slow` never return?", metadata=_meta("a9-q1-prompt", locked=True)),
        new_markdown_cell("Because `n += 1` never makes the loop condition false.",
                          metadata=_meta("a9-q1", grade=True, solution=True, points=2)),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


PARTS = [fb.PartResult("a9-double-tests", 0.0, 2.0, False),
         fb.PartResult("a9-double-more", 1.0, 1.0, False),
         fb.PartResult("a9-slow-tests", 0.0, 1.0, False),
         fb.PartResult("a9-triple-tests", 0.0, 1.0, False),
         fb.PartResult("a9-q1", None, 2.0, True)]
NOTES = ["locked cell a9-double-tests was edited or deleted: it was restored from the original "
         "before grading"]


def page_text(page: str) -> str:
    """What a reader of the page can see or select: tags out, entities decoded."""
    page = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def hidden_test_lines(nb) -> list[str]:
    """Every line of every hidden-test region of nb (delimiters left out), stripped, except
    those that the student sees anyway (the same line outside a hidden region)."""
    visible = {s.strip() for c in nb.cells for s in fb.strip_hidden(c.source).splitlines()}
    return [s.strip() for c in nb.cells for s in fb.hidden_lines(c.source)
            if s.strip() and fb.HIDDEN_BEGIN not in s and fb.HIDDEN_END not in s
            and s.strip() not in visible]


def leaked(page: str, nb) -> list[str]:
    """The hidden-test lines of nb that appear as a line of the page's text (in a cell's
    source, or quoted in a traceback after IPython's '---> 12' prefix)."""
    shown = set()
    for line in page_text(page).splitlines():
        shown |= {line.strip(), re.sub(r"^\s*(?:-*>\s*)?\d+\s", "", line).strip()}
    return [s for s in hidden_test_lines(nb) if s in shown]


@pytest.fixture(scope="module")
def nb():
    return autograded()


@pytest.fixture(scope="module")
def page(nb):
    return fb.render(nb, PARTS, student="bob", assignment="A9_demo", timeout_s=TIMEOUT_S,
                     notes=NOTES)


def test_part_lines(nb):
    lines = fb.part_lines(nb, PARTS, TIMEOUT_S)
    assert [ln.grade_id for ln in lines] == [p.grade_id for p in PARTS]  # notebook order
    by = {ln.grade_id: ln for ln in lines}
    fail = by["a9-double-tests"]
    assert (fail.label, fail.points, fail.status) == ("Part 1 test (2 points)", "0 / 2", "fail")
    assert fail.message == LONG  # in full, and without "AssertionError: "
    ok = by["a9-double-more"]
    assert (ok.label, ok.points, ok.status, ok.message) == (
        "Part 2 test (1 point)", "1 / 1", "pass", "double: right on 3 cases")  # last stdout line
    slow = by["a9-slow-tests"]
    assert slow.message == ("this cell ran past 30 s and was stopped: "
                            "does a loop in your code never end?")
    name = by["a9-triple-tests"].message
    assert name.startswith("triple is not defined: its cell did not run (a syntax error?) or "
                           "the function was renamed"), name
    assert "No cell defines triple" in name
    written = by["a9-q1"]
    assert (written.label, written.points, written.status, written.message) == (
        "Written answer 5a (2 points)", "- / 2", "pending", "graded by hand (not graded yet)")
    assert str(fail).startswith("Part 1 test (2 points): 0 / 2: double (step 2)")


def test_written_answer_once_graded(nb):
    parts = [*PARTS[:4], fb.PartResult("a9-q1", 1.5, 2.0, True, "Right, and say why n grows.")]
    lines = fb.part_lines(nb, parts, TIMEOUT_S)
    assert lines[-1].message == "graded by hand: 1.5 / 2; comment: Right, and say why n grows."
    assert lines[-1].status == "partial"
    assert fb.totals(lines) == ["autograded: 1 / 5", "graded by hand: 1.5 / 2",
                                "total: 2.5 / 7"]
    unanswered = nbformat.from_dict(nb)
    unanswered.cells[-1].source = fb.TEXT_STUB
    lines = fb.part_lines(unanswered, [*PARTS[:4], fb.PartResult("a9-q1", 0.0, 2.0, True)],
                          TIMEOUT_S)
    assert lines[-1].message == "no answer written: 0 / 2"


def test_header_and_rows(page):
    assert "A9_demo: feedback for bob" in page
    head = page_text(page)
    assert "autograded: 1 / 5" in head
    assert "1 written answer (2 points): graded by hand, not yet" in head
    assert NOTES[0] in head
    summary = page[page.index('<section id="fb-summary">'):page.index("</section>")]
    rows = re.findall(r"<tr class=\"fb-(\w+)\" data-grade-id=\"([\w-]+)\">", summary)
    assert rows == [("fail", "a9-double-tests"), ("pass", "a9-double-more"),
                    ("fail", "a9-slow-tests"), ("fail", "a9-triple-tests"),
                    ("pending", "a9-q1")]
    assert html.escape(LONG) in summary  # uncut
    assert "ran past 30 s and was stopped" in summary
    assert "graded by hand (not graded yet)" in summary
    assert "KeyboardInterrupt" not in summary and "AssertionError" not in summary


def test_no_hidden_test_in_page(nb, page):
    assert len(hidden_test_lines(nb)) == 4
    assert leaked(page, nb) == []
    assert "secret_reference" not in page and "hidden_pass_value_beta" not in page
    assert page.count(fb.HIDDEN_PLACEHOLDER) == 3  # one per region
    # ... and the check would see them: in the raw notebook, and in a page left unstripped.
    assert leaked("\n".join(c.source for c in nb.cells), nb) == hidden_test_lines(nb)
    raw = fb.render(nb, PARTS, student="bob", assignment="A9_demo", timeout_s=TIMEOUT_S,
                    keep_hidden_tests=True)
    assert set(leaked(raw, nb)) == set(hidden_test_lines(nb))


@pytest.mark.parametrize("name", sorted(p.name for p in (COURSE / "source").iterdir()
                                        if (p / f"{p.name}.ipynb").exists()))
def test_no_hidden_test_of_the_course(name):
    """The real teacher notebooks (which carry every hidden test): none of it in the page."""
    source = nbformat.read(COURSE / "source" / name / f"{name}.ipynb", as_version=4)
    assert hidden_test_lines(source), f"{name} has no hidden tests?"
    page = fb.render(source, [], student="s", assignment=name, timeout_s=TIMEOUT_S)
    assert leaked(page, source) == []


def test_tracebacks_folded(nb, page):
    details = re.findall(r'<details class="fb-error">.*?</details>', page, flags=re.S)
    assert len(details) == 3  # one per failing cell (the timeout's two errors fold into one)
    rest = page
    for d in details:
        rest = rest.replace(d, "")
    assert "Traceback" not in rest and "CellTimeoutError" not in rest
    fail, slow, name = (html.unescape(d) for d in details)
    assert "<summary>" + LONG + "</summary>" in fail
    assert fb.GRADER_LINE in fail
    assert "diagnose.py:52" in fail and "3141592.py" not in fail
    assert "ran past 30 s" in slow and "n += 1" in slow  # the student's looping line is shown
    assert "triple is not defined" in name
    assert "\x1b" not in page and "/tmp/ipykernel" not in page and "site-packages" not in page


browser_only = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian chromium")

OVERFLOW = """(sel) => [...document.querySelectorAll(sel)]
  .filter(e => e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1)
  .map(e => e.tagName + '.' + e.className + ' ' + e.scrollWidth + '>' + e.clientWidth)"""


@browser_only
def test_in_the_browser(page, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    out = tmp_path / "A9_demo.html"
    out.write_text(page, encoding="utf-8")
    REPORTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=fb.CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 800})
            tab.goto(out.as_uri(), wait_until="domcontentloaded")
            table = tab.locator("#fb-summary table.fb-parts")
            assert table.is_visible()
            box = table.bounding_box()
            assert box["y"] >= 0 and box["y"] + box["height"] <= 800, box  # on the first screen
            assert box["x"] >= 0 and box["x"] + box["width"] <= 1280, box
            assert tab.evaluate(OVERFLOW, "#fb-summary, #fb-summary *") == []
            assert tab.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            tab.screenshot(path=str(REPORTS / "feedback-first-screen.png"))
            # A traceback opens on a click and wraps instead of scrolling sideways.
            tab.locator("details.fb-error > summary").first.click()
            tb = tab.locator("details.fb-error pre.fb-tb").first
            assert tb.is_visible()
            assert tab.evaluate(OVERFLOW, "details.fb-error, details.fb-error *") == []
            tb.scroll_into_view_if_needed()
            tab.screenshot(path=str(REPORTS / "feedback-traceback.png"))
        finally:
            browser.close()
    fb.screenshot(out, REPORTS / "feedback-screenshot.png")
    assert (REPORTS / "feedback-screenshot.png").stat().st_size > 10_000


JARGON = ("hbm_bytes(4, 8, 2) = 96, want 64: the (T, S) matrix is moved four times, not twice "
          "[matches planted mistake 'ts_twice']")


def _jargon_nb() -> nbformat.NotebookNode:
    """A notebook whose failing check speaks the grader's jargon (message and traceback)."""
    out = _error("AssertionError", JARGON, [_frame("Cell In[2], line 2", [(2, "check()")], 2)])
    out["traceback"].append(f"\x1b[0;31mAssertionError\x1b[0m: {JARGON}")
    cells = [new_code_cell("def hbm_bytes(T, S, d, b):\n    return 96",
                           metadata=_meta("a9-bytes", solution=True), execution_count=1),
             new_code_cell("# Part 1 test (1 point)\ncheck()",
                           metadata=_meta("a9-bytes-tests", grade=True, locked=True, points=1),
                           execution_count=2, outputs=[out])]
    return new_notebook(cells=cells)


def test_the_feedback_speaks_without_grader_jargon():
    nb = _jargon_nb()
    parts = [fb.PartResult("a9-bytes-tests", 0.0, 1.0, False)]
    (line,) = fb.part_lines(nb, parts, TIMEOUT_S)
    assert "planted" not in line.message and "ts_twice" not in line.message
    assert line.message.startswith("hbm_bytes(4, 8, 2) = 96, want 64: the (T, S) matrix is moved")
    assert line.message.endswith("(a mistake we know: your numbers are exactly the ones it gives)")
    text = page_text(fb.render(nb, parts, student="bob", assignment="A9_demo", timeout_s=TIMEOUT_S))
    assert "planted" not in text and "ts_twice" not in text


@pytest.mark.parametrize("raw, plain", [
    ("wrong at step 3 [case: window=4, prompts [5, 3] left-padded; matches planted mistake "
     "'keys_at_slots']", "wrong at step 3 [case: window=4, prompts [5, 3] left-padded] "
     "(a mistake we know: your numbers are exactly the ones it gives)"),
    ("no known mistake fits [case: window=4, chunks [1, 2]]",
     "no known mistake fits [case: window=4, chunks [1, 2]]"),
    ("Every gradient equals a backward with a planted mistake in delta (step 2): x [matches "
     "planted bug 'delta_from_dout']", "Every gradient equals a backward with the mistake in "
     "delta (step 2): x (a mistake we know: your numbers are exactly the ones it gives)"),
    ("double: right on 3 cases", "double: right on 3 cases"),
])
def test_plain_words(raw, plain):
    assert fb.plain_words(raw) == plain


def test_a_deleted_test_cell_is_told_in_its_row_and_in_the_cell(tmp_path):
    import course  # the note course.py writes, so that the two cannot drift apart

    nb = autograded()
    name, gid = "A9_demo", "a9-double-tests"
    (tmp_path / "release" / name).mkdir(parents=True)
    (tmp_path / "submitted" / "bob" / name).mkdir(parents=True)
    nbformat.write(nb, tmp_path / "release" / name / f"{name}.ipynb")
    gone = new_notebook(cells=[c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != gid])
    nbformat.write(gone, tmp_path / "submitted" / "bob" / name / f"{name}.ipynb")
    notes = course._notes(name, "bob", tmp_path)
    assert fb.restored_cells(notes) == {gid: "deleted"}
    by = {ln.grade_id: ln for ln in fb.part_lines(nb, PARTS, TIMEOUT_S, fb.restored_cells(notes))}
    assert by[gid].message == LONG + "\n" + fb.restored_message("deleted")
    assert "deleted" not in by["a9-double-more"].message
    page = fb.render(nb, PARTS, student="bob", assignment=name, timeout_s=TIMEOUT_S, notes=notes)
    assert page.count('class="fb-restored"') == 1
    assert "You had deleted this test cell; it was put back from the original" in page_text(page)
