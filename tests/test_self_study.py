"""Self-study (`make assignment A=A1`, `make check A=A1`): the assignments without a teacher.

One private course is cached for the module (tmp, never the venv's) and A1 is started in a tmp
work folder: the learner's copy is the released notebook, leak-checked; grading it untouched
gives 0 points and a feedback page, grading the model solution gives every autograded point;
a planted answer in the release stops `start` before anything reaches the work folder.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402
import self_study  # noqa: E402
import student_pack  # noqa: E402

A1 = "A1_seven_steps"


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(work folder, cache, the learner's notebook) after `start A1`."""
    tmp = tmp_path_factory.mktemp("self-study")
    work, cache = tmp / "work", tmp / "cache"
    return work, cache, self_study.start("A1", work, cache)


def test_start_copies_the_release_and_nothing_secret(started):
    work, cache, notebook = started
    assert notebook == work / "A1" / f"{A1}.ipynb"
    released = cache / A1 / "course" / "release" / A1 / f"{A1}.ipynb"
    mine, release = (nbformat.read(p, as_version=4) for p in (notebook, released))
    assert [c.metadata for c in mine.cells] == [c.metadata for c in release.cells]
    assert [c.source for c in mine.cells if c.cell_type == "code"] == \
        [c.source for c in release.cells if c.cell_type == "code"]
    text = "\n".join(p.read_text() for p in work.rglob("*") if p.is_file())
    for begin, end in student_pack.MARKERS.values():
        assert begin not in text and end not in text
    assert not (work / "A1" / "source").exists() and not list(work.rglob("gradebook.db"))
    assert student_pack.check_leaks(work, COURSE / "source", ROOT).ok


def test_start_never_overwrites_work(started):
    work, cache, notebook = started
    with pytest.raises(FileExistsError, match="your work is kept"):
        self_study.start("A1", work, cache)


def test_an_untouched_notebook_scores_zero_with_a_feedback_page(started):
    work, cache, _ = started
    result = self_study.check("A1", work, cache)
    assert result.score == 0 and result.max_score > 0
    assert result.feedback == work / "A1" / "feedback.html"
    page = result.feedback.read_text()
    assert "<html" in page.lower() and f"{A1}: feedback for you" in page
    assert f"score: 0 / {result.max_score:g}" in result.summary()
    assert str(result.feedback) in result.summary()


def test_the_model_solution_scores_every_autograded_point(started):
    work, cache, notebook = started
    saved = notebook.read_bytes()
    try:
        model = course.model_submission(A1, cache / A1 / "course")
        nbformat.write(model, notebook)
        result = self_study.check("A1", work, cache)
        assert result.score == result.max_score > 0
        assert result.written >= 1 and "not graded automatically" in result.summary()
    finally:
        notebook.write_bytes(saved)


def test_a_planted_answer_stops_start_before_the_work_folder(started, tmp_path):
    _, cache, _ = started
    bad_cache = tmp_path / "cache"
    shutil.copytree(cache, bad_cache)
    self_study.private_course(A1, bad_cache)  # up to date, so the planted copy is used
    release = bad_cache / A1 / "course" / "release" / A1 / f"{A1}.ipynb"
    source = nbformat.read(COURSE / "source" / A1 / f"{A1}.ipynb", as_version=4)
    answer = next(c.source for c in source.cells
                  if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"
                  and "### BEGIN SOLUTION" in c.source)
    nb = json.loads(release.read_text())
    nb["cells"].append({"cell_type": "markdown", "id": "planted", "metadata": {}, "source": answer.split(
        "### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]})
    release.write_text(json.dumps(nb))
    work = tmp_path / "work"
    with pytest.raises(RuntimeError, match=r"(?s)refusing to copy into .*/work/A1: .*LEAK .*a1-"):
        self_study.start("A1", work, bad_cache)
    assert not list(work.rglob("*.ipynb"))


@pytest.mark.parametrize("name", ["A10", "B1", "", "A"])
def test_a_bad_name_is_a_clear_error(name, tmp_path, capsys):
    with pytest.raises(ValueError, match="choose one of A1, A2"):
        self_study.resolve(name)
    assert self_study.main(["check", name, "--work", str(tmp_path)]) == 2
    assert "choose one of A1" in capsys.readouterr().err


def test_check_before_start_says_how_to_start(tmp_path, capsys):
    assert self_study.main(["check", "A2", "--work", str(tmp_path),
                            "--cache", str(tmp_path / "c")]) == 2
    assert "make assignment A=A2" in capsys.readouterr().err


def test_the_make_targets_call_the_tool_after_installing_nbgrader_only(tmp_path):
    out = subprocess.run(["make", "-n", "assignment", "check", "A=A1", "WORK=/tmp/w", "OPEN=1",
                          f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "self_study.py start A1 --work \"/tmp/w\"" in out
    assert "self_study.py check A1 --work \"/tmp/w\" --open" in out
    assert "'^nbgrader==' requirements-dev.txt" in out  # the grader, from its pin
    assert "-r requirements-dev.txt" not in out  # not the test toolchain


def test_lesson_00_tells_a_self_learner_how():
    overview = nbformat.read(ROOT / "notebooks" / "00_overview.ipynb", as_version=4)
    text = "\n".join(c.source for c in overview.cells)
    assert "make assignment A=A1" in text and "make check A=A1" in text


def test_the_cache_is_rebuilt_when_the_course_changes(started, tmp_path):
    _, cache, _ = started
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    (copy / A1 / "fingerprint").write_text("an older course")
    stale = copy / A1 / "course" / "release" / A1 / f"{A1}.ipynb"
    stale.write_text("{}")
    self_study.private_course(A1, copy)
    assert (copy / A1 / "fingerprint").read_text() == self_study._fingerprint(A1)
    assert nbformat.read(stale, as_version=4).cells


def test_lesson_links_point_at_the_repositorys_lessons(started):
    work, _, notebook = started
    text = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells)
    links = re.findall(r"\]\(([^)]*\d\d_[a-z0-9_]+\.ipynb)", text)
    assert links and not self_study.LESSON_LINK.search(text)  # none left as in release/
    for link in links:
        assert (notebook.parent / link).resolve().is_file(), link
    lab = self_study.lab_root(work)
    assert lab == work or lab in (notebook.parent / links[0]).resolve().parents


def test_lab_opens_on_the_folder_holding_work_and_lessons():
    assert self_study.lab_root(ROOT.parent / "my-work") == ROOT.parent
    assert self_study.lab_root(ROOT / "notebooks" / "mine") == ROOT / "notebooks"


def test_a_grading_that_gives_nothing_says_what_the_grader_said(started, monkeypatch):
    work, cache, _ = started

    def silent(*args, **kwargs):
        print("warning: you's A1 was not graded")
        return []

    monkeypatch.setattr(course, "grade", silent)
    with pytest.raises(RuntimeError, match="gave no result:\nwarning: you's A1 was not graded"):
        self_study.check("A1", work, cache)
