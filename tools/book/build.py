"""The series as a book in two editions (`make site`): Sphinx, myst-nb and sphinx-book-theme, offline.

`build(out, langs)` stages each edition's sources in `out/_src/<lang>/` and runs Sphinx:

    out/index.html        a landing page: the two editions
    out/en/...            the English edition: lessons, assignments (students' pages), glossary,
                          errata, and what each notebook checks
    out/zh_CN/...         the Chinese edition: the same notebooks with their markdown from the
                          zh_CN catalogs (tools.book.i18n); code, outputs and figures unchanged

Staging writes nothing under notebooks/. Lessons link one another as `05_causal_mask.ipynb`; in
the staged sources those are sibling documents, so myst-nb turns them into page links.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from tools.book import i18n
from tools.book.checks import NotebookChecks, ci_runtimes, notebook_checks

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NOTEBOOKS = ROOT / "notebooks"
ASSIGNMENTS = NOTEBOOKS / "assignments" / "source"
VENDOR = HERE / "vendor"
LANGS = ("en", "zh_CN")

WORDS = {  # the few words the build itself writes, in each edition
    "en": {
        "lessons": "Lessons", "assignments": "Assignments", "reference": "Reference",
        "checks_title": "What each notebook checks",
        "intro": ("Multi-head attention learned by doing it: the seven steps in numpy, the same "
                  "module in PyTorch, then the road to production kernels, serving and many "
                  "devices. Each page is a notebook of the series as it last ran, with its "
                  "outputs; every number on it is checked when the series runs in CI. To run "
                  "the code and move the sliders, clone the repository and run `make lab` "
                  "(`make lab-zh` for the Chinese notebooks), or use the launch button at the "
                  "top of a lesson."),
        "other": "这本书的中文版", "other_href": "../zh_CN/index.html",
        "widget_note": ("The sliders on this page show the state they were saved in; they move "
                        "only with a running kernel: open the lesson with the launch button above, "
                        "or in JupyterLab (`make lab`)."),
        "assignment_note": ("The students' version of the assignment (no answers, no hidden "
                            "tests). Take it with `make assignment A={name}` and check it with "
                            "`make check A={name}`."),
        "checks_intro": ("Generated when the book is built, never typed. **Runtime**: seconds "
                         "nbval took to re-execute the notebook and compare its outputs in the "
                         "last `make test` ({source}). **Checks**: calls of named checks "
                         "(`check_*`, `assert_*`) plus `assert` and `raise AssertionError` "
                         "statements in its code cells. **Checked outputs**: cells whose printed "
                         "text must match the saved notebook (`# NBVAL_CHECK_OUTPUT`)."),
        "checks_cols": ("notebook", "runtime in CI", "checks", "checked outputs",
                        "assert / raise", "named checks called"),
        "not_measured": "not measured", "measured": "from the junit report of the last run",
        "no_report": "not measured: no test report was found",
    },
    "zh_CN": {
        "lessons": "课程", "assignments": "作业", "reference": "参考",
        "checks_title": "每个笔记本检查了什么",
        "intro": ("动手学多头注意力：先用 numpy 走完七步，再把同一个模块移植到 PyTorch，然后一路走到"
                  "生产级 kernel、推理服务和多设备。每一页都是系列里的一个笔记本，连同它上次运行的输出；"
                  "页面上的每个数字都在 CI 重新运行系列时检查过。想运行代码、拖动滑块，请克隆仓库并运行 "
                  "`make lab-zh`（中文笔记本），或者点课程页顶部的启动按钮。"),
        "other": "English edition", "other_href": "../en/index.html",
        "widget_note": ("本页的滑块显示的是保存时的状态，只有连着运行中的内核才能拖动：用上方的启动按钮打开"
                        "这一课，或在 JupyterLab 里打开（`make lab-zh`）。"),
        "assignment_note": ("这是作业的学生版（没有答案，也没有隐藏测试）。用 "
                            "`make assignment A={name}` 领取，用 `make check A={name}` 自查。"),
        "checks_intro": ("本页在构建时生成，不是手写的。**运行时间**：最近一次 `make test` 中 nbval "
                         "重新执行该笔记本并比对输出所用的秒数（{source}）。**检查**：代码单元里具名检查"
                         "（`check_*`、`assert_*`）的调用次数，加上 `assert` 和 `raise AssertionError` "
                         "语句的个数。**受检输出**：打印文本必须与保存的笔记本一致的单元"
                         "（`# NBVAL_CHECK_OUTPUT`）。"),
        "checks_cols": ("笔记本", "CI 运行时间", "检查", "受检输出", "assert / raise", "调用的具名检查"),
        "not_measured": "未测量", "measured": "来自上次运行的 junit 报告",
        "no_report": "未测量：没有找到测试报告",
    },
}


@dataclass
class Edition:
    """What one edition's build wrote."""

    lang: str
    out: pathlib.Path
    seconds: float
    warnings: list[str]

    @property
    def pages(self) -> list[pathlib.Path]:
        return sorted(p for p in self.out.rglob("*.html") if "_static" not in p.parts)


