"""The series as a static website: `python -m tools.site OUT [--junit FILE]` (what `make site` runs).

nbconvert's HTML exporter renders every committed notebook as it is (executed, with its plots
and saved widget state; nothing is re-run) through a small template that adds previous / next
links and a note on the widgets. Nothing is fetched from the network, at build time or when
the pages are read: MathJax comes from the `jupyter-server-mathjax` wheel, the widget
renderer and require.js are vendored in `vendor/`. Next to the lessons it writes:

    index.html   the lessons in series order, with what each teaches (from README.md)
    checks.html  per notebook: its runtime in the last CI run (from pytest's junit XML) and
                 the checks it asserts, found by reading its code cells (never typed by hand)
"""

from __future__ import annotations

import ast
import html
import pathlib
import re
import shutil
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository: tools/site -> tools -> root
VENDOR = HERE / "vendor"
TEMPLATES = HERE / "templates"
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"


@dataclass
class Lesson:
    """One notebook of the series: where it is, where its page goes, and its title."""

    stem: str
    path: pathlib.Path
    title: str
    teaches: str = ""

    @property
    def href(self) -> str:
        return f"{self.stem}.html"


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


def lessons(notebooks: pathlib.Path = ROOT / "notebooks",
            readme: pathlib.Path = ROOT / "README.md") -> list[Lesson]:
    """The numbered notebooks in series order, titled by their first heading."""
    import nbformat

    teaches = _readme_descriptions(readme)
    out = []
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        heading = next((line for c in nb.cells if c.cell_type == "markdown"
                        for line in c.source.splitlines() if line.startswith("# ")), path.stem)
        title = heading.lstrip("# ").strip().replace("`", "")  # plain text: titles, link labels
        out.append(Lesson(path.stem, path, title, teaches.get(path.stem, "")))
    if not out:
        raise FileNotFoundError(f"no numbered notebooks (NN_name.ipynb) in {notebooks}")
    return out


def _readme_descriptions(readme: pathlib.Path) -> dict[str, str]:
    """stem -> 'what it teaches' from the README's table of the series."""
    rows = re.findall(r"^\| `(\d\d_[a-z_]+)` \| (.+?) \|", readme.read_text(), flags=re.M)
    return dict(rows)


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


def inline_markdown(text: str) -> str:
    """README table text as HTML: `code` spans become <code>, $math$ is kept for MathJax, the rest escaped."""
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(f"<code>{html.escape(p[1:-1])}</code>" if p.startswith("`") and p.endswith("`")
                   and len(p) > 1 else html.escape(p, quote=False) for p in parts)


# MathJax for the index's $...$: the lesson pages' own set-up (templates/series/series_mathjax.html.j2).
INDEX_MATHJAX = re.sub(
    r"\{#-.*?-#\}\n", "",
    (pathlib.Path(__file__).parent / "templates" / "series" / "series_mathjax.html.j2").read_text(),
    flags=re.S).replace("{{ resources.mathjax_url }}",
                        f"vendor/mathjax/MathJax.js?config={MATHJAX_CONFIG}")


def _page(title: str, body: str, head: str = "") -> str:
    """A plain page in the site's style (index and checks)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body {{ font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em;
        line-height: 1.5; color: #1f2328; }}
 table {{ border-collapse: collapse; width: 100%; }}
 th, td {{ text-align: left; vertical-align: top; padding: 0.35em 0.6em; border-bottom: 1px solid #d0d7de; }}
 td.num {{ text-align: right; white-space: nowrap; }}
 code {{ font-size: 0.9em; }}
</style>{head}</head><body>
{body}
</body></html>
"""


def index_page(series: list[Lesson]) -> str:
    """The table of contents, in series order."""
    rows = "\n".join(
        f'<tr><td class="num">{les.stem[:2]}</td><td><a href="{les.href}">{html.escape(les.title)}</a>'
        f'</td><td>{inline_markdown(les.teaches)}</td></tr>' for les in series)
    body = f"""<h1>Attention by Hand</h1>
<p>Multi-head attention learned by doing it: the seven steps in numpy, the same module in PyTorch,
then the road to production kernels. Each page is a notebook of the series as it last ran, with
its outputs; every number on it is checked when the series runs in CI
(<a href="checks.html">what each notebook checks</a>). To run the code and move the sliders,
clone the repository and run <code>make lab</code>.</p>
<table><thead><tr><th>#</th><th>lesson</th><th>what it teaches</th></tr></thead>
<tbody>
{rows}
</tbody></table>"""
    return _page("Attention by Hand", body, head=INDEX_MATHJAX)


