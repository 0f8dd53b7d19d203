"""How long `make grade` takes for a class: N students x every assignment, at 1 and more workers.

    python benchmarks/grading.py --students 40                 # 40 x 5, at 1 and 2 workers
    python benchmarks/grading.py --students 5 --workers 2 A1   # a quick look

Works on a private copy of the course (source/ and tooling only), so the real gradebook
and submitted/ are never touched. Half the class hands in the model solution, half the
untouched release (the two ends of the runtime: every hidden test runs to the end vs.
every test fails at once). Each run is the whole of `course.grade`: autograding in
private worker copies, merging into the gradebook, feedback pages and reports. Writes
benchmarks/results/grading.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from mha.perf.bench import machine_line

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402


def time_class(names: list[str], students: int, workers: int) -> float:
    """Seconds for course.grade over `students` submissions of each of `names`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = course.private_copy(Path(tmp), names)
        course.release(names, root)
        for name in names:
            model = course.model_submission(name, root)
            blank = nbformat.read(root / "release" / name / f"{name}.ipynb", as_version=4)
            for i in range(students):
                course.submit(name, f"student{i:02d}", model if i % 2 == 0 else blank, root)
        start = time.perf_counter()
        course.grade(names, root, workers=workers)
        return time.perf_counter() - start


def main() -> int:
    """Time the class at each worker count and write a markdown table under benchmarks/results/."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=40)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    names = course.resolve(args.names, COURSE) if args.names else course.assignments(COURSE)
    n = args.students * len(names)
    rows = []
    for w in sorted(set(args.workers)):
        seconds = time_class(names, args.students, w)
        rows.append((w, seconds))
        print(f"{n} submissions ({args.students} x {len(names)}) on {w} worker(s): "
              f"{seconds:.0f} s ({seconds / n:.2f} s each)")
    base = rows[0][1]
    lines = [f"# Grading time: {args.students} students x {len(names)} assignments", "",
             f"Machine: {machine_line()}. One run of `benchmarks/grading.py` per row (half model "
             f"solutions, half untouched releases), each the whole of `course.grade`: autograde "
             f"in private worker copies, merge into the gradebook, feedback pages, reports.", "",
             "| workers | submissions | total | per submission | speed-up |", "|---|---|---|---|---|"]
    lines += [f"| {w} | {n} | {s:.0f} s ({s / 60:.1f} min) | {s / n:.2f} s | {base / s:.2f}x |"
              for w, s in rows]
    out = ROOT / "benchmarks" / "results" / "grading.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
