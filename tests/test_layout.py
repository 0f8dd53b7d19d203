"""The layout shows the architecture: the library `mha` never imports the course `mha_course`,
tools/ import neither, no module is a re-export shim, the library holds no planted bugs or
diagnoses, and the README's Layout section names every part.

Each rule is a function over a repository root, run on this repository (nothing found) and on a
small tree with that one rule broken (found), so each test is shown to be able to fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("src/mha/", "src/mha_course/", "tools/", "notebooks/", "tests/")
COURSE_ONLY = ("diagnose", "planted", "probe")  # module names that belong to the course


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imported(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (functions included), absolute names;
    `importlib.import_module("x")` with a literal counts too."""
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.add("." * node.level + (node.module or ""))
            else:
                found.add(node.module or "")
                found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.add(node.args[0].value)
    return found


def _reaches(names: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in packages)


def library_imports_course(root: Path) -> list[str]:
    """'path: module' for each import of mha_course (or tools) from src/mha."""
    return [f"{p.relative_to(root)}: {m}" for p in sorted((root / "src" / "mha").rglob("*.py"))
            for m in _reaches(imported(p), ("mha_course", "tools"))]


def tools_import_packages(root: Path) -> list[str]:
    """'path: module' for each import of mha or mha_course from tools/ (relative ones are
    tools' own)."""
    return [f"{p.relative_to(root)}: {m}" for p in sorted((root / "tools").rglob("*.py"))
            for m in _reaches(imported(p), ("mha", "mha_course"))]


def _defines(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
               for n in ast.walk(tree))


def _docstring_and_constants(tree: ast.Module) -> bool:
    """Only a docstring and plain constant assignments (`__version__ = "0.1.0"`), no import."""
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
            continue
        return False
    return True


def shims(root: Path) -> list[str]:
    """Modules of both packages and tools that define no function or class and are not an
    `__init__` holding only its docstring (a re-export or an alias is a shim). An `__init__`
    never imports: it re-exports nothing."""
    bad = []
    for base in ("src/mha", "src/mha_course", "tools"):
        for p in sorted((root / base).rglob("*.py")):
            tree = _tree(p)
            rel = str(p.relative_to(root))
            if p.name == "__init__.py":
                if not _defines(tree) and not _docstring_and_constants(tree):
                    bad.append(f"{rel}: an __init__ that imports or re-exports")
            elif not _defines(tree):
                bad.append(f"{rel}: defines no function or class (a shim?)")
    return bad


def course_names_in_library(root: Path) -> list[str]:
    """Modules and folders under src/mha named like the course's (diagnose*, planted*, probe*)."""
    return sorted(str(p.relative_to(root)) for p in (root / "src" / "mha").rglob("*")
                  if "__pycache__" not in p.parts and p.stem.startswith(COURSE_ONLY))


def layout_section(readme: str) -> str:
    """The README's `## Layout` section, up to the next `## ` heading."""
    m = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    return m.group(1) if m else ""


def parts_missing_from_readme(root: Path) -> list[str]:
    """Top-level parts the README's Layout section does not name at a line's start."""
    section = layout_section((root / "README.md").read_text())
    starts = {line.split()[0] for line in section.splitlines() if line.strip()}
    return [p for p in PARTS if p not in starts]


RULES = {"library imports course": library_imports_course,
         "tools import packages": tools_import_packages,
         "shims": shims,
         "course names in library": course_names_in_library,
         "README layout": parts_missing_from_readme}


@pytest.mark.parametrize("rule", RULES)
def test_this_repository_keeps_the_rule(rule):
    assert RULES[rule](ROOT) == [], f"{rule}: {RULES[rule](ROOT)}"


def _good_tree(root: Path) -> Path:
    """A small repository that keeps every rule."""
    files = {
        "src/mha/__init__.py": '"""The library."""\n__version__ = "0.1.0"\n',
        "src/mha/steps.py": "import numpy as np\n\n\ndef softmax(x):\n    return np.exp(x)\n",
        "src/mha/attention/__init__.py": '"""Attention."""\n',
        "src/mha/attention/flash.py": "from mha import steps\n\n\ndef tiled():\n    return steps\n",
        "src/mha_course/__init__.py": '"""The course."""\n',
        "src/mha_course/planted.py": "from mha.attention import flash\n\n\nclass Bug:\n    f = flash\n",
        "tools/__init__.py": '"""Tools."""\n',
        "tools/site/__init__.py": "import json\n\n\ndef build():\n    return json\n",
        "tools/site/__main__.py": "from . import build\n\n\ndef main():\n    build()\n",
        "README.md": "# x\n\n## Layout\n\n```\nnotebooks/   lessons\nsrc/mha/     library\n"
                     "src/mha_course/  course\ntools/       tools\ntests/       tests\n```\n"
                     "\n## After\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# One planted violation per rule: (file, text) written over the good tree.
PLANTED = {
    "library imports course": ("src/mha/attention/flash.py",
                               "def tiled():\n    from mha_course import planted\n    return planted\n"),
    "tools import packages": ("tools/site/__init__.py",
                              "import importlib\n\n\ndef build():\n"
                              "    return importlib.import_module('mha.steps')\n"),
    "shims": ("src/mha/attention/__init__.py", '"""Attention."""\nfrom .flash import tiled\n'),
    "course names in library": ("src/mha/diagnose_flash.py", "def name():\n    return 1\n"),
    "README layout": ("README.md", "# x\n\n## Layout\n\nsrc/mha/ library\n\n## tools/ elsewhere\n"),
}


def test_a_good_tree_keeps_every_rule(tmp_path):
    root = _good_tree(tmp_path)
    assert {rule: fn(root) for rule, fn in RULES.items()} == {rule: [] for rule in RULES}


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_finds_its_planted_violation(tmp_path, rule):
    root = _good_tree(tmp_path)
    rel, text = PLANTED[rule]
    (root / rel).write_text(text)
    found = {name: fn(root) for name, fn in RULES.items()}
    assert found[rule], f"{rule} missed {rel}"
    assert [name for name, f in found.items() if f] == [rule], found  # and only that rule


def test_a_shim_module_is_found(tmp_path):
    root = _good_tree(tmp_path)
    (root / "src/mha/masks.py").write_text("from mha.attention.flash import tiled  # noqa: F401\n")
    assert shims(root) == ["src/mha/masks.py: defines no function or class (a shim?)"]
