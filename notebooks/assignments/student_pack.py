"""Build the student pack: what students need to follow the course, and nothing a teacher keeps.

    python notebooks/assignments/student_pack.py [--out DIR] [--lang zh_CN] [--no-release] [--no-archive]

`make student-pack` calls it. It first releases the assignments (`course.py release`:
source/ -> release/, solutions and hidden tests removed), then copies an allowlist into
DIR (default: dist/student-pack/ at the repository root) and zips it beside DIR
(dist/attention-by-hand-student.zip, one top folder attention-by-hand-student/):

    README.md                 how to install (`make lab`, `make lab CPU=1`) and hand in
    Makefile                  a student Makefile: lab, demo, clean (same install steps as ours)
    requirements.txt, pyproject.toml, environment.yml
    src/mha/..., src/mha_course/...   the library and the course's package, the files git
                              tracks or would track (no caches)
    tools/install.py, tools/torch_build.py   what the student Makefile installs with
    notebooks/NN_*.ipynb      the lessons
    notebooks/assignments/NAME/NAME.ipynb   the released assignments (from release/, never source/)

Nothing else goes in: not source/, course.py, nbgrader_config.py, the gradebook, submissions,
feedback, reports, tests, benchmarks or hub configs. Before zipping it greps the pack for
every solution region, model written answer and hidden test of source/ (`check_leaks`) and
stops, without an archive, if it finds one.

`--lang zh_CN` (`make student-pack LANG=zh_CN`) builds the Chinese edition beside it
(dist/student-pack-zh_CN/, dist/attention-by-hand-student-zh_CN.zip): the lessons as
tools.book.i18n translates them (same code cells and outputs, markdown from the catalogs in
notebooks/locale/zh_CN/), the released assignments with their instructions translated
(`translate_assignment`: code, answer stubs and nbgrader's grading cells as released), the
README from its catalog student_readme.po (`--update-readme-catalog` after changing its
English, then `python -m tools.book.i18n todo / fill student_readme`), and `.mha-language` in
notebooks/ and each assignment's folder. A block without a valid translation stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

COURSE = Path(__file__).resolve().parent  # notebooks/assignments
ROOT = COURSE.parent.parent  # the repository
DEFAULT_OUT = ROOT / "dist" / "student-pack"
ARCHIVE_NAME = "attention-by-hand-student"
INSTALL_FILES = ("requirements.txt", "pyproject.toml", "environment.yml", "tools/install.py",
                 "tools/torch_build.py")
LESSONS_GLOB = "notebooks/[0-9][0-9]_*.ipynb"
README_TITLE = "# Attention by Hand: student pack"
LANGS = ("en", "zh_CN")  # the editions: English, and the Chinese from the catalogs
LANGUAGE_MARKER = ".mha-language"  # mha_course.i18n.MARKER: the Try-it checks answer in its language

# nbgrader's markers (nbgrader_config.py keeps the defaults).
MARKERS = {
    "solution": ("### BEGIN SOLUTION", "### END SOLUTION"),
    "hidden tests": ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"),
}
# Never in a pack, whatever the allowlist says (checked after building, as a second lock).
FORBIDDEN_NAMES = {"course.py", "nbgrader_config.py", "gradebook.db", "gradebook.db-journal",
                   ".nbgrader.log"}
FORBIDDEN_DIRS = {"source", "release", "submitted", "autograded", "feedback", "reports", "tests",
                  "benchmarks", "hub", ".git", ".venv", "__pycache__", ".ipynb_checkpoints",
                  "node_modules"}
MIN_LINE = 40  # a region's lines longer than this (stripped) are checked one by one


# --- what goes in ---------------------------------------------------------------------------
def assignment_names(course: Path = COURSE) -> list[str]:
    """Every assignment in course/source/ (NAME/NAME.ipynb), in order."""
    return sorted(p.name for p in (course / "source").iterdir()
                  if (p / f"{p.name}.ipynb").is_file())


def lessons(repo: Path = ROOT) -> list[Path]:
    """The lesson notebooks, notebooks/NN_*.ipynb, in order."""
    return sorted(repo.glob(LESSONS_GLOB))


def package_files(repo: Path = ROOT) -> list[str]:
    """src/ as git sees it: tracked files plus new ones not ignored (so no caches, no builds)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", "src"], cwd=repo, capture_output=True, text=True, check=True).stdout
    files = sorted({f for f in out.split("\0") if f and (repo / f).is_file()})
    for pkg in ("src/mha/", "src/mha_course/"):
        if not any(f.startswith(pkg) for f in files):
            raise RuntimeError(f"git lists no files under {repo / pkg}")
    return files


