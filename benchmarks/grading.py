"""How long `make grade` takes for a class: N submissions of each assignment, one run.

    python benchmarks/grading.py --students 30            # all assignments
    python benchmarks/grading.py --students 5 A1_seven_steps

Works on a private copy of the course (source/ and tooling only), so the real gradebook
and submitted/ are never touched. Half the class hands in the model solution, half the
untouched release (the two ends of the runtime: every hidden test runs to the end vs.
every test fails at once). Writes benchmarks/results/grading.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from mha.bench import machine_line

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402


def time_grading(name: str, students: int, root: Path) -> tuple[float, float]:
    """Seconds to autograde `students` submissions of `name`, then to write their feedback."""
    course.release([name], root)
    model = course.model_submission(name, root)
    blank = nbformat.read(root / "release" / name / f"{name}.ipynb", as_version=4)
    for i in range(students):
        course.submit(name, f"student{i:02d}", model if i % 2 == 0 else blank, root)
    start = time.perf_counter()
    course.nbgrader("autograde", name, "--force", root=root)
    graded = time.perf_counter()
    course.nbgrader("generate_feedback", name, "--force", root=root)
    return graded - start, time.perf_counter() - graded


def main() -> int:
    """Time each assignment and write a markdown table under benchmarks/results/."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=30)
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    names = args.names or course.assignments(COURSE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = course.private_copy(Path(tmp))
        for name in names:
            auto, feedback = time_grading(name, args.students, root)
            rows.append((name, auto, feedback))
            print(f"{name}: {args.students} submissions autograded in {auto:.0f} s "
                  f"({auto / args.students:.1f} s each), feedback in {feedback:.0f} s")
    lines = [f"# Autograding time, {args.students} submissions per assignment", "",
             f"Machine: {machine_line()}. One run of `benchmarks/grading.py` (half model "
             f"solutions, half untouched releases); nbgrader runs submissions one at a time.", "",
             "| assignment | autograde | per submission | feedback HTML |", "|---|---|---|---|"]
    lines += [f"| {n} | {a:.0f} s | {a / args.students:.1f} s | {f:.0f} s |" for n, a, f in rows]
    lines.append(f"| all | {sum(a for _, a, _ in rows):.0f} s | | "
                 f"{sum(f for *_, f in rows):.0f} s |")
    out = ROOT / "benchmarks" / "results" / "grading.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
