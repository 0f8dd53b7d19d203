"""Release and grade the Attention by Hand assignments with nbgrader, headless.

    python course.py release [A1 ...]                       # source/ -> release/ (+ gradebook)
    python course.py grade   [A1 ...] [--student S ...] [--workers N]
                                                            # submitted/ -> autograded/, feedback/, reports/
    python course.py report  [A1 ...] [--student S ...]     # feedback/ and reports/ again, after hand grading

`make assignments`, `make grade` and `make report` call these. With no names, every assignment
in source/ (A1 is short for A1_seven_steps); with no --student, every student who handed it in.
Grading runs on all cores: each worker grades its share in a private copy of the course (its
own copy of the gradebook), and only this process writes the real gradebook, one submission
at a time, keeping grades given by hand. A submission with a cell stopped at the time limit
(c.Execute.timeout) is graded once more on its own, so a busy machine costs no points; the
better run is kept and the feedback says so. Reports (reports/) always cover everything in the
gradebook: grades.csv (nbgrader's export), grades_by_part.csv and summary.md, which also
flags graded code that reached the package's reference and restored locked cells.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parent


def assignments(root: Path = ROOT) -> list[str]:
    """Every assignment in source/, in order (A1_..., A2_..., ...)."""
    return sorted(p.name for p in (root / "source").iterdir() if (p / f"{p.name}.ipynb").exists())


def resolve(names: list[str], root: Path = ROOT) -> list[str]:
    """Full assignment names for what a teacher typed: 'A1' or 'A1_seven_steps'."""
    known = assignments(root)
    out = []
    for n in names:
        hits = [a for a in known if a == n or a.split("_")[0] == n]
        if len(hits) != 1:
            raise SystemExit(f"unknown assignment {n!r}; source/ has {', '.join(known)}")
        out.append(hits[0])
    return out


def cell_timeout(root: Path = ROOT) -> float:
    """The per-cell time limit nbgrader_config.py sets (c.Execute.timeout)."""
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    return float(cfg.Execute.get("timeout", 30))


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
    """Generate the student version of each assignment into release/ (and the gradebook).

    All of them in one nbgrader run when `names` is every assignment (nbgrader's own "*"):
    8.6 s instead of 27.5 s for eight, most of it nbgrader starting; the same files and gradebook.
    """
    if sorted(names) == assignments(root):
        print(f"release: {len(names)} assignments in one nbgrader run")
        nbgrader("generate_assignment", "*", "--force", root=root)
        return
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
    manual: bool = False  # a written answer, graded by hand
    comment: str = ""  # the teacher's comment on it


def parts(name: str, root: Path = ROOT, students: list[str] | None = None) -> list[Part]:
    """Per-part scores of the graded submissions of `name` in the gradebook (all, or `students`)."""
    from nbgrader.api import Gradebook, MissingEntry

    rows = []
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        try:
            subs = gb.assignment_submissions(name)
        except MissingEntry:
            return []
        for submission in sorted(subs, key=lambda s: s.student.id):
            student = submission.student.id
            if students is not None and student not in students:
                continue
            for notebook in submission.notebooks:
                comments = {c.name: c.manual_comment or "" for c in notebook.comments}
                for g in sorted(notebook.grades, key=lambda g: g.cell_id):
                    manual = g.cell.cell_type == "markdown"
                    rows.append(Part(student, name, g.name, float(g.score), float(g.max_score),
                                     bool(g.needs_manual_grade), manual,
                                     comments.get(g.name, "")))
    return rows


def _cells_by_id(path: Path) -> dict[str, nbformat.NotebookNode]:
    """The cells nbgrader tracks in the notebook at `path`, by grade_id."""
    return graded_cells(nbformat.read(path, as_version=4)) if path.exists() else {}


def edited_locked_cells(name: str, student: str, root: Path = ROOT) -> list[str]:
    """grade_ids of locked cells (tests, instructions) the student changed or deleted.

    They are restored from the source before grading (deleted ones put back in place), so
    an edit cannot raise a grade; listing them tells the teacher who tried (or who broke a
    cell by accident).
    """
    released = _cells_by_id(root / "release" / name / f"{name}.ipynb")
    found = _cells_by_id(root / "submitted" / student / name / f"{name}.ipynb")
    return sorted(gid for gid, cell in released.items()
                  if cell.metadata["nbgrader"].get("locked")
                  and (gid not in found or (found[gid].source != cell.source
                                            and not translated_from(found[gid], cell))))


def translated_from(cell: nbformat.NotebookNode, released: nbformat.NotebookNode) -> bool:
    """Whether `cell` is the released cell's translation, as a translated edition handed it
    out and left unedited: student_pack.translate_assignment notes the md5 of the English it
    translated and of its translation (`mha_translation`). Grading restores the English of
    every locked cell anyway; this only keeps such a cell from being reported as edited."""
    import hashlib

    note = cell.get("metadata", {}).get("mha_translation") or {}

    def md5(text: str) -> str:
        return hashlib.md5(text.encode("utf-8")).hexdigest()

    return (note.get("original_md5") == md5(released.source)
            and note.get("md5") == md5(cell.source))


def repaired(submission: nbformat.NotebookNode, release: nbformat.NotebookNode
             ) -> tuple[nbformat.NotebookNode, list[str]]:
    """The submission with every tracked cell it lacks put back from the release, in place.

    nbgrader restores the source of locked cells it finds, but a deleted test cell would be
    an ungradable item: put back, it is graded like any other (a deleted answer cell comes
    back as its empty stub). Returns (notebook, grade_ids put back).
    """
    have = graded_cells(submission)
    nb = nbformat.from_dict(submission)
    back = []
    for i, cell in enumerate(release.cells):
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid is None or gid in have:
            continue
        before = [c.metadata.get("nbgrader", {}).get("grade_id") for c in release.cells[:i]]
        ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
        at = next((ids.index(b) + 1 for b in reversed(before) if b in ids), 0)
        nb.cells.insert(at, nbformat.from_dict(cell))
        back.append(gid)
    return nb, back


def private_copy(dest: Path, names: list[str] | None = None, root: Path = ROOT) -> Path:
    """A course of its own in dest/course: config, this tooling and the sources of `names`
    (default all), with no gradebook or submissions; for tests and benchmarks."""
    copy = dest / "course"
    (copy / "source").mkdir(parents=True)
    for f in ("nbgrader_config.py", "course.py", "feedback.py"):
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


# ---- grading ---------------------------------------------------------------------------------
def _prepare_worker(dest: Path, jobs: list[tuple[str, str]], root: Path) -> Path:
    """A private course for one worker: config, sources, releases, a copy of the gradebook,
    and its students' submissions with deleted tracked cells put back."""
    dest.mkdir(parents=True)
    shutil.copy(root / "nbgrader_config.py", dest / "nbgrader_config.py")
    shutil.copy(root / "gradebook.db", dest / "gradebook.db")
    for name in sorted({n for n, _ in jobs}):
        for folder in ("source", "release"):
            shutil.copytree(root / folder / name, dest / folder / name)
    for name, student in jobs:
        src = root / "submitted" / student / name
        shutil.copytree(src, dest / "submitted" / student / name)
        nb_path = dest / "submitted" / student / name / f"{name}.ipynb"
        if nb_path.exists():
            release = nbformat.read(root / "release" / name / f"{name}.ipynb", as_version=4)
            nb, back = repaired(nbformat.read(nb_path, as_version=4), release)
            if back:
                nbformat.write(nb, nb_path)
    return dest


# What nbclient says when a kernel never came up (a busy machine, a port another process took);
# nothing about the submission, so such a submission is graded once more.
KERNEL_START_FAILURES = ("Kernel didn't respond in", "Kernel died before replying")


def _run_worker(dest: Path, share: list[tuple[str, str]], bar, run=nbgrader) -> None:
    """Autograde every submission in one worker's course, assignment by assignment.

    A submission whose kernel did not start is graded once more, on its own; any other
    failure, or a second failed start, is raised with nbgrader's log. `run`: nbgrader's runner.
    """
    for name in sorted({n for n, _ in share}):
        try:
            run("autograde", name, "--force", root=dest)
        except RuntimeError as err:
            missing = [s for n, s in share if n == name and not
                       (dest / "autograded" / s / name / f"{name}.ipynb").exists()]
            if not missing or not any(m in str(err) for m in KERNEL_START_FAILURES):
                raise
            print(f"{name}: a kernel did not start for {', '.join(missing)}; grading "
                  f"{'it' if len(missing) == 1 else 'them'} again", file=sys.stderr)
            for student in missing:
                run("autograde", name, "--student", student, "--force", root=dest)
        bar.update(sum(n == name for n, _ in share))


# What a cell that ran past c.Execute.timeout leaves in the autograded notebook.
TIMEOUT_ERRORS = ("CellTimeoutError", "TimeoutError", "KeyboardInterrupt")
RETRY_RECORD = "timeout_retry.txt"  # beside the autograded notebook: the retry and its outcome


def timed_out_cells(path: Path) -> list[str]:
    """Grade ids (or cell numbers) of the cells of a notebook stopped at the time limit."""
    if not path.exists():
        return []
    nb = nbformat.read(path, as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        if any(o.get("output_type") == "error" and o.get("ename") in TIMEOUT_ERRORS
               for o in cell.get("outputs", [])):
            out.append(cell.metadata.get("nbgrader", {}).get("grade_id") or f"cell {i + 1}")
    return out


def _auto_score(db_path: Path, name: str, student: str) -> float:
    """The autograded total of one submission in a (worker's) gradebook."""
    db = sqlite3.connect(db_path, timeout=60)
    try:
        row = db.execute("""
            SELECT SUM(COALESCE(g.auto_score, 0)) FROM grade g
            JOIN submitted_notebook sn ON sn.id = g.notebook_id
            JOIN submitted_assignment sa ON sa.id = sn.assignment_id
            JOIN assignment a ON a.id = sa.assignment_id
            WHERE a.name = ? AND sa.student_id = ?""", (name, student)).fetchone()
    finally:
        db.close()
    return float(row[0] or 0)


def _retry_timeouts(dests: list[Path], shares: list[list[tuple[str, str]]], root: Path,
                    tmp: Path, run=nbgrader) -> dict[tuple[str, str], Path]:
    """Grade once more, alone, every submission with a cell stopped at the time limit.

    A busy machine (all workers at once) can push an honest cell past the limit, so each such
    submission is graded again in a course of its own, one after another, with the same limit.
    The better run is kept (the retry on a tie); both runs are recorded in RETRY_RECORD beside
    the kept notebook. Returns {(assignment, student): the retry's course} where it was kept.
    """
    kept: dict[tuple[str, str], Path] = {}
    todo = [(dest, name, student) for dest, share in zip(dests, shares, strict=True)
            for name, student in share
            if timed_out_cells(dest / "autograded" / student / name / f"{name}.ipynb")]
    for k, (dest, name, student) in enumerate(todo):
        first_nb = dest / "autograded" / student / name / f"{name}.ipynb"
        first_cells = timed_out_cells(first_nb)
        first = _auto_score(dest / "gradebook.db", name, student)
        print(f"{student}'s {name}: {', '.join(first_cells)} ran past the time limit; "
              f"grading it again on its own", file=sys.stderr)
        again = _prepare_worker(tmp / f"retry{k}", [(name, student)], root)
        try:
            run("autograde", name, "--student", student, "--force", root=again)
        except RuntimeError as err:
            print(f"the retry of {student}'s {name} failed; keeping the first run:\n{err}",
                  file=sys.stderr)
            continue
        again_nb = again / "autograded" / student / name / f"{name}.ipynb"
        if not again_nb.exists():
            continue
        again_cells = timed_out_cells(again_nb)
        second = _auto_score(again / "gradebook.db", name, student)
        better = again if second >= first else dest
        if better is again:
            kept[(name, student)] = again
        record = (f"first run (with the other submissions): {first:g} points, past the time "
                  f"limit: {', '.join(first_cells)}\n"
                  f"run alone: {second:g} points, past the time limit: "
                  f"{', '.join(again_cells) or 'none'}\n"
                  f"kept: {'run alone' if better is again else 'first run'}\n")
        (better / "autograded" / student / name / RETRY_RECORD).write_text(record)
    return kept


def retry_note(name: str, student: str, root: Path = ROOT) -> str | None:
    """The feedback's sentence about a submission graded again because of the time limit."""
    path = root / "autograded" / student / name / RETRY_RECORD
    if not path.exists():
        return None
    lines = dict(ln.split(": ", 1) for ln in path.read_text().splitlines() if ": " in ln)
    limit = f"{cell_timeout(root):g} s"
    first = lines.get("first run (with the other submissions)", "").split(", past the time limit: ")
    alone = lines.get("run alone", "").split(", past the time limit: ")
    cells = first[1] if len(first) > 1 else "a cell"
    still = alone[1] if len(alone) > 1 else "none"
    if still == "none":
        return (f"{cells} ran past the {limit} limit while the grading machine was busy; "
                f"your notebook was graded again on its own, where it finished in time, "
                f"and that run is the one graded.")
    return (f"{still} ran past the {limit} limit twice: once with the other submissions and "
            f"once when your notebook was graded again on its own. The better of the two "
            f"runs is the one graded.")


def _hand_grades(db: sqlite3.Connection, name: str, student: str) -> dict[str, tuple]:
    """{grade_id: (manual_score, manual_comment)} for the hand-graded cells of one submission."""
    rows = db.execute("""
        SELECT bc.name, g.manual_score, c.manual_comment FROM grade g
        JOIN base_cell bc ON bc.id = g.cell_id
        JOIN submitted_notebook sn ON sn.id = g.notebook_id
        JOIN submitted_assignment sa ON sa.id = sn.assignment_id
        JOIN assignment a ON a.id = sa.assignment_id
        LEFT JOIN comment c ON c.notebook_id = g.notebook_id AND c.cell_id IN
            (SELECT id FROM base_cell WHERE name = bc.name AND notebook_id = bc.notebook_id)
        WHERE a.name = ? AND sa.student_id = ? AND g.manual_score IS NOT NULL""",
                      (name, student)).fetchall()
    return {gid: (score, comment) for gid, score, comment in rows}


def _merge(worker_db: Path, jobs: list[tuple[str, str]], root: Path,
           answers_before: dict[tuple[str, str], dict[str, str]]) -> None:
    """Copy one worker's grades into the real gradebook, one submission per transaction.

    A grade given by hand survives when the student's answer to that cell is unchanged;
    a changed answer goes back to "to grade".
    """
    db = sqlite3.connect(root / "gradebook.db", timeout=60)
    try:
        db.execute("ATTACH DATABASE ? AS w", (str(worker_db),))
        for name, student in jobs:
            aid = db.execute("SELECT id FROM assignment WHERE name = ?", (name,)).fetchone()[0]
            if db.execute("SELECT 1 FROM w.submitted_assignment WHERE assignment_id = ? AND "
                          "student_id = ?", (aid, student)).fetchone() is None:
                print(f"warning: {student}'s {name} was not graded (see nbgrader's log above); "
                      f"the gradebook keeps what it had")
                continue
            with db:  # one transaction: the gradebook never holds half a submission
                kept = _hand_grades(db, name, student)
                db.execute("INSERT OR IGNORE INTO main.student SELECT * FROM w.student "
                           "WHERE id = ?", (student,))
                sa = "SELECT id FROM {db}.submitted_assignment WHERE assignment_id = ? AND student_id = ?"
                sn = f"SELECT id FROM {{db}}.submitted_notebook WHERE assignment_id IN ({sa})"
                for table in ("grade", "comment"):
                    db.execute(f"DELETE FROM main.{table} WHERE notebook_id IN "
                               f"({sn.format(db='main')})", (aid, student))
                db.execute(f"DELETE FROM main.submitted_notebook WHERE assignment_id IN "
                           f"({sa.format(db='main')})", (aid, student))
                db.execute("DELETE FROM main.submitted_assignment WHERE assignment_id = ? "
                           "AND student_id = ?", (aid, student))
                db.execute("INSERT INTO main.submitted_assignment SELECT * FROM "
                           "w.submitted_assignment WHERE assignment_id = ? AND student_id = ?",
                           (aid, student))
                db.execute(f"INSERT INTO main.submitted_notebook SELECT * FROM "
                           f"w.submitted_notebook WHERE assignment_id IN ({sa.format(db='w')})",
                           (aid, student))
                for table in ("grade", "comment"):
                    db.execute(f"INSERT INTO main.{table} SELECT * FROM w.{table} WHERE "
                               f"notebook_id IN ({sn.format(db='w')})", (aid, student))
                now = _cells_by_id(root / "autograded" / student / name / f"{name}.ipynb")
                before = answers_before.get((name, student), {})
                for gid, (score, comment) in kept.items():
                    if gid in now and gid in before and now[gid].source == before[gid]:
                        cell = ("SELECT bc.id FROM base_cell bc JOIN notebook n ON n.id = "
                                "bc.notebook_id WHERE n.assignment_id = ? AND bc.name = ?")
                        db.execute(f"UPDATE main.grade SET manual_score = ?, needs_manual_grade = 0 "
                                   f"WHERE cell_id IN ({cell}) AND notebook_id IN "
                                   f"({sn.format(db='main')})", (score, aid, gid, aid, student))
                        db.execute(f"UPDATE main.comment SET manual_comment = ? WHERE cell_id IN "
                                   f"({cell}) AND notebook_id IN ({sn.format(db='main')})",
                                   (comment, aid, gid, aid, student))
        db.execute("DETACH DATABASE w")
    finally:
        db.close()


def _check_folders(names: list[str], root: Path) -> list[str]:
    """Plain-words warnings for autograded/ folders the gradebook does not know."""
    from nbgrader.api import Gradebook

    warnings = []
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        known = {s.id for s in gb.students}
    for name in names:
        for folder in sorted((root / "autograded").glob(f"*/{name}")):
            student = folder.parent.name
            if student not in known:
                warnings.append(
                    f"autograded/{student}/{name} exists but the gradebook has no student "
                    f"{student!r} (removed from the gradebook?): it is left out of the reports. "
                    f"Regrade it with `make grade A={name.split('_')[0]} STUDENT={student}` or "
                    f"delete the folder.")
    return warnings


def _balanced(jobs: list[tuple[str, str]], workers: int) -> list[list[tuple[str, str]]]:
    """Split (assignment, student) jobs into `workers` shares of about equal time."""
    cost = {"A2": 3.0, "A4": 3.0, "A3": 2.5, "A7": 3.0}  # torch imports and A3's probes (measured; A7 assumed like A2: torch)
    shares: list[list[tuple[str, str]]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for job in sorted(jobs, key=lambda j: -cost.get(j[0][:2], 1.5)):
        i = load.index(min(load))
        shares[i].append(job)
        load[i] += cost.get(job[0][:2], 1.5)
    return [s for s in shares if s]


def grade(names: list[str], root: Path = ROOT, students: list[str] | None = None,
          workers: int | None = None) -> list[Part]:
    """Autograde the submissions of `names` (all students, or `students`) on `workers`
    processes, merge them into the gradebook, then write feedback, CSVs and the summary."""
    jobs = [(n, s) for n in names for s in students_with(n, root)
            if students is None or s in students]
    if not jobs:
        print(f"nothing to grade: put each submission at {root / 'submitted'}/STUDENT/"
              f"ASSIGNMENT/ASSIGNMENT.ipynb (assignments: {', '.join(names)}"
              + (f"; students: {', '.join(students)}" if students else "") + ")")
        return []
    started = time.perf_counter()
    missing = [n for n in sorted({n for n, _ in jobs}) if not (root / "release" / n).exists()]
    if missing or not (root / "gradebook.db").exists():
        release(missing or sorted({n for n, _ in jobs}), root)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    shares = _balanced(jobs, workers)
    answers_before = {(n, s): {gid: c.source for gid, c in _cells_by_id(
        root / "autograded" / s / n / f"{n}.ipynb").items()} for n, s in jobs}
    with tempfile.TemporaryDirectory(prefix="grading-") as tmp:
        dests = [_prepare_worker(Path(tmp) / f"worker{i}", share, root)
                 for i, share in enumerate(shares)]
        with ThreadPoolExecutor(len(shares)) as pool, \
                tqdm(total=len(jobs), desc=f"autograde ({len(shares)} workers)",
                     unit="submission") as bar:
            futures = [pool.submit(_run_worker, dest, share, bar)
                       for dest, share in zip(dests, shares, strict=True)]
            for fut in futures:
                fut.result()  # re-raise a worker's failure here, with nbgrader's log
        retried = _retry_timeouts(dests, shares, root, Path(tmp))
        runs = [(dest, [j for j in share if j not in retried])
                for dest, share in zip(dests, shares, strict=True)]
        runs += [(again, [job]) for job, again in retried.items()]
        for dest, share in runs:
            for name, student in share:
                got = dest / "autograded" / student / name
                if not got.exists():
                    continue
                shutil.rmtree(root / "autograded" / student / name, ignore_errors=True)
                shutil.copytree(got, root / "autograded" / student / name)
            _merge(dest / "gradebook.db", share, root, answers_before)
    seconds = time.perf_counter() - started
    return report(sorted({n for n, _ in jobs}), root, seconds,
                  students=sorted({s for _, s in jobs}), workers=len(shares))


# ---- feedback and reports ---------------------------------------------------------------------
_REFERENCE = re.compile(r"\[reference used: ([\w.<>]+)\]")


def reference_used(name: str, student: str, root: Path = ROOT) -> dict[str, list[str]]:
    """{grade_id of a test cell: [package references its graded code reached]}."""
    path = root / "autograded" / student / name / f"{name}.ipynb"
    found: dict[str, list[str]] = {}
    for gid, cell in _cells_by_id(path).items():
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                refs = _REFERENCE.findall(out.get("evalue", ""))
                if refs:
                    found[gid] = sorted(set(found.get(gid, [])) | set(refs))
    return found


def _notes(name: str, student: str, root: Path) -> list[str]:
    """What the feedback says before the parts: restored cells, parts graded with a stand-in."""
    notes = []
    submitted = root / "submitted" / student / name / f"{name}.ipynb"
    release = root / "release" / name / f"{name}.ipynb"
    if submitted.exists() and release.exists():
        have = _cells_by_id(submitted)
        for gid in edited_locked_cells(name, student, root):
            how = "deleted" if gid not in have else "edited"
            notes.append(f"The locked cell {gid} was {how}; it was restored from the original "
                         f"before grading, and graded as usual.")
        rel = _cells_by_id(release)
        for gid, cell in rel.items():
            meta = cell.metadata["nbgrader"]
            if meta.get("solution") and gid not in have:
                notes.append(f"The answer cell {gid} was deleted; it was put back empty.")
    retry = retry_note(name, student, root)
    if retry:
        notes.append(retry)
    path = root / "autograded" / student / name / f"{name}.ipynb"
    for gid, cell in _cells_by_id(path).items():
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                notes += [f"{gid}: {line[len('note: '):]}" for line in out.get("text", "").splitlines()
                          if line.startswith("note: ")]
    return notes


def _feedback_one(args: tuple) -> str:
    """Write one student's feedback page (runs in a worker process)."""
    import feedback

    name, student, root, part_rows, timeout_s = args
    auto = root / "autograded" / student / name
    out = root / "feedback" / student / name
    out.mkdir(parents=True, exist_ok=True)
    results = [feedback.PartResult(p.part, None if (p.manual and p.needs_manual_grade) else p.score,
                                   p.max_score, p.manual, p.comment) for p in part_rows]
    feedback.write(auto / f"{name}.ipynb", out / f"{name}.html", results, student=student,
                   assignment=name, timeout_s=timeout_s, notes=_notes(name, student, root))
    for extra in ("timestamp.txt", "submission_secret.txt"):  # what release_feedback reads
        if (auto / extra).exists():
            shutil.copy(auto / extra, out / extra)
    return student


def report(names: list[str], root: Path = ROOT, seconds: float | None = None,
           students: list[str] | None = None, workers: int | None = None) -> list[Part]:
    """Feedback for `names` (all students, or `students`), then grades CSVs and summary.md for
    everything in the gradebook.

    Run it again after grading the written answers by hand (formgrader): it keeps those
    grades, and the feedback then shows them with your comments.
    """
    warnings = _check_folders(names, root)
    for w in warnings:
        print(f"warning: {w}")
    timeout_s = cell_timeout(root)
    todo = []
    for name in names:
        rows = parts(name, root, students)
        for student in sorted({r.student for r in rows}):
            if (root / "autograded" / student / name / f"{name}.ipynb").exists():
                todo.append((name, student, root, [r for r in rows if r.student == student],
                             timeout_s))
    if todo:
        with ProcessPoolExecutor(max(1, min(workers or os.cpu_count() or 1, len(todo)))) as pool:
            list(tqdm(pool.map(_feedback_one, todo), total=len(todo), desc="feedback",
                      unit="submission"))
    everything = [r for name in assignments(root) for r in parts(name, root)]
    reports = root / "reports"
    reports.mkdir(exist_ok=True)
    nbgrader("export", "--to", str(reports / "grades.csv"), root=root)
    flags = {(s, n): reference_used(n, s, root) for s, n in {(r.student, r.assignment)
                                                              for r in everything}}
    with open(reports / "grades_by_part.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "assignment", "part", "score", "max_score", "needs_manual_grade",
                    "graded_by", "reference_used"])
        for r in everything:
            w.writerow([r.student, r.assignment, r.part, r.score, r.max_score,
                        r.needs_manual_grade, "hand" if r.manual else "autograder",
                        " ".join(flags[(r.student, r.assignment)].get(r.part, []))])
    restored = {(s, n): edited_locked_cells(n, s, root) for s, n in flags}
    summary = _summary(everything, restored, flags, seconds, warnings, workers, len(todo))
    (reports / "summary.md").write_text(summary)
    print(summary)
    return [r for r in everything if r.assignment in names
            and (students is None or r.student in students)]


def _summary(rows: list[Part], restored: dict[tuple[str, str], list[str]],
             flags: dict[tuple[str, str], dict[str, list[str]]], seconds: float | None,
             warnings: list[str], workers: int | None, regraded: int) -> str:
    """Markdown: per student and assignment the autograded score, hand grades apart, parts
    lost, references reached and restored cells; then the flags on their own lines."""
    cells: dict[tuple[str, str], list[Part]] = {}
    for r in rows:
        cells.setdefault((r.student, r.assignment), []).append(r)
    timing = "" if seconds is None else (f"; this run graded {regraded} in {seconds:.0f} s on "
                                         f"{workers} worker(s)")
    lines = [f"# Grades ({len(cells)} submissions in the gradebook{timing})", "",
             "| student | assignment | autograded | by hand | parts lost | reference used | "
             "locked cells restored |", "|---|---|---|---|---|---|---|"]
    for (student, name), ps in sorted(cells.items()):
        auto = [p for p in ps if not p.manual]
        manual = [p for p in ps if p.manual]
        todo = [p for p in manual if p.needs_manual_grade]
        done = [p for p in manual if not p.needs_manual_grade]
        hand = (f"{sum(p.score for p in done):g} / {sum(p.max_score for p in done):g}"
                if done else "-")
        if todo:
            hand += f" ({len(todo)} to grade, {sum(p.max_score for p in todo):g} pts)"
        lost = [p.part for p in auto if p.score < p.max_score]
        refs = flags.get((student, name), {})
        student = student.replace("|", "\\|")
        lines.append(
            f"| {student} | {name} | {sum(p.score for p in auto):g} / "
            f"{sum(p.max_score for p in auto):g} | {hand} | {', '.join(lost) or '-'} | "
            f"{', '.join(sorted(refs)) or '-'} | "
            f"{', '.join(restored.get((student, name), [])) or '-'} |")
    flagged = [f"- **{s}**, {n}, part `{gid}`: reached `{ref}`"
               for (s, n), refs in sorted(flags.items()) for gid, rs in sorted(refs.items())
               for ref in rs]
    if flagged:
        lines += ["", "## Graded code that reached the package's reference (0 points for the part)",
                  ""] + flagged
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    lines += ["", "Feedback for each student: feedback/STUDENT/ASSIGNMENT/*.html. Written answers "
              "are graded in the formgrader (see README.md); `make report` then updates this page."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: release, grade or report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["release", "grade", "report"])
    ap.add_argument("names", nargs="*", help="assignments, e.g. A1 or A1_seven_steps (default: all)")
    ap.add_argument("--student", action="append", default=None,
                    help="only this student (repeat for several; default: everyone)")
    ap.add_argument("--workers", type=int, default=None,
                    help="grading processes (default: one per CPU core)")
    args = ap.parse_args(argv)
    names = resolve(args.names) if args.names else assignments()
    if args.command == "release":
        release(names)
        print(f"released {', '.join(names)} into {ROOT / 'release'}")
    elif args.command == "grade":
        grade(names, students=args.student, workers=args.workers)
    else:
        report(names, students=args.student)
    return 0


if __name__ == "__main__":
    sys.exit(main())
