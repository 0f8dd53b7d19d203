"""The feedback page a student reads: one line per graded part, then the notebook as graded.

    render(nb, parts, student=..., assignment=..., timeout_s=...)  -> the whole HTML page
    write(autograded_ipynb, out_html, parts, ...)                  -> the same, to a file
    part_lines(nb, parts, timeout_s, restored)                     -> the per-part rows
    plain_words(message)                                           -> a check's message, no jargon
    screenshot(html_path, png_path)                                -> a PNG of the first screen

`nb` is the autograded notebook (autograded/STUDENT/NAME/NAME.ipynb) and `parts` the grades of
its graded cells (course.py reads them from the gradebook). The page shows, at the top, the
totals, the teacher's notes and one row per part with the grader's diagnosis in full; below it
the notebook with every error folded into a <details> and no line of the hidden tests, neither
in the cells' sources nor in the tracebacks. No nbgrader server is needed.
"""

from __future__ import annotations

import copy
import html
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat

HIDDEN_BEGIN = "BEGIN HIDDEN TESTS"  # nbgrader's ClearHiddenTests delimiters (its defaults)
HIDDEN_END = "END HIDDEN TESTS"
HIDDEN_PLACEHOLDER = "# (hidden tests: not shown)"
GRADER_LINE = "(a line of the grader's tests)"
TEXT_STUB = "YOUR ANSWER HERE"  # nbgrader_config.py: ClearSolutions.text_stub
TIMEOUTS = {"KeyboardInterrupt", "CellTimeoutError", "TimeoutError"}


@dataclass(frozen=True)
class PartResult:
    """One graded cell, filled by course.py from the gradebook."""

    grade_id: str
    score: float | None  # None: not graded yet (a written answer waiting for the teacher)
    max_score: float
    manual: bool  # a written answer graded by hand
    comment: str = ""  # the teacher's comment, if any


@dataclass(frozen=True)
class Line:
    """One row of the summary: a graded part, its points and what the grader says about it."""

    grade_id: str
    label: str  # "Part 1 test (2 points)", "Written answer 8a (2 points)"
    score: float | None  # None: not graded yet
    max_score: float
    manual: bool
    status: str  # "pass", "fail", "partial" or "pending"
    message: str  # the diagnosis in full (never cut)
    cell_id: str = ""  # the notebook cell's id, for a link from the summary to the cell

    @property
    def points(self) -> str:
        """'2 / 2', or '- / 2' while not graded."""
        got = "-" if self.score is None else _num(self.score)
        return f"{got} / {_num(self.max_score)}"

    def __str__(self) -> str:
        return f"{self.label}: {self.points}: {self.message}"


# --------------------------------------------------------------------------- text helpers

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# An absolute path of two or more components: /tmp/ipykernel_12/345.py, /home/u/.venv/lib/...
_PATH = re.compile(r"(?<![\w.~/])/(?:[^\s/:'\"()<>\[\],;=]+/)+([^\s/:'\"()<>\[\],;=]+)")
_PY_TEMP = re.compile(r"\((?:[^()\s]*/)?\d+\.py, line (\d+)\)")  # SyntaxError: "(8556.py, line 1)"
_CELL_FRAME = re.compile(r"\s*(?:Cell In ?\[(\d+)\]|Input In ?\[(\d+)\]|<ipython-input-(\d+)-)")
_LINENO = re.compile(r"^\s*(?:-*>\s*)?\d+\s?")  # IPython's "----> 12 " / "     3 " prefix


def _num(x: float) -> str:
    return f"{x:g}"


_CASE = r"(?:[^\[\]]|\[[^\[\]]*\])*?"  # a case's text, lists like [5, 3] allowed
_KNOWN = "a mistake we know: your numbers are exactly the ones it gives"
_PLAIN = (  # grader jargon in the checks' messages -> plain words (first match wins per spot)
    (re.compile(rf"\[case: ({_CASE}); matches planted (?:mistake|bug) '[^']*'\]"),
     rf"[case: \1] ({_KNOWN})"),
    (re.compile(r"\[matches planted (?:mistake|bug) '[^']*'\]"), f"({_KNOWN})"),
    (re.compile(r"\bwith a planted (mistake|bug)\b"), r"with the \1"),
)
_RESTORED = re.compile(r"The locked cell (\S+) was (deleted|edited); it was restored")