def lessons() -> list[pathlib.Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def assignments() -> list[pathlib.Path]:
    return sorted(ASSIGNMENTS.glob("A*/A*.ipynb"))


def student_version(path: pathlib.Path):
    """An assignment as students get it: solutions replaced by stubs, hidden tests gone, no outputs."""
    import nbformat
    from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions

    nb = nbformat.read(path, as_version=4)
    resources = {}
    clear = ClearSolutions(code_stub={"python": "# YOUR CODE HERE\nraise NotImplementedError()"},
                           text_stub="YOUR ANSWER HERE", enforce_metadata=False)
    for pre in (clear, ClearHiddenTests(enforce_metadata=False), ClearOutput()):
        nb, resources = pre.preprocess(nb, resources)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                          "language": "python"})
    return nb


def _markdown(nb, lang: str, domain: str):
    """The notebook's markdown in `lang` (English as it is)."""
    return nb if lang == "en" else i18n.translate_notebook(nb, i18n.read(domain, lang), lang)


def _assignment_links(nb) -> None:
    """Links from an assignment (source/NAME/) to lessons (../../../NN_x.ipynb) become sibling links."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = re.sub(r"\]\((?:\.\./)+(\d\d_[a-z0-9_]+\.ipynb)", r"](\1", cell.source)


def _checks_page(lang: str, junit: pathlib.Path | None) -> str:
    """The checks page as MyST markdown: per notebook, CI runtime and the checks it asserts."""
    w = WORDS[lang]
    runtimes = ci_runtimes(junit)
    rows = []
    for path in lessons():
        c: NotebookChecks = notebook_checks(path)
        secs = runtimes.get(path.stem)
        calls = ", ".join(f"`{n}` ×{k}" if k > 1 else f"`{n}`" for n, k in sorted(c.calls.items()))
        rows.append(f"| [{path.stem}]({path.name}) | {f'{secs:.1f} s' if secs is not None else w['not_measured']} "
                    f"| {c.total} | {c.checked_cells} | {c.asserts + c.raises} | {calls or '–'} |")
    source = w["measured"] if runtimes else w["no_report"]
    cols = w["checks_cols"]
    return "\n".join([f"# {w['checks_title']}", "", w["checks_intro"].format(source=source), "",
                      "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols), *rows, ""])


def _index(lang: str) -> str:
    """The edition's root page: what the book is, and the table of contents."""
    w = WORDS[lang]

    def toc(caption: str, docs: list[str]) -> str:
        return "\n".join([f"```{{toctree}}\n:caption: {caption}\n:maxdepth: 1\n", *docs, "```", ""])

    return "\n".join([
        "# Attention by Hand", "",
        w["intro"], "", f'<p><a class="other-edition" href="{w["other_href"]}">{w["other"]}</a></p>', "",
        toc(w["lessons"], [p.stem for p in lessons()]),
        toc(w["assignments"], [f"assignments/{p.stem}" for p in assignments()]),
        toc(w["reference"], ["glossary", "errata", "checks"]),
    ])


def _headings(nb) -> list[str]:
    """The heading lines of a notebook's markdown, in reading order (fenced code skipped)."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        fence = False
        for line in cell.source.splitlines():
            if i18n.FENCE.match(line):
                fence = not fence
            elif not fence and re.match(r"^#{1,6} ", line):
                found.append(line.lstrip("#").strip())
    return found


def _plain(heading: str) -> str:
    """A heading's text as a reader sees it: links, emphasis and backticks gone."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[`*]", "", text)


def _anchor_map(english, staged) -> dict[str, str]:
    """JupyterLab's anchor of each English heading ('The-logsumexp-merge') -> the staged page's slug."""
    from myst_parser.slugs import github_slugify, unique_slug

    out: dict[str, str] = {}
    seen: set[str] = set()
    for en, here in zip(_headings(english), _headings(staged), strict=True):
        slug = unique_slug(github_slugify(_plain(here)), seen)
        seen.add(slug)
        for key in (_plain(en).replace(" ", "-"), en.replace(" ", "-")):
            out.setdefault(key, slug)
    return out


def _relink(text: str, here: str, anchors: dict[str, dict[str, str]], docs: set[str], prefix: str) -> str:
    """Links in a staged page: lesson anchors to the page's slugs, files outside the book to the repository."""
    from tools.book.conf import REPO

    def fix(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^(https?:|mailto:)", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        stem = pathlib.Path(path).stem if path else here
        name = pathlib.Path(path).name
        if path and name not in docs:  # a file of the repository, not a page of the book
            where = (prefix / pathlib.Path(path)).as_posix() if path else ""
            return f"[{label}]({REPO}/blob/main/{_normal(where)}{'#' + anchor if anchor else ''})"
        if anchor and stem in anchors:
            anchor = anchors[stem].get(anchor, anchor)
        return f"[{label}]({path}{'#' + anchor if anchor else ''})"

    return re.sub(r"\[([^\]]*)\]\(([^)\s]+)\)", fix, text)


def _normal(path: str) -> str:
    """'notebooks/assignments/../README.md' -> 'README.md'."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/".join(parts)


def _title_cell(nb) -> int:
    """The index of the cell holding the page's `# ` title (-1 when none)."""
    return next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                 and c.source.lstrip().startswith("# ")), -1)


