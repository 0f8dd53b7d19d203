"""The repository's promises: README lists every notebook, and `make lab` serves the series."""

import json
import pathlib
import urllib.request

from tests.lab import TOKEN, free_port, running

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_readme_and_overview_list_every_notebook():
    readme = (ROOT / "README.md").read_text()
    overview = (ROOT / "notebooks" / "00_overview.ipynb").read_text()
    assert NOTEBOOKS, "no notebooks found"
    for stem in NOTEBOOKS:
        assert f"`{stem}`" in readme, f"README does not list {stem}"
        assert f"`{stem}`" in overview, f"00_overview does not list {stem}"


def test_make_lab_serves_the_notebooks():
    port = free_port()
    cmd = ["make", "-s", "lab", f"PORT={port}", f"LAB_ARGS=--IdentityProvider.token={TOKEN}"]
    with running(cmd, port, cwd=str(ROOT)) as listing:
        served = {item["name"] for item in listing["content"]}
        assert {f"{stem}.ipynb" for stem in NOTEBOOKS} <= served
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={TOKEN}", timeout=10) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
        # Students are not asked to opt in to Jupyter's news feed, and no update check runs.
        settings = "lab/api/settings/@jupyterlab/apputils-extension:notification"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{settings}?token={TOKEN}",
                                    timeout=10) as r:
            schema = json.loads(r.read())["schema"]["properties"]  # overrides set the defaults
        assert schema["fetchNews"]["default"] == "false", schema["fetchNews"]
        assert schema["checkForUpdates"]["default"] is False, schema["checkForUpdates"]


def _dry_run(*args: str) -> str:
    import subprocess
    return subprocess.run(["make", "-n", "-B", ".venv/.lab-installed", *args], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


def test_the_torch_build_is_chosen_before_the_requirements_are_installed():
    pins = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.startswith("torch==")]
    for cpu, flag in (("", "auto"), ("CPU=1", "1"), ("CPU=0", "0")):
        lines = _dry_run(*([cpu] if cpu else []))
        decide = next(i for i, line in enumerate(lines.splitlines()) if "torch_build.py" in line)
        text = lines.splitlines()
        assert f"--cpu {flag}" in text[decide] and pins[0] in text[decide]
        cpu_install = next(i for i, line in enumerate(text) if "--index-url" in line)
        assert cpu_install == decide + 1 and "https://download.pytorch.org/whl/cpu" in text[cpu_install]
        assert cpu_install < next(i for i, line in enumerate(text) if "-r requirements.txt" in line)
        assert not any("-q" in line.split() for line in text if "-r requirements.txt" in line), \
            "make lab's install must show pip's progress"


def test_requirements_point_at_a_readme_heading_that_exists():
    note = (ROOT / "requirements.txt").read_text()
    readme = (ROOT / "README.md").read_text()
    heading = note.split('README, "', 1)[1].split('"', 1)[0]
    assert f"## {heading}" in readme, f"requirements.txt points at a missing heading {heading!r}"


def test_every_lesson_has_a_try_it_with_a_self_check_before_its_answer():
    import nbformat

    for stem in NOTEBOOKS[1:]:  # 00 is the map, every other notebook is a lesson
        cells = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells
        start = next((i for i, c in enumerate(cells)
                      if c.cell_type == "markdown" and "## Try it" in c.source), None)
        assert start is not None, f"{stem} has no '## Try it' exercise"
        answer = next((i for i in range(start, len(cells))
                       if "<summary>Show answer</summary>" in cells[i].source), None)
        assert answer is not None, f"{stem}: the Try it has no folded answer"
        checks_ = [c for c in cells[start:answer] if c.cell_type == "code"
                   and "tryit.check_" in c.source]
        assert checks_, f"{stem}: no self-check cell (tryit.check_*) between Try it and its answer"


def _lesson_markdown() -> list[tuple[str, str]]:
    """(notebook stem, markdown cell text) for every lesson, the map included."""
    import nbformat

    return [(stem, c.source) for stem in NOTEBOOKS
            for c in nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells
            if c.cell_type == "markdown"]


def test_lessons_refer_to_one_another_by_links_that_resolve():
    import re

    link = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
    for stem, text in _lesson_markdown():
        for _, target in link.findall(text):
            path = target.split("#")[0]
            if re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path):
                assert (ROOT / "notebooks" / path).exists(), f"{stem} links {target}: no such lesson"
        prose = re.sub(r"`[^`]*`", "", link.sub("", text))  # links and code spans taken out
        plain = re.search(r"\b(?:[Nn]otebooks?|[Ll]essons?) \d\d\b", prose)
        assert plain is None, (f"{stem} names a lesson by number without a link: "
                               f"{prose[max(0, plain.start() - 40):plain.end() + 20]!r}")


def test_links_to_a_section_of_a_lesson_name_a_heading_it_has():
    """`12_flash_attention.ipynb#The-logsumexp-merge`: JupyterLab's and nbconvert's anchor of a
    heading is its text with spaces as dashes."""
    import re

    import nbformat

    link = re.compile(r"\]\((\d\d_[a-z0-9_]+\.ipynb)#([^)\s]+)\)")
    anchors: dict[str, set[str]] = {}
    for stem, text in _lesson_markdown():
        for path, anchor in link.findall(text):
            if path not in anchors:
                cells = nbformat.read(ROOT / "notebooks" / path, as_version=4).cells
                anchors[path] = {line.lstrip("#").strip().replace(" ", "-")
                                 for c in cells if c.cell_type == "markdown"
                                 for line in c.source.splitlines() if line.startswith("#")}
            assert anchor in anchors[path], f"{stem} links {path}#{anchor}: no such heading"


def test_code_names_lessons_by_their_file_and_the_files_exist():
    import re

    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tools").rglob("*.py"),
             *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "notebooks" / "assignments").glob("*.py")]
    for path in files:
        text = path.read_text()
        plain = re.search(r"\b([Nn]otebooks?|[Ll]essons?) \d\d\b", text)
        assert plain is None, (f"{path.relative_to(ROOT)} names a lesson by number: "
                               f"{text[max(0, plain.start() - 40):plain.end() + 20]!r}; use its file name")
        for name in re.findall(r"\b\d\d_[a-z0-9_]+\.ipynb", text):
            assert (ROOT / "notebooks" / name).exists(), f"{path.relative_to(ROOT)} names {name}: no such lesson"


def test_assignments_link_the_lessons_they_build_on_and_the_links_resolve():
    import re

    import nbformat

    link = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
    for path in sorted((ROOT / "notebooks" / "assignments" / "source").glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for _, target in link.findall(cell.source):
                if target.endswith(".ipynb"):
                    assert (path.parent / target).resolve().exists(), f"{path.name} links {target}: no such file"
            prose = re.sub(r"`[^`]*`", "", link.sub("", cell.source))
            plain = re.search(r"\b(?:[Nn]otebooks?|[Ll]essons?) \d\d\b", prose)
            assert plain is None, (f"{path.name} names a lesson by number without a link: "
                                   f"{prose[max(0, plain.start() - 40):plain.end() + 20]!r}")
