"""The Canvas grade file: the columns and two header rows Canvas's gradebook import reads."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks" / "assignments"))
import canvas  # noqa: E402

NBGRADER = """assignment,duedate,timestamp,student_id,last_name,first_name,email,raw_score,late_submission_penalty,score,max_score
A1_seven_steps,,2026-01-01 10:00:00,ada,Lovelace,Ada,,12.0,0.0,12.0,14.0
A1_seven_steps,,,alan,Turing,Alan,,0.0,0.0,0.0,14.0
A4_kv_cache,,2026-01-02 10:00:00,ada,Lovelace,Ada,,9.5,0.0,9.5,10.0
A4_kv_cache,,2026-01-02 10:00:00,alan,Turing,Alan,,10.0,1.0,9.0,10.0
"""
ROSTER = """Student,ID,SIS User ID,SIS Login ID,Section,Old quiz (999)
    Points Possible,,,,,5
"Lovelace, Ada",101,S-1,ada,Sec 1,4
"Turing, Alan",102,S-2,alan,Sec 2,5
"Hopper, Grace",103,S-3,grace,Sec 1,3
"Student, Test",104,,,Sec 1,
"""


def _files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "grades.csv").write_text(NBGRADER)
    (tmp_path / "roster.csv").write_text(ROSTER)
    return tmp_path / "grades.csv", tmp_path / "roster.csv"


def _read(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_the_file_has_canvas_columns_points_row_and_one_row_per_roster_student(tmp_path):
    grades, roster = _files(tmp_path)
    out = tmp_path / "canvas.csv"
    assert canvas.main(["--grades", str(grades), "--roster", str(roster), "--id", "A1=12345",
                        "--id", "A4_kv_cache=678", "--out", str(out)]) == 0
    rows = _read(out)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                       "A1_seven_steps (12345)", "A4_kv_cache (678)"]
    assert rows[1] == ["Points Possible", "", "", "", "", "14", "10"]
    assert rows[2:] == [["Lovelace, Ada", "101", "S-1", "ada", "Sec 1", "12", "9.5"],
                        ["Turing, Alan", "102", "S-2", "alan", "Sec 2", "0", "9"],
                        ["Hopper, Grace", "103", "S-3", "grace", "Sec 1", "", ""]]
    assert {len(r) for r in rows} == {7}


def test_without_a_roster_names_come_from_nbgrader_and_new_assignments_have_no_id(tmp_path):
    grades, _ = _files(tmp_path)
    rows = canvas.canvas_rows(*canvas.read_grades(grades))
    assert rows[0][5:] == ["A1_seven_steps", "A4_kv_cache"]
    assert rows[2] == ["Lovelace, Ada", "", "", "ada", "", "12", "9.5"]


def test_a_graded_student_missing_from_the_roster_is_an_error(tmp_path):
    grades, roster = _files(tmp_path)
    roster.write_text(ROSTER.replace("alan", "aturing"))
    with pytest.raises(SystemExit, match="not in the Canvas roster's SIS Login ID column: alan"):
        canvas.main(["--grades", str(grades), "--roster", str(roster), "--out", str(tmp_path / "o")])


def test_bad_inputs_are_clear_errors(tmp_path):
    grades, roster = _files(tmp_path)
    with pytest.raises(SystemExit, match="is not nbgrader's grades export"):
        canvas.main(["--grades", str(roster), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="is not a Canvas gradebook export"):
        canvas.main(["--grades", str(grades), "--roster", str(grades), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="NAME=CANVAS_ID"):
        canvas.main(["--grades", str(grades), "--id", "A1:12", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--match must be one of"):
        canvas.main(["--grades", str(grades), "--match", "Email", "--out", str(tmp_path / "o")])