def plain_words(text: str) -> str:
    """A check's message without grader jargon ("matches planted mistake 'ts_twice'")."""
    for pat, repl in _PLAIN:
        text = pat.sub(repl, text)
    return text


def restored_cells(notes: Iterable[str]) -> dict[str, str]:
    """{grade_id: 'deleted' or 'edited'} for the locked cells the notes say were restored."""
    return {m.group(1): m.group(2) for n in notes for m in [_RESTORED.search(n)] if m}


def restored_message(how: str) -> str:
    """What a part's row says when its test cell was put back before grading."""
    if how == "deleted":
        return ("You had deleted this test cell; it was put back from the original "
                "and graded as usual.")
    return "You had changed this test cell; the original was put back and graded as usual."


def strip_ansi(text: str) -> str:
    """Text without ANSI colour codes."""
    return _ANSI.sub("", text)


def shorten_paths(text: str) -> str:
    """Server paths cut to the file name: /tmp/ipykernel_1/2.py -> 2.py, .../mha/diagnose.py -> diagnose.py."""
    return _PATH.sub(lambda m: m.group(1), text)


def _clean(text: str) -> str:
    return shorten_paths(strip_ansi(text))


def strip_hidden(source: str) -> str:
    """The source with each hidden-test region replaced by one `# (hidden tests: not shown)` line."""
    out, inside = [], False
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + HIDDEN_PLACEHOLDER)
        elif HIDDEN_END in line:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def hidden_lines(source: str) -> list[str]:
    """The lines inside the hidden-test regions of `source` (delimiters included)."""
    out, inside = [], False
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            inside = True
        if inside:
            out.append(line)
        if HIDDEN_END in line:
            inside = False
    return out


# --------------------------------------------------------------------------- cells

def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_test_cell(cell) -> bool:
    """A graded code cell of tests (autograded)."""
    m = _meta(cell)
    return cell.cell_type == "code" and bool(m.get("grade")) and not m.get("solution")


def is_written(cell) -> bool:
    """An answer graded by hand (a markdown answer, or a code answer marked solution + grade)."""
    m = _meta(cell)
    return bool(m.get("grade")) and bool(m.get("solution"))


def _errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _stream(cell, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == name)


def _test_label(cell) -> str:
    for line in cell.source.splitlines():
        if line.strip():
            text = line.strip()
            if text.startswith("#") and HIDDEN_BEGIN not in text:
                return text.lstrip("#").strip() or _meta(cell)["grade_id"]
            break
    return _meta(cell)["grade_id"]


