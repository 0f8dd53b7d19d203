"""The teacher's workflow with course.py: one student or one assignment at a time, reports that
merge, hand grades that survive a regrade, and a clear word when the folders and the gradebook
disagree. One private course, graded step by step as a teacher would."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402

A1, A5 = "A1_seven_steps", "A5_backward_pass"


def _rows(root: Path) -> list[dict]:
    with open(root / "reports" / "grades_by_part.csv") as f:
        return list(csv.DictReader(f))


def _hand_grade(root: Path, name: str, student: str, grade_id: str, score: float, comment: str):
    """What the formgrader does when a teacher marks a written answer."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        g = gb.find_grade(grade_id, name, name, student)
        g.manual_score = score
        g.needs_manual_grade = False
        gb.find_comment(grade_id, name, name, student).manual_comment = comment
        gb.db.commit()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = course.private_copy(tmp_path_factory.mktemp("workflow"), [A1, A5])
    course.release([A1, A5], root)
    full = course.model_submission(A1, root)
    for student in ("alice", "bob", "carol"):
        course.submit(A1, student, full, root)
    course.grade([A1], root, workers=2)
    return root


def test_grading_one_student_leaves_the_others_and_keeps_hand_grades(root):
    bob_before = (root / "autograded" / "bob" / A1 / f"{A1}.ipynb").stat().st_mtime_ns
    _hand_grade(root, A1, "alice", "a1-q1", 2.0, "clear and right")
    course.report([A1], root)
    page = (root / "feedback" / "alice" / A1 / f"{A1}.html").read_text()
    assert "clear and right" in page and "graded by hand: 2 / 2" in page
    summary = (root / "reports" / "summary.md").read_text()
    row = next(ln for ln in summary.splitlines() if ln.startswith("| alice | A1"))
    assert "| 19 / 19 | 2 / 2 (1 to grade, 2 pts) |" in row, row

    # alice hands in again, with a broken softmax and the same written answer; carol with a
    # new answer to a question already graded. Regrade those two only.
    _hand_grade(root, A1, "carol", "a1-q2", 1.0, "half")
    nb = course.model_submission(A1, root)
    cell = course.graded_cells(nb)["a1-softmax"]
    cell.source = cell.source.replace("np.exp(scores - row_max)", "np.exp(scores)")
    course.submit(A1, "alice", nb, root)
    nb = course.model_submission(A1, root)
    course.graded_cells(nb)["a1-q2"].source = "A different answer."
    course.submit(A1, "carol", nb, root)
    course.grade([A1], root, students=["alice", "carol"], workers=2)
    assert (root / "autograded" / "bob" / A1 / f"{A1}.ipynb").stat().st_mtime_ns == bob_before
    rows = {(r["student"], r["part"]): r for r in _rows(root)}
    assert float(rows[("alice", "a1-q1")]["score"]) == 2.0, "the hand grade must survive"
    assert rows[("alice", "a1-q1")]["needs_manual_grade"] == "False"
    assert float(rows[("alice", "a1-softmax-tests")]["score"]) == 0
    assert float(rows[("bob", "a1-softmax-tests")]["score"]) == 3, "bob is still in the report"
    assert rows[("carol", "a1-q2")]["needs_manual_grade"] == "True", \
        "a changed answer goes back to 'to grade'"


def test_grading_another_assignment_merges_the_reports(root):
    course.submit(A5, "alice", course.model_submission(A5, root), root)
    course.grade([A5], root, workers=1)
    summary = (root / "reports" / "summary.md").read_text()
    assert re.search(r"\| alice \| A1_seven_steps \|", summary), summary
    assert re.search(r"\| alice \| A5_backward_pass \| 14 / 14 \|", summary), summary
    assert re.search(r"\| bob \| A1_seven_steps \|", summary), summary
    assert {r["assignment"] for r in _rows(root)} == {A1, A5}
    with open(root / "reports" / "grades.csv") as f:
        assert {r["assignment"] for r in csv.DictReader(f)} >= {A1, A5}