def checks_page(series: list[Lesson], checks: dict[str, NotebookChecks],
                runtimes: dict[str, float], junit: pathlib.Path | None) -> str:
    """Per notebook: CI runtime and the checks it asserts, all read from files."""
    rows = []
    for les in series:
        c = checks[les.stem]
        calls = ", ".join(f"<code>{html.escape(n)}</code>&nbsp;&times;{k}" if k > 1 else
                          f"<code>{html.escape(n)}</code>" for n, k in sorted(c.calls.items()))
        secs = runtimes.get(les.stem)
        runtime = f"{secs:.1f} s" if secs is not None else "not measured"
        rows.append(
            f'<tr id="{les.stem}"><td><a href="{les.href}">{les.stem}</a></td>'
            f'<td class="num">{runtime}</td><td class="num">{c.total}</td>'
            f'<td class="num">{c.checked_cells}</td><td class="num">{c.asserts + c.raises}</td>'
            f"<td>{calls or '&ndash;'}</td></tr>")
    if runtimes:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(junit.stat().st_mtime))
        source = (f"from <code>{html.escape(junit.name)}</code>, the junit report of the last "
                  f"<code>make test</code>, written {when}")
    else:
        source = "not measured: no test report was found (run <code>make test</code>)"
    body = f"""<p><a href="index.html">&larr; all lessons</a></p>
<h1>What each notebook checks</h1>
<p>Generated when the site is built, never typed. <b>Runtime</b>: seconds nbval took to re-execute
the notebook and compare its outputs ({source}). <b>Checks</b>: calls of named checks
(<code>check_*</code>, <code>assert_*</code>) plus <code>assert</code> and
<code>raise AssertionError</code> statements in its code cells (each with a message saying
what was expected); each stops the notebook when its claim is false. <b>Checked
outputs</b>: cells whose printed text must match the saved notebook
(<code># NBVAL_CHECK_OUTPUT</code>).</p>
<table><thead><tr><th>notebook</th><th>runtime in CI</th><th>checks</th><th>checked outputs</th>
<th>assert / raise</th><th>named checks called</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>"""
    return _page("What each notebook checks", body)


def lesson_links(body: str) -> str:
    """Point the lessons' links to one another (`05_causal_mask.ipynb`) at their site pages."""
    return re.sub(r'href="(\d\d_[a-z0-9_]+)\.ipynb(#[^"]*)?"', r'href="\1.html\2"', body)


def _exporter():
    """nbconvert's HTML exporter on our template, with every asset served from the site."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="series", extra_template_basedirs=[str(TEMPLATES)])
    exporter.mathjax_url = f"vendor/mathjax/MathJax.js?config={MATHJAX_CONFIG}"
    exporter.require_js_url = "vendor/require.js"
    exporter.widget_renderer_url = "vendor/embed-amd.js"
    return exporter


def copy_assets(out: pathlib.Path) -> None:
    """Vendored JS and fonts, and MathJax from its wheel, into OUT/vendor."""
    import jupyter_server_mathjax

    vendor = out / "vendor"
    shutil.copytree(VENDOR, vendor, dirs_exist_ok=True)
    mathjax = pathlib.Path(jupyter_server_mathjax.__file__).parent / "static"
    shutil.copytree(mathjax, vendor / "mathjax", dirs_exist_ok=True)


@dataclass
class BuildReport:
    """What a build wrote: its pages, their total size in bytes and the time it took."""

    out: pathlib.Path
    pages: list[str]
    seconds: float

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.out.rglob("*") if p.is_file())


def build(out: pathlib.Path, notebooks: pathlib.Path = ROOT / "notebooks",
          junit: pathlib.Path | None = None, progress: bool = True) -> BuildReport:
    """Render every lesson, the index and the checks page into `out` (replaced if present)."""
    import nbformat
    from tqdm.auto import tqdm

    start = time.perf_counter()
    series = lessons(notebooks)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    copy_assets(out)
    exporter = _exporter()
    pages = []
    for i, les in enumerate(tqdm(series, desc="site", unit="page", disable=not progress)):
        nb = nbformat.read(les.path, as_version=4)
        prev = series[i - 1] if i > 0 else None
        nxt = series[i + 1] if i + 1 < len(series) else None
        nav = {"prev": prev, "next": nxt, "has_widgets": "widgets" in nb.metadata}
        resources = {"series": nav, "metadata": {"name": f"{les.title} - Attention by Hand"}}
        body, _ = exporter.from_notebook_node(nb, resources=resources)
        (out / les.href).write_text(lesson_links(body), encoding="utf-8")
        pages.append(les.href)
    (out / "index.html").write_text(index_page(series), encoding="utf-8")
    checks = {les.stem: notebook_checks(les.path) for les in series}
    (out / "checks.html").write_text(checks_page(series, checks, ci_runtimes(junit), junit),
                                     encoding="utf-8")
    return BuildReport(out, ["index.html", "checks.html", *pages], time.perf_counter() - start)