_BOLD = re.compile(r"^\s*\*\*(.+?)\*\*", re.M)
_HEADING = re.compile(r"^\s*#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _written_label(nb, index: int) -> str:
    cell = nb.cells[index]
    prev = nb.cells[index - 1] if index > 0 else None
    if prev is not None and prev.cell_type == "markdown":
        bold = _BOLD.search(prev.source)
        if bold:
            return "Written answer " + bold.group(1).strip().rstrip(".:").strip()
        heads = _HEADING.findall(prev.source)
        if heads:
            return heads[-1].strip()
    return "Written answer " + _meta(cell)["grade_id"]


def _defined_by(nb, name: str):
    """The code cell that defines `name` (def/class/assignment), if any."""
    pat = re.compile(rf"^\s*(?:(?:async\s+)?def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*=",
                     re.M)
    for cell in nb.cells:
        if cell.cell_type == "code" and pat.search(cell.source):
            return cell
    return None


def _error_line(err) -> str:
    ename = err.get("ename", "Error")
    value = _clean(err.get("evalue", "")).strip()
    if ename in ("SyntaxError", "IndentationError", "TabError"):
        value = _PY_TEMP.sub(r"(line \1)", value)
    return f"{ename}: {value}" if value else ename


def diagnose_error(err, nb, timeout_s: float) -> str:
    """One error output in plain words (the full message, never cut)."""
    return plain_words(_diagnose_error(err, nb, timeout_s))


def _diagnose_error(err, nb, timeout_s: float) -> str:
    """diagnose_error before the jargon is translated."""
    ename = err.get("ename", "Error")
    value = _clean(err.get("evalue", "")).strip()
    if ename in TIMEOUTS:
        return (f"this cell ran past {timeout_s:g} s and was stopped: "
                "does a loop in your code never end?")
    if ename == "DeadKernelError":
        return "the kernel died while running this cell (out of memory, or a crash in native code)"
    if ename == "AssertionError":
        return value or "a check failed (an assert without a message)"
    if ename == "NameError":
        m = re.search(r"name '([^']+)' is not defined", value)
        if m:
            name = m.group(1)
            msg = (f"{name} is not defined: its cell did not run (a syntax error?) "
                   "or the function was renamed")
            where = _defined_by(nb, name)
            if where is None:
                msg += f". No cell defines {name} any more."
            elif _errors(where):
                msg += f". Its cell stopped with {_error_line(_errors(where)[0])}."
            return msg
    return _error_line(err)


def diagnose_cell(cell, nb, timeout_s: float) -> str | None:
    """The one-line diagnosis of a cell's failure, or None if it did not fail."""
    errs = _errors(cell)
    if errs:
        return diagnose_error(errs[0], nb, timeout_s)
    if is_test_cell(cell):
        err = _clean(_stream(cell, "stderr")).strip()
        if err:
            return ("the cell wrote to stderr (a warning?), which the grader counts as a "
                    "failure: " + err)
    return None


# --------------------------------------------------------------------------- the summary rows

def _inferred_score(cell) -> float | None:
    """nbgrader's own rule when no grade was passed: an error or stderr scores 0."""
    if is_written(cell):
        return None
    points = float(_meta(cell).get("points", 0))
    if _errors(cell) or _stream(cell, "stderr").strip():
        return 0.0
    return points


def part_lines(nb, parts: Iterable[PartResult], timeout_s: float,
               restored: Mapping[str, str] | None = None) -> list[Line]:
    """One Line per graded cell of `nb`, in notebook order (parts not in `nb` come last).

    restored: {grade_id: 'deleted' or 'edited'} of test cells put back before grading."""
    by_id = {p.grade_id: p for p in parts}
    restored = restored or {}
    lines: list[Line] = []
    seen = set()
    for i, cell in enumerate(nb.cells):
        m = _meta(cell)
        gid = m.get("grade_id")
        if not gid or not m.get("grade"):
            continue
        seen.add(gid)
        part = by_id.get(gid)
        points = float(m.get("points", 0))
        manual = part.manual if part is not None else is_written(cell)
        score = part.score if part is not None else _inferred_score(cell)
        max_score = part.max_score if part is not None else points
        comment = (part.comment if part is not None else "").strip()
        cid = cell.get("id", "") or ""
        if manual:
            label = _written_label(nb, i) if cell.cell_type == "markdown" else _test_label(cell)
            if score is None:
                status, msg = "pending", "graded by hand (not graded yet)"
            else:
                unanswered = cell.source.strip() in ("", TEXT_STUB) or comment == "No response."
                status = ("pass" if score >= max_score else "fail" if score <= 0 else "partial")
                if unanswered and score <= 0:
                    msg = f"no answer written: {_num(score)} / {_num(max_score)}"
                else:
                    msg = f"graded by hand: {_num(score)} / {_num(max_score)}"
                    if comment and comment != "No response.":
                        msg += f"; comment: {comment}"
        else:
            label = _test_label(cell)
            diag = diagnose_cell(cell, nb, timeout_s)
            if score is None:
                status, msg = "pending", "not graded yet"
            elif score >= max_score and max_score > 0 or (max_score == 0 and diag is None):
                out = [s for s in _stream(cell, "stdout").splitlines() if s.strip()]
                status, msg = "pass", plain_words(out[-1].strip()) if out else "passed"
            else:
                status = "partial" if score > 0 else "fail"
                if diag is None and cell.get("execution_count") is None and not cell.outputs:
                    diag = "this cell did not run (did the kernel stop before it?)"
                msg = diag or ("partial credit" if score > 0 else "failed")
        if gid in restored:
            msg = f"{msg}\n{restored_message(restored[gid])}"
        lines.append(Line(gid, label, score, max_score, manual, status, msg, cid))
    for p in by_id.values():
        if p.grade_id not in seen:
            st = "pending" if p.score is None else "pass" if p.score >= p.max_score else "fail"
            lines.append(Line(p.grade_id, p.grade_id, p.score, p.max_score, p.manual, st,
                              "not found in the notebook" + (f"; comment: {p.comment}"
                                                             if p.comment else "")))
    return lines


def totals(lines: Sequence[Line]) -> list[str]:
    """The header's totals: the autograded score, then the written answers apart."""
    auto = [ln for ln in lines if not ln.manual]
    manual = [ln for ln in lines if ln.manual]
    out = []
    if auto:
        got = sum(ln.score or 0 for ln in auto)
        out.append(f"autograded: {_num(got)} / {_num(sum(ln.max_score for ln in auto))}")
    done = [ln for ln in manual if ln.score is not None]
    todo = [ln for ln in manual if ln.score is None]
    todo_text = (f"{len(todo)} written answer{'s' if len(todo) != 1 else ''} "
                 f"({_num(sum(ln.max_score for ln in todo))} points)")
    if done:
        got = f"{_num(sum(ln.score for ln in done))} / {_num(sum(ln.max_score for ln in done))}"
        out.append(f"graded by hand: {got}" + (f" so far; {todo_text} not yet" if todo else ""))
    elif todo:
        out.append(f"{todo_text}: graded by hand, not yet")
    if auto and manual and not todo:
        out.append(f"total: {_num(sum(ln.score or 0 for ln in lines))} / "
                   f"{_num(sum(ln.max_score for ln in lines))}")
    return out


# --------------------------------------------------------------------------- the notebook

def _frame_is_hidden(block: str, test_counts: set[int], hidden: set[str]) -> bool:
    m = _CELL_FRAME.match(block)
    if m and int(next(g for g in m.groups() if g)) in test_counts:
        return True
    if HIDDEN_BEGIN in block or HIDDEN_END in block:
        return True
    for line in block.splitlines():
        code = _LINENO.sub("", line, count=1).strip()
        if code in hidden or line.strip() in hidden:
            return True
    return False


def clean_traceback(tb: Sequence[str], test_counts: set[int], hidden: set[str]) -> str:
    """A traceback as plain text: ANSI stripped, paths shortened, grader frames replaced."""
    blocks = []
    for raw in tb:
        block = strip_ansi(raw)
        if not block.strip() or set(block.strip()) <= {"-"}:
            continue  # IPython's row of dashes
        if _frame_is_hidden(block, test_counts, hidden):
            if not blocks or blocks[-1] != GRADER_LINE:
                blocks.append(GRADER_LINE)
            continue
        block = re.sub(r"^(\w+) {2,}(Traceback \(most recent call last\))", r"\1  \2", block)
        blocks.append(plain_words(shorten_paths(block)).rstrip("\n"))
    return "\n".join(blocks)


def _details(cell, diag: str, test_counts: set[int], hidden: set[str], keep_hidden: bool) -> dict:
    errs = _errors(cell)
    if keep_hidden:
        body = "\n".join(strip_ansi(b) for e in errs for b in e.get("traceback", []))
    else:
        body = "\n\n".join(clean_traceback(e.get("traceback", []), test_counts, hidden)
                           for e in errs if e.get("ename") != "CellTimeoutError" or len(errs) == 1)
    markup = (f'<details class="fb-error"><summary>{html.escape(diag)}</summary>'
              '<pre class="fb-tb">' + html.escape(body) + "</pre></details>")
    return nbformat.v4.new_output("display_data", data={"text/html": markup, "text/plain": diag})


def _restored_note(how: str) -> dict:
    """The output put first in a test cell that was put back before grading."""
    text = restored_message(how)
    return nbformat.v4.new_output("display_data", data={
        "text/html": f'<p class="fb-restored">{html.escape(text)}</p>', "text/plain": text})


def for_students(nb, timeout_s: float, *, keep_hidden_tests: bool = False,
                 restored: Mapping[str, str] | None = None):
    """A copy of `nb` as the student may see it: hidden tests out, errors folded, restored
    test cells saying so, and what cells printed or raised in plain words, not the grader's."""
    original, nb = nb, copy.deepcopy(nb)
    diags = {i: diagnose_error(_errors(c)[0], original, timeout_s)
             for i, c in enumerate(original.cells) if c.cell_type == "code" and _errors(c)}
    hidden = set()
    test_counts = set()
    for cell in nb.cells:
        lines = hidden_lines(cell.source)
        hidden |= {s.strip() for s in lines if len(s.strip()) >= 8}
        if cell.cell_type == "code" and (is_test_cell(cell) or lines) \
                and cell.get("execution_count") is not None:
            test_counts.add(int(cell.execution_count))
    for i, cell in enumerate(nb.cells):
        if not keep_hidden_tests:
            cell.source = strip_hidden(cell.source)
        if cell.cell_type != "code":
            continue
        outputs, folded = [], False
        for out in cell.outputs:  # a traceback and a printed diagnosis ("matches planted bug ...")
            if out.get("output_type") == "error":
                out["traceback"] = [plain_words(line) for line in out.get("traceback", [])]
            elif out.get("output_type") == "stream":
                out["text"] = plain_words(out.get("text", ""))
        for out in cell.outputs:
            if out.get("output_type") == "error":
                if not folded:
                    outputs.append(_details(cell, diags[i], test_counts, hidden,
                                            keep_hidden_tests))
                    folded = True
                continue
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                out = copy.deepcopy(out)
                out["text"] = _clean(out.get("text", ""))
            outputs.append(out)
        gid = _meta(cell).get("grade_id")
        if restored and gid in restored:
            outputs.insert(0, _restored_note(restored[gid]))
        cell.outputs = outputs
    return nb


# --------------------------------------------------------------------------- the page

CSS = """
#fb-summary { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue",
  Arial, sans-serif; font-size: 16px; line-height: 1.45; color: #1f2328; max-width: 72rem;
  margin: 0 auto 1.5rem auto; padding: 1rem 1.25rem; box-sizing: border-box;
  border: 1px solid #d0d7de; border-radius: 8px; background: #fff; }
#fb-summary * { box-sizing: border-box; }
#fb-summary h1 { font-size: 1.35rem; margin: 0 0 .35rem 0; line-height: 1.3; }
#fb-summary .fb-totals { margin: 0 0 .6rem 0; font-size: 1.05rem; }
#fb-summary .fb-totals span + span::before { content: " \\00b7  "; color: #656d76; }
#fb-summary .fb-notes { margin: 0 0 .75rem 0; padding: .5rem .75rem .5rem 1.75rem;
  background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; }
#fb-summary .fb-notes li { white-space: pre-wrap; overflow-wrap: anywhere; }
#fb-summary table.fb-parts { width: 100%; table-layout: fixed; border-collapse: collapse; }
#fb-summary table.fb-parts th { text-align: left; font-weight: 600; color: #656d76;
  font-size: .85rem; border-bottom: 1px solid #d0d7de; padding: .25rem .5rem; }
#fb-summary table.fb-parts td { vertical-align: top; padding: .35rem .5rem;
  border-bottom: 1px solid #eaeef2; overflow-wrap: anywhere; }
#fb-summary col.fb-c-mark { width: 2.4rem; }
#fb-summary col.fb-c-part { width: 16.5rem; }
#fb-summary col.fb-c-points { width: 5.5rem; }
#fb-summary td.fb-points { white-space: nowrap; font-variant-numeric: tabular-nums; }
#fb-summary td.fb-msg { white-space: pre-wrap; overflow-wrap: anywhere; }
#fb-summary td.fb-part a { color: inherit; text-decoration: none; }
#fb-summary td.fb-part a:hover { text-decoration: underline; }
#fb-summary .fb-mark { display: inline-block; width: 1.5rem; height: 1.5rem; line-height: 1.5rem;
  border-radius: 50%; text-align: center; color: #fff; font-weight: 700; font-size: .9rem; }
#fb-summary tr.fb-pass .fb-mark { background: #1a7f37; }
#fb-summary tr.fb-fail .fb-mark { background: #cf222e; }
#fb-summary tr.fb-partial .fb-mark { background: #bf8700; }
#fb-summary tr.fb-pending .fb-mark { background: #8c959f; }
#fb-summary tr.fb-fail td.fb-msg { color: #82071e; }
#fb-summary .fb-hint { margin: .6rem 0 0 0; color: #656d76; font-size: .9rem; }
p.fb-restored { margin: .25rem 0; padding: .4rem .6rem; background: #fff8c5;
  border-left: 4px solid #d4a72c; border-radius: 4px; font-family: system-ui, sans-serif; }
details.fb-error { margin: .25rem 0; padding: .4rem .6rem; background: #fff5f5;
  border-left: 4px solid #cf222e; border-radius: 4px; font-family: system-ui, -apple-system,
  "Segoe UI", Roboto, Arial, sans-serif; font-size: 15px; line-height: 1.4; max-width: 100%; }
details.fb-error > summary { cursor: pointer; white-space: pre-wrap; overflow-wrap: anywhere;
  color: #82071e; }
details.fb-error pre.fb-tb { white-space: pre-wrap !important; overflow-wrap: anywhere;
  word-break: normal; overflow-x: hidden; margin: .5rem 0 0 0; padding: .5rem;
  background: #fff; border: 1px solid #f0c8cc; font-size: 13px; line-height: 1.35;
  font-family: var(--jp-code-font-family, ui-monospace, "DejaVu Sans Mono", Menlo, Consolas,
  monospace); color: #1f2328; }
"""

_MARKS = {"pass": "\u2713", "fail": "\u2717", "partial": "\u00bd", "pending": "\u2026"}
_MARK_TITLES = {"pass": "full points", "fail": "points lost", "partial": "some points lost",
                "pending": "not graded yet"}


def summary_html(lines: Sequence[Line], *, student: str, assignment: str,
                 notes: Sequence[str] = ()) -> str:
    """The section at the top of the page: header, totals, notes and one row per part."""
    e = html.escape
    rows = []
    for ln in lines:
        label = e(ln.label)
        if ln.cell_id:
            label = f'<a href="#{e("cell-id=" + ln.cell_id)}">{label}</a>'
        rows.append(
            f'<tr class="fb-{ln.status}" data-grade-id="{e(ln.grade_id)}">'
            f'<td><span class="fb-mark" title="{_MARK_TITLES[ln.status]}">{_MARKS[ln.status]}'
            f'</span></td><td class="fb-part">{label}</td><td class="fb-points">{e(ln.points)}'
            f'</td><td class="fb-msg">{e(ln.message)}</td></tr>')
    note_html = ""
    if notes:
        note_html = ('<ul class="fb-notes">' + "".join(f"<li>{e(n)}</li>" for n in notes)
                     + "</ul>")
    tot = "".join(f"<span>{e(t)}</span>" for t in totals(lines))
    return (
        '<section id="fb-summary">'
        f"<h1>{e(assignment)}: feedback for {e(student)}</h1>"
        f'<p class="fb-totals">{tot}</p>{note_html}'
        '<table class="fb-parts"><colgroup><col class="fb-c-mark"><col class="fb-c-part">'
        '<col class="fb-c-points"><col></colgroup>'
        '<thead><tr><th></th><th>part</th><th>points</th><th>what the grader says</th></tr>'
        "</thead><tbody>" + "".join(rows) + "</tbody></table>"
        '<p class="fb-hint">Your notebook follows, as it was graded. Each error is folded: '
        "click it to see where it happened. The grader ran more tests than the ones you saw; "
        "they are not shown.</p></section>")


def render(nb: nbformat.NotebookNode, parts: Sequence[PartResult], *, student: str,
           assignment: str, timeout_s: float, notes: Sequence[str] = (),
           keep_hidden_tests: bool = False) -> str:
    """The whole feedback page (HTML). keep_hidden_tests=True is for tests only: it shows
    the hidden tests, to prove that the default does not."""
    from nbconvert import HTMLExporter

    restored = restored_cells(notes)
    lines = part_lines(nb, parts, timeout_s, restored)
    shown = for_students(nb, timeout_s, keep_hidden_tests=keep_hidden_tests, restored=restored)
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    page, _ = exporter.from_notebook_node(
        shown, resources={"metadata": {"name": f"{assignment} feedback: {student}"}})
    summary = summary_html(lines, student=student, assignment=assignment, notes=notes)
    page = page.replace("</head>", f"<style>{CSS}</style>\n</head>", 1)
    m = re.search(r"<main[^>]*>", page) or re.search(r"<body[^>]*>", page)
    if m is None:
        return f"<style>{CSS}</style>{summary}{page}"
    return page[: m.end()] + "\n" + summary + "\n" + page[m.end():]


def write(autograded_ipynb: Path, out_html: Path, parts: Sequence[PartResult], *, student: str,
          assignment: str, timeout_s: float, notes: Sequence[str] = ()) -> None:
    """Read the autograded notebook and write its feedback page to out_html."""
    nb = nbformat.read(Path(autograded_ipynb), as_version=4)
    page = render(nb, parts, student=student, assignment=assignment, timeout_s=timeout_s,
                  notes=notes)
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(page, encoding="utf-8")


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


def screenshot(html_path: Path, png_path: Path, width: int = 1280, height: int = 800) -> None:
    """A PNG of the page's first screen, in headless Debian chromium (needs playwright)."""
    from playwright.sync_api import sync_playwright

    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(Path(html_path).resolve().as_uri(), wait_until="domcontentloaded")
            page.screenshot(path=str(png_path))
        finally:
            browser.close()