def test_a_student_missing_from_the_gradebook_gets_a_clear_word_not_a_crash(root):
    import sqlite3

    db = sqlite3.connect(root / "gradebook.db")
    with db:  # the teacher removed bob from the gradebook, but not his folders
        ids = "SELECT id FROM submitted_notebook WHERE assignment_id IN (SELECT id FROM " \
              "submitted_assignment WHERE student_id = 'bob')"
        for table in ("grade", "comment"):
            db.execute(f"DELETE FROM {table} WHERE notebook_id IN ({ids})")
        db.execute(f"DELETE FROM submitted_notebook WHERE id IN ({ids})")
        db.execute("DELETE FROM submitted_assignment WHERE student_id = 'bob'")
        db.execute("DELETE FROM student WHERE id = 'bob'")
    db.close()
    course.report([A1], root)
    summary = (root / "reports" / "summary.md").read_text()
    assert "autograded/bob/A1_seven_steps exists but the gradebook has no student 'bob'" in summary
    assert "| bob |" not in summary


def test_short_names_and_unknown_ones(root):
    assert course.resolve(["A1", "A5_backward_pass"], root) == [A1, A5]
    with pytest.raises(SystemExit, match="unknown assignment 'A9'"):
        course.resolve(["A9"], root)


def test_a3_answer_key_in_the_hidden_tests_matches_the_suspects():
    from mha_course import planted

    nb = nbformat.read(COURSE / "source" / "A3_find_the_bug" / "A3_find_the_bug.ipynb",
                       as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    seed = int(re.search(r"SUSPECT_SEED = (\d+)", text).group(1))
    found = re.findall(r'true_ = "(\w+)"  # the answer key', text)
    deal = planted._deal(seed)
    assert len(found) == 8, found
    assert found == [deal[label] for label in "AABBCCDD"], (found, deal)


class _Runner:
    """Stands in for course.nbgrader: records each call and grades as told."""

    def __init__(self, dest: Path, fail: dict[int, tuple[str, set[str]]]):
        self.dest, self.fail, self.calls = dest, fail, []

    def __call__(self, *args: str, root: Path):
        self.calls.append(args)
        name = args[1]
        students = [args[args.index("--student") + 1]] if "--student" in args else ["ann", "ben"]
        message, failed = self.fail.get(len(self.calls), ("", set()))
        for s in students:
            if s not in failed:
                out = self.dest / "autograded" / s / name
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{name}.ipynb").write_text("{}")
        if failed:
            raise RuntimeError(f"nbgrader autograde {name} failed (1):\n{message}")


class _Bar:
    def update(self, n: int) -> None:
        pass


def test_a_kernel_that_did_not_start_is_graded_again_and_other_failures_are_raised(tmp_path):
    share = [(A1, "ann"), (A1, "ben")]
    start = "RuntimeError: Kernel didn't respond in 60 seconds"
    run = _Runner(tmp_path / "a", {1: (start, {"ben"})})
    course._run_worker(tmp_path / "a", share, _Bar(), run=run)
    assert run.calls == [("autograde", A1, "--force"), ("autograde", A1, "--student", "ben", "--force")]

    run = _Runner(tmp_path / "b", {1: ("nbformat.reader.NotJSONError", {"ben"})})
    with pytest.raises(RuntimeError, match="NotJSONError"):
        course._run_worker(tmp_path / "b", share, _Bar(), run=run)
    assert len(run.calls) == 1, "a failure that is not a kernel start is not retried"

    run = _Runner(tmp_path / "c", {1: (start, {"ben"}), 2: (start, {"ben"})})
    with pytest.raises(RuntimeError, match="Kernel didn't respond"):
        course._run_worker(tmp_path / "c", share, _Bar(), run=run)
    assert len(run.calls) == 2, "one more try, not more"
