"""Release and grade the Attention by Hand assignments with nbgrader, headless.

    python course.py release [A1_seven_steps ...]   # source/ -> release/ (+ gradebook)
    python course.py grade   [A1_seven_steps ...]   # submitted/ -> autograded/, feedback/, reports/
    python course.py report  [A1_seven_steps ...]   # feedback/ and reports/ again, after hand grading

`make assignments`, `make grade` and `make report` call these. With no names, every assignment in source/.
Reports (reports/): nbgrader's grades.csv, grades_by_part.csv (one row per student, assignment
and graded part) and summary.md, which also lists submissions whose locked cells were edited.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent


def assignments(root: Path = ROOT) -> list[str]:
    """Every assignment in source/, in order (A1_..., A2_..., ...)."""
    return sorted(p.name for p in (root / "source").iterdir() if (p / f"{p.name}.ipynb").exists())


def nbgrader(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    """Run one nbgrader command in the course folder; raise with its log if it fails."""
    env = dict(os.environ)
    # nbgrader runs `alembic` from PATH to set up the gradebook: use this venv's.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=root, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def release(names: list[str], root: Path = ROOT) -> None:
    """Generate the student version of each assignment into release/ (and the gradebook)."""
    for name in tqdm(names, desc="release", unit="assignment"):
        nbgrader("generate_assignment", name, "--force", root=root)


def students_with(name: str, root: Path = ROOT) -> list[str]:
    """Students who have a submission of assignment `name` in submitted/."""
    sub = root / "submitted"
    if not sub.exists():
        return []
    return sorted(p.name for p in sub.iterdir() if (p / name).is_dir())


@dataclass(frozen=True)
class Part:
    """One graded cell of one student's submission."""

    student: str
    assignment: str
    part: str
    score: float
    max_score: float
    needs_manual_grade: bool


def parts(name: str, root: Path = ROOT) -> list[Part]:
    """Per-part scores of every graded submission of `name`, from the gradebook."""
    from nbgrader.api import Gradebook

    rows = []
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for student in students_with(name, root):
            submission = gb.find_submission(name, student)
            for notebook in submission.notebooks:
                for g in sorted(notebook.grades, key=lambda g: g.cell_id):
                    rows.append(Part(student, name, g.name, float(g.score), float(g.max_score),
                                     bool(g.needs_manual_grade)))
    return rows


def edited_locked_cells(name: str, student: str, root: Path = ROOT) -> list[str]:
    """grade_ids of locked cells (tests, instructions) the student changed or deleted.

    nbgrader restores them from the gradebook before grading, so an edit cannot raise a
    grade; listing them tells the teacher who tried (or who broke a cell by accident).
    """
    released = {}
    for path in (root / "release" / name).glob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("locked"):
                released[(path.name, meta["grade_id"])] = cell.source
    found = {}
    for path in (root / "submitted" / student / name).glob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if "grade_id" in meta:
                found[(path.name, meta["grade_id"])] = cell.source
    return sorted(gid for (nb, gid), src in released.items() if found.get((nb, gid)) != src)


def private_copy(dest: Path, names: list[str] | None = None, root: Path = ROOT) -> Path:
    """A course of its own in dest/course: config, this tooling and the sources of `names`
    (default all), with no gradebook or submissions; for tests and benchmarks."""
    copy = dest / "course"
    (copy / "source").mkdir(parents=True)
    for f in ("nbgrader_config.py", "course.py"):
        shutil.copy(root / f, copy / f)
    for name in names or assignments(root):
        shutil.copytree(root / "source" / name, copy / "source" / name)
    return copy


def graded_cells(nb) -> dict[str, nbformat.NotebookNode]:
    """The cells nbgrader tracks (solutions, tests, locked cells), by grade_id."""
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
            if "grade_id" in c.metadata.get("nbgrader", {})}


def model_submission(name: str, root: Path = ROOT) -> nbformat.NotebookNode:
    """The release of `name` with every answer filled in from the source's model solution."""
    source = nbformat.read(root / "source" / name / f"{name}.ipynb", as_version=4)
    nb = nbformat.read(root / "release" / name / f"{name}.ipynb", as_version=4)
    answers = graded_cells(source)
    for gid, cell in graded_cells(nb).items():
        if cell.metadata["nbgrader"].get("solution"):
            cell.source = "\n".join(line for line in answers[gid].source.splitlines()
                                    if "### BEGIN SOLUTION" not in line
                                    and "### END SOLUTION" not in line)
    return nb