def release(course: Path = COURSE) -> None:
    """source/ -> release/ with the course's own tooling (nbgrader generate_assignment)."""
    subprocess.run([sys.executable, str(course / "course.py"), "release"], cwd=course, check=True)


def released(course: Path = COURSE) -> dict[str, list[Path]]:
    """The files nbgrader released for each assignment (release/NAME/...), by name."""
    found = {}
    for name in assignment_names(course):
        folder = course / "release" / name
        if not (folder / f"{name}.ipynb").is_file():
            raise FileNotFoundError(f"{folder / name}.ipynb is missing: run course.py release")
        found[name] = sorted(p for p in folder.rglob("*") if p.is_file()
                             and not any(part.startswith(".") or part == "__pycache__"
                                         for part in p.relative_to(folder).parts))
    return found


def _title(nb_path: Path) -> str:
    """The first markdown heading of a notebook, without its '#'."""
    import nbformat

    for cell in nbformat.read(nb_path, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return nb_path.stem


STUDENT_MAKEFILE = """\
# Attention by Hand, student pack. `make lab` installs everything into .venv and opens JupyterLab.
# (Generated by the course's student_pack.py: the install steps are the course's own.)
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check
# Installs go through tools/install.py: uv where it can (same indexes as pip, about a
# minute instead of three on 2 cores), else pip; INSTALLER=pip never tries uv.
INSTALLER ?= auto
INSTALL := $(BIN)/python tools/install.py --with $(INSTALLER)
PORT   ?= 8888
# Extra flags for jupyter lab, e.g. LAB_ARGS=--IdentityProvider.token=secret
LAB_ARGS ?=
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))

.PHONY: lab demo clean help

help:
\t@echo "make lab        create $(VENV), install, open JupyterLab on notebooks/ (CPU=1 / CPU=0: force torch's CPU-only / default build)"
\t@echo "make demo       python -m mha: a one-screen terminal demo"
\t@echo "make clean      remove $(VENV) (your notebooks stay)"

$(BIN)/python:
\t$(PYTHON) -m venv $(VENV)

# Which torch build: CPU=auto (default) installs torch's CPU-only wheel first (a few hundred MB,
# so the pinned torch in requirements.txt is already satisfied and PyPI's CUDA build of several
# GB is never fetched) on Linux without an NVIDIA driver, unless the package index already gives
# a CPU build; tools/torch_build.py decides and says why. CPU=1 forces the CPU wheel, CPU=0
# PyPI's default build.
CPU ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt)

# Stamp: reinstall only when the requirement files or pyproject change.
$(VENV)/.lab-installed: requirements.txt pyproject.toml | $(BIN)/python
\t@echo "Installing into $(VENV): a minute or a few the first time, with progress as it goes."
\t@if [ "$$($(BIN)/python tools/torch_build.py --cpu $(CPU) --pin "$(TORCH_PIN)")" = cpu ]; then \\
\t  $(INSTALL) --index-url $(TORCH_CPU_INDEX) "$(TORCH_PIN)"; fi
\t$(INSTALL) -r requirements.txt
\t@# jsonschema's "format-nongpl" extra (via jupyter-events) pulls in rfc3987-syntax, which
\t@# builds a Lark grammar on import: 1-2 s in EVERY Jupyter process (nbconvert, nbgrader, each
\t@# grading worker). It only checks "iri" strings in event schemas, which nothing here emits;
\t@# jsonschema skips the format without it. Nothing declares it as a requirement.
\t@$(PIP) uninstall -y -q rfc3987-syntax 2>/dev/null || true
\t@touch $@

# Students are not asked whether JupyterLab may fetch Jupyter's news, and it never checks for
# updates: lab-wide overrides in the venv (a user's own settings still win).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): | $(VENV)/.lab-installed
\t@mkdir -p $(dir $@)
\t@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

# Trusting the lessons lets JupyterLab render their widgets and HTML outputs.
lab: $(VENV)/.lab-installed $(LAB_OVERRIDES)
\t@$(BIN)/jupyter trust $(NOTEBOOKS) >/dev/null
\t$(BIN)/jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) \\
\t  --ServerApp.root_dir=notebooks $(LAB_ARGS) $(if $(filter 0,$(shell id -u)),--allow-root,)

demo: $(VENV)/.lab-installed
\t$(BIN)/python -m mha

clean:
\trm -rf $(VENV)
"""


# --- the README, in each language -----------------------------------------------------------
# The README's English is the source; its Chinese comes from a gettext catalog of its blocks,
# notebooks/locale/zh_CN/LC_MESSAGES/student_readme.po, made and checked with the lessons' own
# tooling (tools.book.i18n: blocks, `problems`, todo / fill). A changed English block has no
# valid translation until it is translated again, and a Chinese pack is then refused
# (`readme_catalog_problems`), never built half English.
README_DOMAIN = "student_readme"
README_HEAD = f"""{README_TITLE}

Learn multi-head attention by building it: seven small numpy steps, each its own notebook,
then the same module in PyTorch, then the road to production kernels; and graded
assignments to hand in.
"""
# Only in a translated pack, after the introduction.
EDITION_NOTE = """\
This is the Chinese edition of the pack. The lessons, the assignments' instructions and this
README are in Chinese; code, outputs and figures are those of the English edition. The
`.mha-language` files in `notebooks/` and in each assignment's folder make the Try-it
self-checks answer in Chinese (delete one for English there). Error messages of numpy, PyTorch
and Python stay in English. Hand in your notebook as it is: it is graded exactly like the
English one.
"""
README_BODY = """
## Install and open

You need Python 3.11 and `make` (Linux or macOS; on Windows use WSL). In this folder:

```bash
make lab          # creates .venv, installs everything, opens JupyterLab on notebooks/
make lab CPU=1    # force the CPU-only torch wheel (picked by itself without an NVIDIA GPU): see below
```

`make lab` prints a URL with a login token: open it in your browser. The first run
downloads and installs the packages, which takes a few minutes; later runs start at once.
Another port: `make lab PORT=8899`. Another Python: `make lab PYTHON=/path/to/python3.11`.
With conda instead: `conda env create -f environment.yml`, `conda activate attention-by-hand`,
then `jupyter lab --ServerApp.root_dir=notebooks`.

## GPUs and choosing a torch build

On Linux, PyPI's `torch` (pinned in `requirements.txt`) is a CUDA build of several GB. Without
an NVIDIA driver, `make lab` installs the CPU-only wheel (a few hundred MB) from PyTorch's CPU
index first, so the big one is never downloaded, and prints which build it chose. `make lab CPU=1`
forces the CPU wheel, `CPU=0` PyPI's build. The whole course runs on a CPU. (macOS wheels are
CPU/MPS builds anyway.)

## What is here

| file | what it is |
|---|---|
| `src/mha/` | the library the lessons and assignments import (`make lab` installs it) |
| `src/mha_course/` | the course's Try-it self-checks and pictures (installed with it) |
| `tools/` | the installers `make lab` runs |

Start with `notebooks/00_overview.ipynb`. The assignments follow the lessons; each one says
which lessons it builds on.

## Hand in an assignment

1. Open `notebooks/assignments/NAME/NAME.ipynb` and work in it. Write your code where it
   says `# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and your written
   answers where it says `YOUR ANSWER HERE`.
2. Run the test cell under each part: it says what is right, or which step differs and the
   likely mistake. Do not edit or delete the test cells: they are restored before grading,
   and the grader runs more tests than you see.
3. Before you hand in: *Kernel → Restart Kernel and Run All Cells*, check that every cell
   runs, and save.
4. Hand in that one file, keeping its name (`NAME.ipynb`), the way your teacher tells you
   (on a course JupyterHub: the *Assignments* tab, *Submit*).
"""
TABLE_RULE = re.compile(r"^\|(?:[ \t]*:?-+:?[ \t]*\|)+[ \t]*$", re.M)  # a table's |---|---| line


def readme_source(lang: str = "en") -> str:
    """The README's English text for `lang` (the edition note only where it is translated),
    without the rows of lessons and assignments, which come from the notebooks themselves."""
    return README_HEAD + ("\n" + EDITION_NOTE if lang != "en" else "") + README_BODY


def i18n_tools():
    """tools.book.i18n, the lessons' translation tooling (catalogs, blocks, `problems`)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tools.book import i18n

    return i18n


def missing_translations(text: str, cat) -> list[str]:
    """The blocks of `text` (markdown) that `cat` gives no complete, valid translation for:
    untranslated, fuzzy (the English changed) or failing tools.book.i18n's `problems`."""
    return i18n_tools().missing(text, cat)


class Untranslated(RuntimeError):
    """A translated pack or notebook was asked for, and some English has no valid translation."""


def _refuse(domain: str, lang: str, missing: list[str]) -> None:
    if missing:
        todo = ("python notebooks/assignments/student_pack.py --update-readme-catalog, then "
                if domain == README_DOMAIN else "")
        raise Untranslated(
            f"{domain}: {len(missing)} block(s) without a valid {lang} translation, first "
            f"{missing[0][:120]!r} ({todo}python -m tools.book.i18n todo {domain} shows them)")


def readme_catalog_problems(lang: str) -> list[str]:
    """The README's blocks that `lang`'s catalog lacks or gets wrong (empty: complete)."""
    return missing_translations(readme_source(lang), i18n_tools().read(README_DOMAIN, lang))


def update_readme_catalog(lang: str) -> int:
    """student_readme.po follows the English: new blocks added, changed ones fuzzy (their old
    translation kept for the translator), gone ones dropped; as tools.book.i18n's `update`."""
    i18n = i18n_tools()
    tmpl = i18n.empty_catalog(README_DOMAIN, lang)
    where = (Path(__file__).resolve().relative_to(ROOT).as_posix(), 0)
    for block in i18n.split_blocks(readme_source(lang)):
        if i18n.translatable(block) and block not in tmpl:
            tmpl.add(block, "", locations=[where])
    cat = i18n.merged(i18n.read(README_DOMAIN, lang), tmpl, README_DOMAIN, lang)
    i18n.write(cat, README_DOMAIN, lang)
    return sum(1 for m in cat if m.id)


def readme_titles() -> tuple[str, ...]:
    """The first line of a pack's README in every language with a catalog."""
    titles = [README_TITLE]
    try:
        i18n = i18n_tools()
        for lang in LANGS[1:]:
            cat = i18n.read(README_DOMAIN, lang)
            msg = cat.get(README_TITLE) if cat is not None else None
            if msg is not None and msg.string:
                titles.append(msg.string)
    except ImportError:  # no babel: English only
        pass
    return tuple(titles)


def student_readme(lesson_paths: list[Path], assignment_paths: dict[str, Path],
                   lang: str = "en") -> str:
    """The pack's README.md: install, what is where, how to hand in; in `lang`.

    The lessons' and assignments' titles are read from the notebooks at the paths given (in
    a translated pack, the translated notebooks), so they read as their own headings do.
    """
    text = readme_source(lang)
    if lang != "en":
        i18n = i18n_tools()
        cat = i18n.read(README_DOMAIN, lang)
        _refuse(README_DOMAIN, lang, missing_translations(text, cat))
        text = i18n.translate_text(text, cat)
    rows = [f"| `notebooks/{p.name}` | {_title(p)} |" for p in lesson_paths]
    rows += [f"| `notebooks/assignments/{name}/{name}.ipynb` | {_title(p)} |"
             for name, p in assignment_paths.items()]
    rule = TABLE_RULE.search(text)
    if rule is None:
        raise ValueError("the README's table of files has no |---|---| line")
    return text[:rule.end()] + "".join(f"\n{row}" for row in rows) + text[rule.end():]


# --- building --------------------------------------------------------------------------------
@dataclass
class Pack:
    """A built pack: its folder, its files (relative paths) and the archive, if any."""

    folder: Path
    files: list[str]
    archive: Path | None = None
    leaks: LeakReport | None = None

    @property
    def size(self) -> int:
        return sum((self.folder / f).stat().st_size for f in self.files)


def _clear(out: Path, repo: Path) -> None:
    """Remove a previous pack at `out`; refuse to delete anything that is not one."""
    out = out.resolve()
    if out == repo.resolve() or repo.resolve().is_relative_to(out):
        raise ValueError(f"refusing to build the pack over the repository ({out})")
    if not out.exists():
        return
    readme = out / "README.md"
    if any(out.iterdir()) and not (readme.is_file() and readme.read_text(
            encoding="utf-8", errors="replace").startswith(readme_titles())):
        raise ValueError(f"{out} exists and is not a student pack: choose another --out")
    shutil.rmtree(out)


def relink_lessons(markdown: str) -> str:
    """Lesson links of an assignment's markdown, re-pointed for the pack's layout.

    In the course an assignment sits in release/NAME/ (or source/NAME/), three folders below the
    lessons; in the pack it sits in notebooks/assignments/NAME/, two below.
    """
    import re

    return re.sub(r"\]\(\.\./\.\./\.\./(\d\d_[a-z0-9_]+\.ipynb)", r"](../../\1", markdown)


def _relink_notebook(path: Path) -> None:
    """Rewrite the lesson links of one copied assignment (markdown cells: nbgrader checksums none)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = relink_lessons(cell.source)
    nbformat.write(nb, path)


# --- a translated pack ---------------------------------------------------------------------
def archive_name(lang: str = "en") -> str:
    """The zip's name and top folder: attention-by-hand-student(-zh_CN)."""
    return ARCHIVE_NAME if lang == "en" else f"{ARCHIVE_NAME}-{lang}"


def default_out(lang: str = "en") -> Path:
    """dist/student-pack/ for English, dist/student-pack-zh_CN/ for Chinese: both can coexist."""
    return DEFAULT_OUT if lang == "en" else DEFAULT_OUT.with_name(f"{DEFAULT_OUT.name}-{lang}")


def translated(path: Path, lang: str):
    """The notebook at `path` with its markdown in `lang` (tools.book.i18n.translated_notebook:
    code cells, outputs, metadata and answer cells untouched), refused while any block of it has
    no valid translation in its catalog (the notebook's stem)."""
    import nbformat

    i18n = i18n_tools()
    cat = i18n.read(path.stem, lang)
    nb = nbformat.read(path, as_version=4)
    _refuse(path.stem, lang, [b for cell in nb.cells if cell.cell_type == "markdown"
                              and not i18n.is_answer_cell(cell) for b in missing_translations(cell.source, cat)])
    return i18n.translated_notebook(path, lang)


def _md5(text: str) -> str:
    import hashlib

    return hashlib.md5(text.encode("utf-8")).hexdigest()


def translate_assignment(path: Path, lang: str, relink=None) -> list[str]:
    """Rewrite the released notebook at `path` with its instructions in `lang`, in place.

    Only markdown that is not an answer cell changes (then `relink`, if given, re-points its
    links); code cells, answer stubs, grade ids, points and the checksums of every other cell
    stay as nbgrader released them. A locked instruction cell whose text changed gets the
    checksum nbgrader computes for its new text (so nbgrader's Validate does not report it as
    changed) and a note `mha_translation` with the md5 of the released English and of the
    translation: `course.edited_locked_cells` reads it, so an untouched translated cell is
    not reported as edited. Grading restores every locked cell from the gradebook's English
    either way. Returns the grade ids of those cells.
    """
    import nbformat

    english = nbformat.read(path, as_version=4)
    nb = translated(path, lang)
    locked = []
    for before, cell in zip(english.cells, nb.cells, strict=True):
        if relink is not None and cell.cell_type == "markdown" and not i18n_tools().is_answer_cell(cell):
            cell.source = relink(cell.source)
        if cell.source == before.source:
            continue
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") or meta.get("task") or meta.get("solution"):
            raise ValueError(f"{path.name}: cell {meta.get('grade_id')} is graded; its text "
                             "must not be translated")
        if "checksum" in meta:
            from nbgrader.utils import compute_checksum

            cell.metadata["mha_translation"] = {"lang": lang, "original_md5": _md5(before.source),
                                                "md5": _md5(cell.source)}
            meta["checksum"] = compute_checksum(cell)
            locked.append(meta["grade_id"])
    nbformat.write(nb, path)
    return locked


def write_marker(folder: Path, lang: str) -> Path:
    """`.mha-language` in `folder`: a kernel started there answers the Try-it checks in `lang`."""
    marker = folder / LANGUAGE_MARKER
    marker.write_text(lang + "\n", encoding="utf-8")
    return marker


def build(out: Path | None = None, repo: Path = ROOT, course: Path = COURSE, *,
          do_release: bool = True, archive: bool = True, check: bool = True,
          lang: str = "en") -> Pack:
    """Release the assignments, copy the allowlist into `out`, check it, zip it beside `out`.

    With `lang` (zh_CN), the lessons are the translated notebooks and the released assignments
    carry translated instructions (markdown from the catalogs; code, outputs and nbgrader's
    cells as released), the README is translated, and `.mha-language` in notebooks/ and in each
    assignment's folder makes the Try-it checks answer in that language. Any English block
    without a valid translation stops the build before anything is written.
    """
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    out = default_out(lang) if out is None else out
    repo, course, out = repo.resolve(), course.resolve(), Path(out).resolve()
    if do_release:
        release(course)
    lesson_paths = lessons(repo)
    if not lesson_paths:
        raise FileNotFoundError(f"no lessons match {repo / LESSONS_GLOB}")
    assignments = released(course)
    if lang != "en":  # refuse before touching `out`: everything it needs must be translated
        translations = {p.name: translated(p, lang) for p in lesson_paths}
        _refuse(README_DOMAIN, lang, readme_catalog_problems(lang))
        for name in assignments:
            translated(course / "release" / name / f"{name}.ipynb", lang)
    _clear(out, repo)

    copies: dict[str, Path] = {}  # pack path -> where it comes from
    for p in lesson_paths:
        copies[f"notebooks/{p.name}"] = p
    for name, paths in assignments.items():
        for p in paths:
            rel = p.relative_to(course / "release" / name).as_posix()
            copies[f"notebooks/assignments/{name}/{rel}"] = p
    for f in package_files(repo):
        copies[f] = repo / f
    for f in INSTALL_FILES:
        copies[f] = repo / f
    for rel, src in copies.items():
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if lang != "en" and src in lesson_paths:
            import nbformat

            nbformat.write(translations[src.name], dest)  # a lesson, translated
            continue
        shutil.copy2(src, dest)
        if rel.startswith("notebooks/assignments/") and rel.endswith(".ipynb"):
            if lang != "en":
                translate_assignment(dest, lang, relink=relink_lessons)
            else:
                _relink_notebook(dest)
    if lang != "en":
        write_marker(out / "notebooks", lang)
        for name in assignments:
            write_marker(out / "notebooks" / "assignments" / name, lang)
    (out / "Makefile").write_text(STUDENT_MAKEFILE, encoding="utf-8")
    (out / "README.md").write_text(student_readme(
        [out / "notebooks" / p.name for p in lesson_paths],
        {name: out / "notebooks" / "assignments" / name / f"{name}.ipynb" for name in assignments},
        lang), encoding="utf-8")
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    pack = Pack(out, files)

    # Nothing that fails a check is left behind to be handed out: no folder, no archive.
    top = archive_name(lang)
    zip_path = out.parent / f"{top}.zip"
    zip_path.unlink(missing_ok=True)
    bad = forbidden(out)
    if bad:
        shutil.rmtree(out)
        raise RuntimeError(f"the pack held teacher files, removed it: {bad}")
    if check:
        pack.leaks = check_leaks(out, course / "source", repo)
        if not pack.leaks.ok:
            shutil.rmtree(out)
            raise RuntimeError("the pack leaked answers, removed it (no archive written):\n"
                               + pack.leaks.summary())
    if archive:
        with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as z:
            for f in files:
                z.write(out / f, f"{top}/{f}")
        pack.archive = zip_path
    return pack


def forbidden(folder: Path) -> list[str]:
    """Paths under `folder` that must never be in a pack (teacher files, caches, VCS)."""
    bad = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if (p.name in FORBIDDEN_NAMES or p.suffix == ".pyc"
                or any(part in FORBIDDEN_DIRS for part in rel.parts)):
            bad.append(rel.as_posix())
    return bad


# --- the leak check --------------------------------------------------------------------------
def normalise(text: str) -> str:
    """Runs of whitespace collapsed to one space, ends stripped."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Region:
    """A secret part of a source notebook: a solution, a model written answer, hidden tests."""

    notebook: str  # e.g. A1_seven_steps.ipynb
    cell: str  # the cell's grade_id
    kind: str  # "solution", "written answer" or "hidden tests"
    text: str

    @property
    def normalised(self) -> str:
        return normalise(self.text)

    def __str__(self) -> str:
        return f"{self.notebook} {self.cell} ({self.kind})"


def _split(source: str) -> tuple[list[tuple[str, str]], str]:
    """A cell's marked regions [(kind, text)] and the rest of it (its open text)."""
    regions, open_lines, inside, buf = [], [], None, []
    for line in source.splitlines():
        began = next((k for k, (b, _) in MARKERS.items() if b in line), None)
        if inside is None and began:
            inside, buf = began, []
        elif inside is not None and MARKERS[inside][1] in line:
            regions.append((inside, "\n".join(buf)))
            inside = None
        elif inside is not None:
            buf.append(line)
        else:
            open_lines.append(line)
    if inside is not None:  # an unclosed marker: treat the rest as secret
        regions.append((inside, "\n".join(buf)))
    return regions, "\n".join(open_lines)


def secret_regions(source: Path) -> tuple[list[Region], str]:
    """Every secret region of every notebook under source/, and the source's open text.

    Code cells: each ### BEGIN SOLUTION / ### BEGIN HIDDEN TESTS region (the whole cell if it
    is a solution cell without markers). Markdown cells with nbgrader solution=true: the
    whole cell (the model written answer), or its marked regions if it has markers.
    """
    import nbformat

    regions, open_text = [], []
    for path in sorted(source.glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            gid = meta.get("grade_id", f"cell {cell.get('id', '?')}")
            marked, rest = _split(cell.source)
            for kind, text in marked:
                regions.append(Region(path.name, gid, kind, text))
            if meta.get("solution") and not any(k == "solution" for k, _ in marked):
                kind = "written answer" if cell.cell_type == "markdown" else "solution"
                regions.append(Region(path.name, gid, kind, rest))
            else:
                open_text.append(rest)
    return regions, normalise("\n".join(open_text))


def _joined(value) -> str:
    """A notebook field that is a string or a list of lines."""
    return value if isinstance(value, str) else "".join(value)


def _notebook_text(path: Path) -> str:
    """A notebook's cell sources and text outputs (not its JSON: that escapes quotes and
    newlines). Plain json, not nbformat: nbformat's validation triples the time."""
    try:
        nb = json.loads(path.read_text())
        cells = nb["cells"]
    except (ValueError, KeyError, TypeError):
        return path.read_text(errors="replace")  # not a notebook: search it as it is
    parts = []
    for cell in cells:
        parts.append(_joined(cell.get("source", "")))
        for output in cell.get("outputs", []):
            if "text" in output:
                parts.append(_joined(output["text"]))
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/"):
                    parts.append(_joined(value))
    return "\n".join(parts)


def texts(folder: Path) -> tuple[dict[str, str], list[str]]:
    """Every text file under `folder`, normalised, by relative path; and the binary files."""
    found, binary = {}, []
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(folder).as_posix()
        if p.suffix == ".ipynb":
            found[rel] = normalise(_notebook_text(p))
            continue
        data = p.read_bytes()
        try:
            if b"\0" in data:
                raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
            found[rel] = normalise(data.decode("utf-8"))
        except UnicodeDecodeError:
            binary.append(rel)
    return found, binary


def public_text(repo: Path = ROOT) -> str:
    """What students may see anyway: the repository's lessons and its package src/."""
    parts = [_notebook_text(p) for p in lessons(repo)]
    for f in package_files(repo):
        try:
            parts.append((repo / f).read_text())
        except UnicodeDecodeError:
            pass
    return normalise("\n".join(parts))


@dataclass
class LeakReport:
    """What check_leaks looked at and what it found."""

    regions: int = 0  # secret regions checked as whole blocks
    lines: int = 0  # distinctive lines checked one by one
    lines_public: int = 0  # long lines skipped: also in the lessons, src/ or the open source text
    files: int = 0  # text files of the pack read
    binary: list[str] = field(default_factory=list)
    # (region, pack file): a whole region found; public=True where the repository's own lessons
    # or src/ hold it verbatim too (it is public anyway, not lost by the release).
    hits: list[tuple[Region, str, bool]] = field(default_factory=list)
    line_hits: list[tuple[Region, str, str]] = field(default_factory=list)  # (region, line, file)
    marker_hits: list[tuple[str, str]] = field(default_factory=list)  # (marker, file)

    @property
    def leaks(self) -> list[tuple[Region, str]]:
        """Whole-region hits that are not public anyway."""
        return [(r, f) for r, f, public in self.hits if not public]

    @property
    def ok(self) -> bool:
        return not (self.leaks or self.line_hits or self.marker_hits)

    def summary(self) -> str:
        lines = [f"leak check: {self.regions} regions, {self.lines} distinctive lines "
                 f"({self.lines_public} more skipped as public), {self.files} text files"]
        lines += [f"  LEAK {r} in {f}" for r, f in self.leaks]
        lines += [f"  LEAK line of {r} in {f}: {line!r}" for r, line, f in self.line_hits]
        lines += [f"  LEAK marker {m!r} in {f}" for m, f in self.marker_hits]
        lines += [f"  public anyway: {r} in {f} (the repository's lessons or src/ hold it)"
                  for r, f, public in self.hits if public]
        return "\n".join(lines)


def distinctive_lines(region: Region, public: str | bytes, open_text: str | bytes,
                      min_line: int = MIN_LINE) -> tuple[list[str], int]:
    """A region's lines (normalised) longer than `min_line` that students never see: not in
    `public` (the lessons and src/) nor in `open_text` (what the release keeps of the
    source); and how many long lines were skipped because they are."""
    lines, skipped = [], 0
    for line in dict.fromkeys(map(normalise, region.text.splitlines())):
        if len(line) <= min_line:
            continue
        if _in(line, public) or _in(line, open_text):
            skipped += 1
        else:
            lines.append(line)
    return lines, skipped


def _in(needle: str, haystack: str | bytes) -> bool:
    # UTF-8 bytes: one byte a character for this ASCII-heavy text, where one emoji makes a
    # str four bytes a character; byte and character substrings agree for valid UTF-8.
    return (needle.encode() if isinstance(haystack, bytes) else needle) in haystack


def check_leaks(folder: Path, source: Path = COURSE / "source", repo: Path = ROOT,
                min_line: int = MIN_LINE) -> LeakReport:
    """Grep `folder` for every secret region of the notebooks under `source`.

    A region leaks if its whitespace-normalised text occurs in a text file of the folder
    (for notebooks, in their cell sources and text outputs). Each of its lines longer than
    `min_line` characters that occurs neither in the repository's lessons and src/ nor in
    the open (released) text of the source notebooks must not occur anywhere in the folder
    either. nbgrader's markers themselves must not occur at all.
    """
    regions, open_text = secret_regions(source)
    if not regions:
        raise RuntimeError(f"no solution or hidden-test regions found under {source}")
    public, open_b = public_text(repo).encode(), open_text.encode()
    found, binary = texts(folder)
    found_b = {f: t.encode() for f, t in found.items()}
    corpus = b"\0".join(found_b.values())
    report = LeakReport(files=len(found), binary=binary)

    def where(needle: str) -> list[str]:
        b = needle.encode()
        return [f for f, t in found_b.items() if b in t] if b in corpus else []

    for region in regions:
        block = region.normalised
        if not block:
            continue
        report.regions += 1
        report.hits += [(region, f, block.encode() in public) for f in where(block)]
        lines, skipped = distinctive_lines(region, public, open_b, min_line)
        report.lines_public += skipped
        report.lines += len(lines)
        for line in lines:
            report.line_hits += [(region, line, f) for f in where(line)]
    for begin, end in MARKERS.values():
        for marker in (begin, end):
            report.marker_hits += [(marker, f) for f in where(marker)]
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help=f"the pack's folder (default {DEFAULT_OUT.relative_to(ROOT)}, or "
                         f"{default_out('zh_CN').relative_to(ROOT)} for --lang zh_CN); "
                         "the zip goes beside it")
    ap.add_argument("--lang", choices=LANGS, default="en",
                    help="zh_CN: the Chinese edition (lessons, instructions and README from the "
                         "catalogs in notebooks/locale/)")
    ap.add_argument("--no-release", action="store_true",
                    help="use release/ as it is (skip course.py release)")
    ap.add_argument("--no-archive", action="store_true", help="the folder only, no zip")
    ap.add_argument("--update-readme-catalog", action="store_true",
                    help=f"only bring {README_DOMAIN}.po in line with the README's English "
                         "(then: python -m tools.book.i18n todo / fill student_readme)")
    ap.add_argument("--check-readme-catalog", action="store_true",
                    help=f"only check {README_DOMAIN}.po: exit 1 on a block left untranslated, "
                         "fuzzy or invalid")
    args = ap.parse_args(argv)
    langs = [args.lang] if args.lang != "en" else list(LANGS[1:])
    if args.update_readme_catalog:
        for lang in langs:
            n = update_readme_catalog(lang)
            print(f"{i18n_tools().po_path(README_DOMAIN, lang).relative_to(ROOT)}: {n} messages, "
                  f"{len(readme_catalog_problems(lang))} to translate")
        return 0
    if args.check_readme_catalog:
        bad = {lang: readme_catalog_problems(lang) for lang in langs}
        for lang, missing in bad.items():
            print(f"{README_DOMAIN} ({lang}): {len(missing)} block(s) untranslated, fuzzy or invalid"
                  + "".join(f"\n  {m[:100]!r}" for m in missing))
        return 1 if any(bad.values()) else 0
    try:
        pack = build(args.out, do_release=not args.no_release, archive=not args.no_archive,
                     lang=args.lang)
    except Untranslated as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    where = os.path.relpath(pack.folder)
    print(pack.leaks.summary() if pack.leaks else "")
    print(f"student pack: {where}/ ({len(pack.files)} files, {pack.size / 2**20:.1f} MiB)"
          + (f", {os.path.relpath(pack.archive)} ({pack.archive.stat().st_size / 2**20:.1f} MiB)"
             if pack.archive else ""))
    return 0

if __name__ == "__main__":
    sys.exit(main())
