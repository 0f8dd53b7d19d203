"""What each notebook checks, read from its code cells, and how long CI took to run it.

The book's checks page (`tools.book.build`) is generated from these, never typed: per notebook,
the named checks it calls (`check_*`, `assert_*`), its `assert` and `raise AssertionError`
statements, its cells whose printed text nbval compares, and its runtime in the last CI run.
"""

from __future__ import annotations

import ast
import pathlib
import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class NotebookChecks:
    """What a notebook verifies when it runs, read from its code cells."""

    calls: Counter = field(default_factory=Counter)  # check_* / assert_* calls by name
    raises: int = 0  # explicit `raise AssertionError(...)` statements
    asserts: int = 0  # `assert cond, message` statements
    checked_cells: int = 0  # cells whose printed text nbval compares (# NBVAL_CHECK_OUTPUT)

    @property
    def total(self) -> int:
        return sum(self.calls.values()) + self.raises + self.asserts


def _code(source: str) -> str:
    """Cell source with IPython magics and shell lines blanked, so `ast` can parse it."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def _call_name(func: ast.expr) -> str | None:
    """'checks.check_causal' for `checks.check_causal(...)`, 'check_shape' for a bare name."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts)) if parts else None


def notebook_checks(path: pathlib.Path) -> NotebookChecks:
    """Count the checks a notebook runs: check_*/assert_* calls, asserts, raises, checked cells."""
    import nbformat

    found = NotebookChecks()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        if "# NBVAL_CHECK_OUTPUT" in cell.source:
            found.checked_cells += 1
        try:
            tree = ast.parse(_code(cell.source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _call_name(node.func)
                last = name.rsplit(".", 1)[-1] if name else ""
                if last.startswith(("check_", "assert_")) or last == "check":
                    found.calls[name] += 1
            elif isinstance(node, ast.Assert):
                found.asserts += 1
            elif isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if _call_name(exc) == "AssertionError":
                    found.raises += 1
    return found


def ci_runtimes(junit: pathlib.Path | None) -> dict[str, float]:
    """Seconds nbval spent on each notebook in a pytest junit XML report (stem -> seconds)."""
    if junit is None or not junit.exists():
        return {}
    times: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        where = " ".join(case.get(k, "") for k in ("file", "classname", "name"))
        m = re.search(r"(\d\d_[a-z_]+)\.ipynb", where.replace("notebooks.", "notebooks/"))
        if m:
            times[m.group(1)] = times.get(m.group(1), 0.0) + float(case.get("time", 0.0))
    return times