def submit(name: str, student: str, nb, root: Path = ROOT) -> Path:
    """Place a notebook where nbgrader collects it: submitted/STUDENT/NAME/NAME.ipynb."""
    folder = root / "submitted" / student / name
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{name}.ipynb")
    return folder / f"{name}.ipynb"


def grade(names: list[str], root: Path = ROOT) -> list[Part]:
    """Autograde every submission of `names`, then write feedback, CSVs and the summary."""
    todo = [n for n in names if students_with(n, root)]
    if not todo:
        print(f"nothing to grade: put each submission at {root / 'submitted'}/STUDENT/"
              f"ASSIGNMENT/ASSIGNMENT.ipynb (assignments: {', '.join(names)})")
        return []
    started = time.perf_counter()
    for name in tqdm(todo, desc="autograde", unit="assignment"):
        if not (root / "release" / name).exists():
            release([name], root)
        nbgrader("autograde", name, "--force", root=root)
    return report(todo, root, time.perf_counter() - started)


def report(names: list[str], root: Path = ROOT, seconds: float | None = None) -> list[Part]:
    """Feedback HTML, grades CSVs and summary.md from the gradebook as it is now.

    Run it again after grading the written answers by hand (formgrader): it keeps those
    grades, and the feedback then shows them with your comments.
    """
    todo = [n for n in names if students_with(n, root)]
    rows: list[Part] = []
    tampered: dict[tuple[str, str], list[str]] = {}
    for name in tqdm(todo, desc="feedback", unit="assignment"):
        nbgrader("generate_feedback", name, "--force", root=root)
        rows += parts(name, root)
        for student in students_with(name, root):
            edited = edited_locked_cells(name, student, root)
            if edited:
                tampered[(student, name)] = edited
    reports = root / "reports"
    reports.mkdir(exist_ok=True)
    nbgrader("export", "--to", str(reports / "grades.csv"), root=root)
    with open(reports / "grades_by_part.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "assignment", "part", "score", "max_score", "needs_manual_grade"])
        for r in rows:
            w.writerow([r.student, r.assignment, r.part, r.score, r.max_score,
                        r.needs_manual_grade])
    summary = _summary(rows, tampered, seconds)
    (reports / "summary.md").write_text(summary)
    print(summary)
    return rows


def _summary(rows: list[Part], tampered: dict[tuple[str, str], list[str]],
             seconds: float | None) -> str:
    """A markdown table: autograded score per student and assignment, and what needs a look."""
    cells: dict[tuple[str, str], list[Part]] = {}
    for r in rows:
        cells.setdefault((r.student, r.assignment), []).append(r)
    timing = "" if seconds is None else f", autograded in {seconds:.0f} s"
    lines = [f"# Grades ({len(cells)} submissions{timing})", "",
             "| student | assignment | autograded | to grade by hand | parts lost | edited locked cells |",
             "|---|---|---|---|---|---|"]
    for (student, name), ps in sorted(cells.items()):
        auto = [p for p in ps if not p.needs_manual_grade]
        manual = [p for p in ps if p.needs_manual_grade]
        lost = [p.part for p in auto if p.score < p.max_score]
        lines.append(
            f"| {student} | {name} | {sum(p.score for p in auto):g} / "
            f"{sum(p.max_score for p in auto):g} | {len(manual)} answer(s), "
            f"{sum(p.max_score for p in manual):g} pts | {', '.join(lost) or '-'} | "
            f"{', '.join(tampered.get((student, name), [])) or '-'} |")
    lines += ["", "Feedback for each student: feedback/STUDENT/ASSIGNMENT/*.html. Written answers "
              "are graded in the formgrader (see README.md)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: release or grade."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["release", "grade", "report"])
    ap.add_argument("names", nargs="*", help="assignments (default: all in source/)")
    args = ap.parse_args(argv)
    names = args.names or assignments()
    unknown = sorted(set(names) - set(assignments()))
    if unknown:
        ap.error(f"unknown assignment(s) {unknown}; source/ has {assignments()}")
    if args.command == "release":
        release(names)
        print(f"released {', '.join(names)} into {ROOT / 'release'}")
    elif args.command == "grade":
        grade(names)
    else:
        report(names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
