"""The grades in the shape Canvas's gradebook imports (Grades > Import, a CSV file).

    python canvas.py [--grades reports/grades.csv] [--roster canvas_export.csv]
                     [--id A1=12345 ...] [--match "SIS Login ID"] [--out reports/canvas_grades.csv]

Canvas reads a CSV whose first columns identify the student (Student, ID, SIS User ID,
SIS Login ID, Section) and then one column per assignment, titled "Name (Canvas id)" for an
assignment that exists in Canvas (a title without an id makes a new assignment), with a second
row "Points Possible" giving each assignment's maximum, as in the file Canvas's own gradebook
export writes. The grades come from nbgrader's export (reports/grades.csv, `make report`);
the roster, optional, is that Canvas export, so each nbgrader student id is matched to the
Canvas column `--match` (default SIS Login ID). Without a roster the student's name and id
are filled from nbgrader and the other columns left empty. A blank cell changes nothing in
Canvas; a graded student missing from the roster is an error, never a silent drop.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent
STUDENT_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
POINTS_ROW = "Points Possible"
NBGRADER_COLUMNS = {"assignment", "student_id", "last_name", "first_name", "score", "max_score"}

Grades = dict[str, dict[str, float]]  # student id -> assignment -> score


def _num(x: float) -> str:
    """12.0 -> '12', 11.5 -> '11.5'."""
    return f"{x:g}"


def read_grades(path: Path) -> tuple[Grades, dict[str, float], dict[str, dict[str, str]]]:
    """(scores, max score per assignment, names per student) from nbgrader's grades.csv."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    missing = NBGRADER_COLUMNS - set(rows[0] if rows else ())
    if not rows or missing:
        raise ValueError(f"{path} is not nbgrader's grades export (missing columns: "
                         f"{', '.join(sorted(missing or NBGRADER_COLUMNS))})")
    scores: Grades = {}
    maxima: dict[str, float] = {}
    names: dict[str, dict[str, str]] = {}
    for r in rows:
        sid, name = r["student_id"], r["assignment"]
        scores.setdefault(sid, {})[name] = float(r["score"] or 0)
        maxima[name] = float(r["max_score"] or 0)
        names[sid] = {"first": r["first_name"], "last": r["last_name"]}
    return scores, maxima, names


def read_roster(path: Path, match: str) -> list[dict[str, str]]:
    """The students of a Canvas gradebook export (its Points Possible row and test student skipped)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    have = set(rows[0]) if rows else set()
    need = set(STUDENT_COLUMNS) | {match}
    if not rows or not need <= have:
        raise ValueError(f"{path} is not a Canvas gradebook export: it lacks "
                         f"{', '.join(sorted(need - have)) or 'any student row'}")
    return [{c: r[c] or "" for c in STUDENT_COLUMNS} for r in rows
            if r["Student"].strip() not in (POINTS_ROW, "Student, Test")]


def column_title(name: str, ids: Mapping[str, str]) -> str:
    """'A1_seven_steps (12345)' when Canvas's id is known (by full or short name), else the name."""
    cid = ids.get(name) or ids.get(name.split("_")[0])
    return f"{name} ({cid})" if cid else name


def canvas_rows(scores: Grades, maxima: Mapping[str, float], names: Mapping[str, Mapping[str, str]],
                roster: Sequence[Mapping[str, str]] | None = None, ids: Mapping[str, str] | None = None,
                match: str = "SIS Login ID") -> list[list[str]]:
    """The CSV's rows: the header, Points Possible, then one row per student."""
    if match not in STUDENT_COLUMNS:
        raise ValueError(f"--match must be one of {', '.join(STUDENT_COLUMNS)}, got {match!r}")
    order = sorted(maxima)
    header = [*STUDENT_COLUMNS, *(column_title(n, ids or {}) for n in order)]
    points = [POINTS_ROW, "", "", "", "", *(_num(maxima[n]) for n in order)]
    if roster is None:
        roster = [{"Student": f"{names[s]['last']}, {names[s]['first']}".strip(", ") or s,
                   "ID": "", "SIS User ID": "", "SIS Login ID": "", "Section": "", match: s}
                  for s in sorted(scores)]
    known = {r[match] for r in roster}
    unknown = sorted(set(scores) - known)
    if unknown:
        raise ValueError(f"graded students not in the Canvas roster's {match} column: "
                         f"{', '.join(unknown)}")
    body = [[r[c] for c in STUDENT_COLUMNS]
            + [_num(scores[r[match]][n]) if n in scores.get(r[match], {}) else "" for n in order]
            for r in roster]
    return [header, points, *body]


def _ids(pairs: Sequence[str]) -> dict[str, str]:
    """{'A1': '12345'} from ['A1=12345']."""
    out = {}
    for p in pairs:
        name, sep, cid = p.partition("=")
        if not sep or not cid.strip().isdigit():
            raise SystemExit(f"--id wants NAME=CANVAS_ID with a numeric id, got {p!r}")
        out[name.strip()] = cid.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the Canvas import file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grades", type=Path, default=ROOT / "reports" / "grades.csv")
    ap.add_argument("--roster", type=Path, default=None, help="Canvas's gradebook export")
    ap.add_argument("--id", action="append", default=[], help="NAME=CANVAS_ID, once per assignment")
    ap.add_argument("--match", default="SIS Login ID", help="roster column holding nbgrader's ids")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "canvas_grades.csv")
    args = ap.parse_args(argv)
    try:
        scores, maxima, names = read_grades(args.grades)
        roster = read_roster(args.roster, args.match) if args.roster else None
        rows = canvas_rows(scores, maxima, names, roster, _ids(args.id), args.match)
    except (OSError, ValueError) as e:
        raise SystemExit(f"canvas.py: {e}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    print(f"wrote {args.out}: {len(rows) - 2} students, {len(maxima)} assignments")
    return 0


if __name__ == "__main__":
    sys.exit(main())
