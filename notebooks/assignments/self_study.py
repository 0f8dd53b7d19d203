"""The graded assignments for a learner without a teacher: start one, grade it yourself.

    python notebooks/assignments/self_study.py start A1 [--work DIR]   # `make assignment A=A1`
    python notebooks/assignments/self_study.py check A1 [--work DIR] [--open]   # `make check A=A1`

`start` copies the assignment's released notebook (no solutions, no hidden tests) into
DIR/A1/ (DIR defaults to ~/attention-by-hand-work), after the student pack's leak check has
found nothing of the solutions or hidden tests in it (its lesson links then point at the
repository's lessons); it never overwrites your work. `start A1 --lang zh_CN`
(`make assignment A=A1 LANG=zh_CN`) gives the same notebook with its instructions in Chinese
(from the catalogs, as the Chinese student pack has them) and a `.mha-language` file beside it,
so its Try-it messages answer in Chinese; its lesson links go to the Chinese lessons where
`make lab-zh` wrote them (notebooks/zh_CN/), else to the English ones. `check` grades either
edition the same way.
`check` grades DIR/A1/NAME.ipynb with the course's own autograder (nbgrader, hidden tests
and all), writes the feedback page to DIR/A1/feedback.html and prints its path and the score.

Nothing needs a teacher's setup: the released notebook, the gradebook and the grading run
live in a private copy of the course in a cache folder (--cache; default: self-study/ in the
virtual environment), rebuilt when the course's sources change. The cache holds the
solutions (so the autograder can grade), the work folder never does.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import re
import shutil
import sys
import tempfile
import webbrowser
from dataclasses import dataclass
from pathlib import Path

COURSE = Path(__file__).resolve().parent  # notebooks/assignments
sys.path.insert(0, str(COURSE))
import course  # noqa: E402  (the course's own tooling: release, grade)
import student_pack  # noqa: E402  (the leak check)

DEFAULT_WORK = Path.home() / "attention-by-hand-work"
STUDENT = "you"  # the one student of a self-study course (the page says "feedback for you")
TOOLING = ("nbgrader_config.py", "course.py", "feedback.py")
LESSON_LINK = re.compile(r"\]\(\.\./\.\./\.\./(\d\d_[a-z0-9_]+\.ipynb)")  # from release/NAME/


def default_cache() -> Path:
    """Where the private course lives: inside the virtual environment, else ~/.cache."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "self-study"
    return Path.home() / ".cache" / "attention-by-hand" / "self-study"


def resolve(short: str) -> str:
    """The full assignment name for 'A1' or 'A1_seven_steps'; a clear error for anything else."""
    known = course.assignments(COURSE)
    hits = [a for a in known if short and (a == short or a.split("_")[0] == short)]
    if len(hits) != 1:
        shorts = ", ".join(a.split("_")[0] for a in known)
        what = f"unknown assignment {short!r}" if short else "no assignment named"
        raise ValueError(f"{what}: choose one of {shorts} (e.g. `make check A=A1`)")
    return hits[0]


def _fingerprint(name: str) -> str:
    """A hash of the assignment's source notebook and the grading tooling."""
    h = hashlib.sha256()
    for path in [COURSE / "source" / name / f"{name}.ipynb", *(COURSE / f for f in TOOLING)]:
        h.update(path.read_bytes())
    return h.hexdigest()


def private_course(name: str, cache: Path) -> Path:
    """The cached private course of one assignment, released; rebuilt when sources change."""
    folder = cache / name
    root, stamp = folder / "course", folder / "fingerprint"
    want = _fingerprint(name)
    released = root / "release" / name / f"{name}.ipynb"
    if released.is_file() and stamp.is_file() and stamp.read_text() == want:
        return root
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    root = course.private_copy(folder, [name], root=COURSE)
    with contextlib.redirect_stdout(io.StringIO()):
        course.release([name], root)
    stamp.write_text(want)
    return root


def assignment_dir(name: str, work: Path) -> Path:
    """The learner's folder of one assignment: WORK/A1."""
    return Path(work).expanduser().resolve() / name.split("_")[0]


def leak_check(folder: Path, dest: Path) -> student_pack.LeakReport:
    """The student pack's leak check of `folder` (bound for `dest`); raises on anything secret."""
    report = student_pack.check_leaks(folder, COURSE / "source", student_pack.ROOT)
    if not report.ok:
        raise RuntimeError(f"refusing to copy into {dest}: the release holds answers or "
                           "hidden tests (a broken release; report it)\n"
                           + report.summary())
    bad = student_pack.forbidden(folder)
    if bad:
        raise RuntimeError(f"refusing to copy into {dest}: the release holds teacher files {bad}")
    return report


def lessons_dir(lang: str = "en") -> Path:
    """The repository's lessons, notebooks/; for zh_CN, the Chinese lessons that `make lab-zh`
    writes (tools.book.i18n's notebooks/zh_CN/) when they are there."""
    english = student_pack.ROOT / "notebooks"
    translated = english / lang
    if lang != "en" and (translated / "00_overview.ipynb").is_file():
        return translated
    return english


def _relinker(dest: Path, lang: str = "en"):
    """Markdown -> markdown with its lesson links (as in release/NAME/) pointing at the
    lessons, as seen from `dest`."""
    rel = Path(os.path.relpath(lessons_dir(lang), dest)).as_posix()
    return lambda text: LESSON_LINK.sub(lambda m: f"]({rel}/{m.group(1)}", text)