def stage(lang: str, dest: pathlib.Path, junit: pathlib.Path | None = None) -> None:
    """Write one edition's Sphinx sources into `dest`: notebooks, pages, index, static files."""
    import nbformat

    if dest.exists():
        shutil.rmtree(dest)
    (dest / "assignments").mkdir(parents=True)
    docs = {p.name for p in lessons()} | {p.name for p in assignments()} | \
        {p.name for p in NOTEBOOKS.glob("*.md")}
    staged = {}  # stem -> (English notebook, staged notebook, where it goes, its folder in the repo)
    for path in lessons():
        nb = nbformat.read(path, as_version=4)
        here = _markdown(nb, lang, path.stem)
        if "widgets" in nb.metadata:  # a page with sliders says they need a kernel
            note = nbformat.v4.new_markdown_cell(f"```{{note}}\n{WORDS[lang]['widget_note']}\n```")
            note.metadata["tags"] = ["widget-note"]
            here.cells.insert(_title_cell(here) + 1, note)
        staged[path.stem] = (nb, here, dest / path.name, "notebooks")
    for path in assignments():
        english = student_version(path)
        _assignment_links(english)
        nb = _markdown(english, lang, path.stem)
        note = nbformat.v4.new_markdown_cell(WORDS[lang]["assignment_note"].format(name=path.stem[:2]))
        nb.cells.insert(_title_cell(nb) + 1, note)
        staged[path.stem] = (english, nb, dest / "assignments" / path.name,
                             path.parent.relative_to(ROOT).as_posix())
    anchors = {stem: _anchor_map(en, nb) for stem, (en, nb, _, _) in staged.items()}
    for stem, (_, nb, target, folder) in staged.items():
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = _relink(cell.source, stem, anchors, docs, folder)
                if target.parent.name == "assignments":  # lessons are one folder up
                    cell.source = re.sub(r"\]\((\d\d_[a-z0-9_]+\.ipynb)", r"](../\1", cell.source)
        nbformat.write(nb, target)
    for page in sorted(NOTEBOOKS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        if lang != "en":
            text = i18n.translate_text(text, i18n.read(page.stem, lang))
        (dest / page.name).write_text(_relink(text, page.stem, anchors, docs, "notebooks"),
                                      encoding="utf-8")
    (dest / "checks.md").write_text(_checks_page(lang, junit), encoding="utf-8")
    (dest / "index.md").write_text(_index(lang), encoding="utf-8")
    shutil.copy(HERE / "conf.py", dest / "conf.py")
    copy_static(dest / "_static")
    fonts = dest / "_extra" / "@jupyter-widgets" / "html-manager" / "dist"
    fonts.mkdir(parents=True)
    for font in VENDOR.glob("*.woff*"):  # embed-amd.js asks for them relative to the page
        shutil.copy(font, fonts / font.name)


def copy_static(static: pathlib.Path) -> None:
    """The book's CSS, the vendored widget scripts and fonts, and MathJax from its wheel."""
    import jupyter_server_mathjax

    static.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "book.css", static / "book.css")
    shutil.copytree(VENDOR, static / "vendor", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("README.md"))
    mathjax = pathlib.Path(jupyter_server_mathjax.__file__).parent / "static"
    shutil.copytree(mathjax, static / "vendor" / "mathjax", dirs_exist_ok=True)


def sphinx(src: pathlib.Path, out: pathlib.Path, lang: str, jobs: int = 1) -> list[str]:
    """Run sphinx-build on a staged edition; returns its warnings (each line)."""
    warnings = out.parent / f"warnings-{lang}.txt"
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", str(jobs), "-D", f"language={lang}",
           "-w", str(warnings), str(src), str(out)]
    subprocess.run(cmd, check=True)
    return [line for line in warnings.read_text().splitlines() if line.strip()]


def build(out: pathlib.Path, langs: tuple[str, ...] = LANGS, junit: pathlib.Path | None = None,
          jobs: int = 1) -> list[Edition]:
    """Both editions (or `langs`) into `out`, with a landing page that links them."""
    out.mkdir(parents=True, exist_ok=True)
    editions = []
    for lang in langs:
        start = time.perf_counter()
        src = out / "_src" / lang
        stage(lang, src, junit)
        target = out / lang
        if target.exists():
            shutil.rmtree(target)
        warnings = sphinx(src, target, lang, jobs)
        editions.append(Edition(lang, target, time.perf_counter() - start, warnings))
    (out / "index.html").write_text(LANDING, encoding="utf-8")
    return editions


LANDING = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Attention by Hand</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body { font-family: system-ui, sans-serif; max-width: 40em; margin: 4em auto; padding: 0 1em;
line-height: 1.6; } a { font-size: 1.2em; }</style></head><body>
<h1>Attention by Hand</h1>
<p>Multi-head attention learned by doing it. 动手学多头注意力。</p>
<ul><li><a href="en/index.html">English edition</a></li>
<li><a href="zh_CN/index.html" lang="zh-CN">中文版</a></li></ul>
</body></html>
"""
