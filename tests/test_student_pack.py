"""The student pack (`make student-pack`): everything students need, none of the answers.

One pack is built for the whole module, from a private copy of the course (its own release/
and gradebook, so the teacher's are never touched), exactly as `student_pack.py` builds it.
The leak check greps it for every solution region, model written answer and hidden test of
notebooks/assignments/source/, and a planted answer shows that the check can fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402  (the course's own tooling)
import student_pack as sp  # noqa: E402

# Solution regions that the repository's own package or lessons hold verbatim: public anyway
# (src/mha is the reference the assignments are compared with, and lesson 15 shows the
# backward it derives), so they are in the pack through src/ and the lessons, not through the
# release. A new one fails this module; one that is no longer verbatim asks to be removed here.
PUBLIC_ANYWAY = {
    ("A1_seven_steps.ipynb", "a1-params"),  # src/mha/checks.py: parameter_count's return
    ("A4_kv_cache.ipynb", "a4-cache"),  # src/mha/inference/kv_cache.py: `return self.length`
    ("A5_backward_pass.ipynb", "a5-wsum"),  # src/mha/training/grad.py, lesson 15: weighted_sum_backward
}
TOP_LEVEL = {"README.md", "Makefile", *(f.split("/")[0] for f in sp.INSTALL_FILES), "src",
             "notebooks"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[sp.Pack, Path]:
    """The pack (tmp/pack, zip beside it) and the private course it was released from."""
    tmp = tmp_path_factory.mktemp("student-pack")
    copy = course.private_copy(tmp)
    return sp.build(tmp / "pack", course=copy), copy


def test_the_pack_holds_lessons_assignments_package_and_install_files(built):
    pack, copy = built
    folder = pack.folder
    lessons = [p.name for p in sp.lessons(ROOT)]
    assert len(lessons) >= 17
    missing = [n for n in lessons if not (folder / "notebooks" / n).is_file()]
    assert not missing, f"lessons missing from the pack: {missing}"

    names = course.assignments(COURSE)
    assert len(names) >= 5
    for name in names:
        got = folder / "notebooks" / "assignments" / name / f"{name}.ipynb"
        assert got.is_file(), f"released {name} missing from the pack"
        # From release/, never source/: nbgrader's release, with only its lesson links re-pointed
        # at the pack's layout (and those links reach the pack's lessons).
        release = nbformat.read(copy / "release" / name / f"{name}.ipynb", as_version=4)
        for cell in release.cells:
            if cell.cell_type == "markdown":
                cell.source = sp.relink_lessons(cell.source)
        assert nbformat.read(got, as_version=4) == release, name
        assert got.read_bytes() != (COURSE / "source" / name / f"{name}.ipynb").read_bytes()
        for target in re.findall(r"\]\(([^)\s]+\.ipynb)\)", got.read_text()):
            assert (got.parent / target).resolve().is_file(), f"{name} links {target}: not in the pack"
        text = "\n".join(c.source for c in nbformat.read(got, as_version=4).cells)
        assert "# YOUR CODE HERE" in text and "YOUR ANSWER HERE" in text, name

    tracked = subprocess.run(["git", "ls-files", "src"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    tracked = [f for f in tracked if (ROOT / f).is_file()]
    assert "src/mha/__init__.py" in tracked
    missing = [f for f in tracked if not (folder / f).is_file()]
    assert not missing, f"package files missing from the pack: {missing}"
    package = set(sp.package_files(ROOT))
    assert not [f for f in pack.files if f.startswith("src/") and f not in package]

    for f in sp.INSTALL_FILES:
        assert (folder / f).read_bytes() == (ROOT / f).read_bytes(), f
    assert "-e ." in (folder / "requirements.txt").read_text().splitlines()
    readme = (folder / "README.md").read_text()
    for needed in ("make lab", "make lab CPU=1", "Hand in", "00_overview.ipynb",
                   *(f"notebooks/assignments/{n}/{n}.ipynb" for n in names)):
        assert needed in readme, f"the student README does not mention {needed!r}"
    # requirements.txt sends readers to a README heading: the pack's README must have it too.
    note = (folder / "requirements.txt").read_text()
    heading = note.split('README, "', 1)[1].split('"', 1)[0]
    assert f"## {heading}" in readme, f"the student README lacks the heading {heading!r}"

    with zipfile.ZipFile(pack.archive) as z:
        assert sorted(z.namelist()) == [f"{sp.ARCHIVE_NAME}/{f}" for f in pack.files], \
            "the zip does not hold exactly the pack's folder"


def test_the_pack_holds_no_teacher_file(built):
    pack, _ = built
    files = pack.files
    assert sp.forbidden(pack.folder) == []
    assert {f.split("/")[0] for f in files} == TOP_LEVEL, "something outside the allowlist"
    under_notebooks = {f.split("/")[1] for f in files if f.startswith("notebooks/")}
    assert under_notebooks == {*(p.name for p in sp.lessons(ROOT)), "assignments"}
    assert not [f for f in files if "source" in f.split("/")[:-1]], "a source/ path"
    assert not [f for f in files if f.split("/")[-1] in
                ("course.py", "nbgrader_config.py", "gradebook.db")], "a teacher file"
    assert not [f for f in files if f.startswith("tests/") or "/tests/" in f], "tests/"
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")], "a cache"


def test_no_solution_written_answer_or_hidden_test_is_in_the_pack(built):
    pack, _ = built
    report = sp.check_leaks(pack.folder, COURSE / "source", ROOT)
    regions, _ = sp.secret_regions(COURSE / "source")
    kinds = {k: sum(r.kind == k for r in regions) for k in ("solution", "written answer",
                                                             "hidden tests")}
    counts = (f"checked {report.regions} regions {kinds} and {report.lines} distinctive lines "
              f"({report.lines_public} long lines skipped as public) in {report.files} text "
              f"files of {len(pack.files)}")
    assert all(kinds.values()) and report.lines > 100, counts
    assert not report.leaks, f"{counts}\n{report.summary()}"
    assert not report.line_hits, f"{counts}\n{report.summary()}"
    assert not report.marker_hits, f"{counts}\n{report.summary()}"
    public = {(r.notebook, r.cell) for r, _, is_public in report.hits if is_public}
    assert public <= PUBLIC_ANYWAY, (
        f"{counts}: regions newly found verbatim in src/ or the lessons (students can read them "
        f"there): {sorted(public - PUBLIC_ANYWAY)}")
    assert public >= PUBLIC_ANYWAY, (
        f"{counts}: no longer verbatim in src/ or the lessons, remove from PUBLIC_ANYWAY: "
        f"{sorted(PUBLIC_ANYWAY - public)}")
    # The build ran the same check (against its own copy of source/) before zipping.
    assert pack.leaks is not None and pack.leaks.ok and pack.leaks.regions == report.regions


def test_the_leak_check_finds_a_planted_answer(built, tmp_path):
    pack, _ = built
    leaky = tmp_path / "leaky"
    shutil.copytree(pack.folder, leaky)
    regions, open_text = sp.secret_regions(COURSE / "source")
    public = sp.public_text(ROOT)
    secret = [r for r in regions if (r.notebook, r.cell) not in PUBLIC_ANYWAY]
    solution = next(r for r in secret if r.kind == "solution" and "\n" in r.text.strip())
    answer = next(r for r in secret if r.kind == "written answer")
    hidden = next(r for r in secret if r.kind == "hidden tests"
                  and sp.distinctive_lines(r, public, open_text)[0])
    line = sp.distinctive_lines(hidden, public, open_text)[0][0]

    # A solution pasted into a released notebook, as a cell of its own.
    name = solution.notebook.removesuffix(".ipynb")
    nb_path = leaky / "notebooks" / "assignments" / name / solution.notebook
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(solution.text))
    nbformat.write(nb, nb_path)
    # A model answer re-wrapped (other whitespace) into the README.
    with open(leaky / "README.md", "a") as f:
        f.write("\n\n" + "\n  ".join(answer.text.split()) + "\n")
    # One line of a hidden test, alone, in a new file next to the assignments.
    (leaky / "notebooks" / "assignments" / "notes.py").write_text(f"# {line}\n")

    report = sp.check_leaks(leaky, COURSE / "source", ROOT)
    rel_nb = nb_path.relative_to(leaky).as_posix()
    assert not report.ok
    assert (solution, rel_nb) in report.leaks, report.summary()
    assert (answer, "README.md") in report.leaks, report.summary()
    assert (hidden, line, "notebooks/assignments/notes.py") in report.line_hits, report.summary()
    assert len(report.leaks) == 2 and len(report.line_hits) >= 1, report.summary()


def _make_n(folder: Path, *args: str) -> list[str]:
    """What `make -n` would run, as a fresh make would (not a sub-make of `make test`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "-n", *args], cwd=folder, capture_output=True, text=True,
                         check=True, env=env).stdout.splitlines()
    return [line for line in out if not re.match(r"make(\[\d+\])?: (Entering|Leaving) directory", line)]