def relink_lessons(nb_path: Path, dest: Path, lang: str = "en") -> None:
    """Point a notebook's lesson links at the repository's lessons, as seen from `dest`."""
    import nbformat

    relink = _relinker(dest, lang)
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = relink(cell.source)
    nbformat.write(nb, nb_path)


def lab_root(work: Path, lang: str = "en") -> Path:
    """Where to start JupyterLab so the work and its lesson links open: their common folder."""
    work = Path(work).expanduser().resolve()
    common = Path(os.path.commonpath([work, lessons_dir(lang)]))
    return common if common != Path(common.anchor) else work


def start(short: str, work: Path = DEFAULT_WORK, cache: Path | None = None,
          lang: str = "en") -> Path:
    """Copy the released notebook of `short` into WORK/A1/ (leak-checked); its path.

    With `lang` (zh_CN): its instructions in that language (student_pack.translate_assignment:
    code, answer stubs and nbgrader's grading cells as released) and `.mha-language` beside it.
    """
    if lang not in student_pack.LANGS:
        raise ValueError(f"unknown language {lang!r}: choose one of {', '.join(student_pack.LANGS)}")
    name = resolve(short)
    dest = assignment_dir(name, work)
    notebook = dest / f"{name}.ipynb"
    if notebook.exists():
        raise FileExistsError(f"{notebook} exists: your work is kept. Grade it with "
                              f"`make check A={name.split('_')[0]}`, or move it away to start over")
    root = private_course(name, cache or default_cache())
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=dest.parent) as tmp:
        staged = Path(tmp) / "staged"
        shutil.copytree(root / "release" / name, staged,
                        ignore=shutil.ignore_patterns(".*", "__pycache__"))
        for nb_path in staged.glob("*.ipynb"):
            if lang != "en":
                student_pack.translate_assignment(nb_path, lang, relink=_relinker(dest, lang))
            relink_lessons(nb_path, dest, lang)
        if lang != "en":
            student_pack.write_marker(staged, lang)
        leak_check(staged, dest)
        dest.mkdir(exist_ok=True)
        for p in staged.rglob("*"):
            target = dest / p.relative_to(staged)
            if p.is_dir():
                target.mkdir(exist_ok=True)
            elif not target.exists():
                shutil.copy2(p, target)
    return notebook


@dataclass
class Result:
    """A self-graded submission: autograded points, the written answers left, the page."""

    score: float
    max_score: float
    written: int  # written answers: graded by a person, not here
    written_points: float
    feedback: Path

    def summary(self) -> str:
        """Two lines for the terminal."""
        line = f"score: {self.score:g} / {self.max_score:g} (autograded parts)"
        if self.written:
            line += (f"; {self.written} written answer(s), {self.written_points:g} pts, "
                     "are not graded automatically")
        return f"{line}\nfeedback: {self.feedback}"


def check(short: str, work: Path = DEFAULT_WORK, cache: Path | None = None) -> Result:
    """Grade WORK/A1/NAME.ipynb with the course's autograder; write WORK/A1/feedback.html."""
    import nbformat

    name = resolve(short)
    dest = assignment_dir(name, work)
    notebook = dest / f"{name}.ipynb"
    if not notebook.is_file():
        raise FileNotFoundError(f"no {notebook}: start the assignment first with "
                                f"`make assignment A={name.split('_')[0]}`")
    root = private_course(name, cache or default_cache())
    shutil.rmtree(root / "submitted" / STUDENT / name, ignore_errors=True)
    course.submit(name, STUDENT, nbformat.read(notebook, as_version=4), root)
    said = io.StringIO()  # the teacher's class summary; shown only if grading fails
    with contextlib.redirect_stdout(said):
        parts = course.grade([name], root, students=[STUDENT], workers=1)
    page = root / "feedback" / STUDENT / name / f"{name}.html"
    if not parts or not page.is_file():
        raise RuntimeError(f"grading {notebook} gave no result:\n{said.getvalue()[-3000:]}")
    out = dest / "feedback.html"
    shutil.copy(page, out)
    auto = [p for p in parts if not p.manual]
    written = [p for p in parts if p.manual]
    return Result(sum(p.score for p in auto), sum(p.max_score for p in auto), len(written),
                  sum(p.max_score for p in written), out)


def main(argv: list[str] | None = None) -> int:
    """Command line: start or check one assignment."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["start", "check"])
    ap.add_argument("name", nargs="?", default="", help="the assignment, e.g. A1")
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK,
                    help=f"your work folder (default {DEFAULT_WORK})")
    ap.add_argument("--cache", type=Path, default=None,
                    help="the private course's folder (default: self-study/ in the venv)")
    ap.add_argument("--open", action="store_true", help="open the feedback page in a browser")
    ap.add_argument("--lang", choices=student_pack.LANGS, default="en",
                    help="start: zh_CN gives the instructions in Chinese (check grades both alike)")
    args = ap.parse_args(argv)
    try:
        if args.command == "start":
            path = start(args.name, args.work, args.cache, args.lang)
            print(f"started: {path}\nopen it: cd {lab_root(args.work, args.lang)} && "
                  f"{Path(sys.executable).parent / 'jupyter'} lab\n"
                  f"grade it: make check A={path.parent.name}"
                  + ("" if args.work == DEFAULT_WORK else f" WORK={args.work}"))
        else:
            result = check(args.name, args.work, args.cache)
            print(result.summary())
            if args.open:
                webbrowser.open(result.feedback.as_uri())
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