def test_the_pack_installs_from_its_own_folder(built, tmp_path):
    pack, _ = built
    # The install steps of the pack's Makefile are the course's own, with and without CPU=1.
    venv = tmp_path / "v"
    for cpu in ("CPU=0", "CPU=1"):
        args = ("-B", f"VENV={venv}", cpu, f"{venv}/.lab-installed")
        assert _make_n(pack.folder, *args) == _make_n(ROOT, *args), cpu
    lab = _make_n(pack.folder, "lab", f"VENV={venv}")
    assert any("-r requirements.txt" in line for line in lab)
    assert any("jupyter lab" in line for line in lab)
    assert any("--ServerApp.root_dir=notebooks" in line for line in lab)
    assert any("jupyter trust notebooks/00_overview.ipynb" in line for line in lab)

    # pip, from the pack's folder, reads requirements.txt and installs mha editable from there.
    copy = tmp_path / "copy"
    shutil.copytree(pack.folder, copy)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    report = tmp_path / "report.json"
    subprocess.run([*pip, "install", "--dry-run", "--no-deps", "--no-index", "--no-build-isolation",
                    "-q", "-r", "requirements.txt", "--report", str(report)], cwd=copy,
                   check=True, capture_output=True)
    mha = [i for i in json.loads(report.read_text())["install"] if i["metadata"]["name"] == "mha"]
    assert mha and mha[0]["download_info"]["url"] == copy.resolve().as_uri(), mha
    assert mha[0]["download_info"]["dir_info"].get("editable"), mha
    # and its pyproject packages every file of src/mha (templates and vendor files included).
    subprocess.run([*pip, "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-q", ".",
                    "-w", str(tmp_path / "wheel")], cwd=copy, check=True, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("mha-*.whl")
    with zipfile.ZipFile(wheel) as z:
        packaged = {n for n in z.namelist() if n.startswith(("mha/", "mha_course/"))}
    assert packaged == {f.removeprefix("src/") for f in pack.files
                        if f.startswith(("src/mha/", "src/mha_course/"))}

