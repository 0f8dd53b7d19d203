"""The book (`make site`): both editions built offline, read in headless Chromium with the network cut.

`make test` builds the book into _site/ after the unit tests (so the checks page carries this
run's notebook runtimes) and runs this file with SITE_DIR=_site. Run alone, it builds both
editions into a temporary folder first (about 40 s).
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import os
import pathlib
import re
import threading
from html.parser import HTMLParser

import nbformat
import pytest

from tools.book import build as book
from tools.book import checks, i18n

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / ".ci-reports"
EXPLORER_LESSON = "08_merge_and_output"  # the lesson that ends with the attention explorer
LESSONS = [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """The book make built (SITE_DIR), or a fresh build of both editions in a temporary folder."""
    if os.environ.get("SITE_DIR"):
        out = pathlib.Path(os.environ["SITE_DIR"]).resolve()
        for lang in book.LANGS:
            if not (out / lang / "index.html").exists():
                raise AssertionError(f"SITE_DIR={out} holds no {lang}/index.html: run `make site` first")
        return out
    out = tmp_path_factory.mktemp("book") / "site"
    editions = book.build(out)
    assert all(ed.warnings == [] for ed in editions), [ed.warnings for ed in editions]
    return out


class _Page(HTMLParser):
    """The parts of a page the tests read: links, scripts, ids, code cells and outputs."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.assets: list[str] = []  # what the browser fetches by itself: scripts, styles, images
        self.ids: set[str] = set()
        self.code: list[str] = []
        self._in_code = 0
        self._buf: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag in ("script", "img") and a.get("src"):
            self.assets.append(a["src"])
        if tag == "link" and a.get("href") and a.get("rel") in ("stylesheet", "preload", "icon"):
            self.assets.append(a["href"])
        cls = a.get("class") or ""
        if tag == "div" and "cell_input" in cls.split():
            self._in_code, self._buf = 1, []
        elif self._in_code and tag == "div":
            self._in_code += 1

    def handle_endtag(self, tag):
        if self._in_code and tag == "div":
            self._in_code -= 1
            if self._in_code == 0:
                self.code.append("".join(self._buf))

    def handle_data(self, data):
        if self._in_code:
            self._buf.append(data)


def _read(built: pathlib.Path, rel: str) -> _Page:
    return _Page((built / rel).read_text(encoding="utf-8"))


# Without a browser ----------------------------------------------------------------------
@pytest.mark.parametrize("lang", book.LANGS)
def test_every_lesson_assignment_and_page_is_in_the_book_in_order(built, lang):
    index = (built / lang / "index.html").read_text(encoding="utf-8")
    positions = [index.find(f'href="{s}.html"') for s in LESSONS]
    assert all(p >= 0 for p in positions), f"{lang} index misses {[s for s, p in zip(LESSONS, positions, strict=True) if p < 0]}"
    assert positions == sorted(positions), f"{lang} index lists the lessons out of order"
    for name in [*(f"{s}.html" for s in LESSONS), "glossary.html", "errata.html", "checks.html",
                 *(f"assignments/{p.stem}.html" for p in book.assignments())]:
        assert (built / lang / name).exists(), f"{lang}: no page {name}"


def test_the_landing_page_links_both_editions(built):
    page = _read(built, "index.html")
    assert {"en/index.html", "zh_CN/index.html"} <= set(page.links)


def test_both_editions_show_the_same_code_and_the_chinese_one_chinese_prose(built):
    """Single source: every code cell is the same text in both editions; the prose differs."""
    for stem in LESSONS:
        en, zh = _read(built, f"en/{stem}.html"), _read(built, f"zh_CN/{stem}.html")
        assert en.code and en.code == zh.code, f"{stem}: code cells differ between the editions"
        text = (built / "zh_CN" / f"{stem}.html").read_text(encoding="utf-8")
        title = html.unescape(re.search(r"<h1>(.*?)<a", text, flags=re.S).group(1))
        assert CJK.search(title), f"{stem}: the Chinese page's title is not Chinese: {title!r}"
        assert len(CJK.findall(text)) > 500, f"{stem}: the Chinese page has little Chinese in it"


def test_outputs_are_the_same_objects_in_both_editions(built):
    """Figures are single-source too: the same images (by content hash) on both pages."""
    for stem in ("05_causal_mask", EXPLORER_LESSON, "18_serving"):
        images = [sorted(a for a in _read(built, f"{lang}/{stem}.html").assets if "_images/" in a)
                  for lang in book.LANGS]
        assert images[0] and images[0] == images[1], f"{stem}: images differ {images}"


@pytest.mark.parametrize("lang", book.LANGS)
def test_no_page_fetches_anything_from_another_host(built, lang):
    pages = sorted((built / lang).rglob("*.html"))
    assert len(pages) > 30
    for path in pages:
        for asset in _read(built, path.relative_to(built).as_posix()).assets:
            assert not re.match(r"^(https?:)?//", asset), f"{path.name} fetches {asset}"


@pytest.mark.parametrize("lang", book.LANGS)
def test_every_link_inside_the_book_reaches_a_page_and_its_anchor(built, lang):
    """Lessons link one another (and their sections) as notebooks; in the book each lands."""
    seen = 0
    cache: dict[pathlib.Path, _Page] = {}

    def parsed(path: pathlib.Path) -> _Page:
        if path not in cache:
            cache[path] = _Page(path.read_text(encoding="utf-8"))
        return cache[path]

    for path in sorted((built / lang).rglob("*.html")):
        if "_static" in path.parts or path.name in ("search.html", "genindex.html"):
            continue
        page = parsed(path)
        for href in page.links:
            if re.match(r"^(https?:|mailto:|javascript:)", href) or href.startswith("#") and href == "#":
                continue
            target, _, anchor = href.partition("#")
            dest = (path.parent / target).resolve() if target else path
            if dest.is_dir():
                dest = dest / "index.html"
            assert dest.exists(), f"{lang}/{path.name} links {href}: no such file"
            if "_sources/" not in target:  # the download button offers the notebook
                assert ".ipynb" not in target, f"{lang}/{path.name} links a notebook file {href}"
            if anchor and dest.suffix == ".html":
                ids = parsed(dest).ids
                assert anchor in ids, f"{lang}/{path.name} links {href}: no id {anchor!r} there"
            seen += 1
    assert seen > 500, f"expected the book's cross-links, found {seen}"


def test_launch_buttons_open_a_lesson_on_the_hub_and_on_binder(built):
    page = _read(built, f"en/{EXPLORER_LESSON}.html")
    binder = [h for h in page.links if "mybinder.org/v2/gh/" in h]
    hub = [h for h in page.links if "/hub/user-redirect/git-pull" in h]
    assert binder and f"{EXPLORER_LESSON}.ipynb" in binder[0], binder
    assert hub and f"{EXPLORER_LESSON}.ipynb" in html.unescape(hub[0]), hub


def test_checks_page_is_generated_from_the_notebooks(built, tmp_path):
    page = (built / "en" / "checks.html").read_text(encoding="utf-8")
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        found = checks.notebook_checks(nb)
        row = re.search(rf'href="{nb.stem}.html"><span[^>]*>{nb.stem}</span>.*?</tr>', page, flags=re.S)
        assert row, f"no row for {nb.stem}"
        nums = re.findall(r"<td[^>]*><p>(\d+)</p></td>", row.group(0))
        assert nums[:3] == [str(found.total), str(found.checked_cells), str(found.asserts + found.raises)], \
            (nb.stem, nums)
    # The counts follow the code: a notebook with one more check counts one more.
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("checks.check_causal(f)\nif x:\n    raise AssertionError('no')\n"
                                  "assert y, 'why'"),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\n%matplotlib inline\nnp.testing.assert_allclose(a, b)"),
    ])
    nbformat.write(nb, tmp_path / "nb.ipynb")
    found = checks.notebook_checks(tmp_path / "nb.ipynb")
    assert dict(found.calls) == {"checks.check_causal": 1, "np.testing.assert_allclose": 1}
    assert (found.raises, found.asserts, found.checked_cells, found.total) == (1, 1, 1, 4)


def test_runtimes_come_from_the_junit_report(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="notebooks.08_merge_and_output.ipynb" name="Cell 0" time="1.5"/>
      <testcase classname="notebooks.08_merge_and_output.ipynb" name="Cell 1" time="2.0"/>
      <testcase classname="tests.test_steps" name="test_x" time="9.0"/>
    </testsuite></testsuites>""")
    assert checks.ci_runtimes(junit) == {"08_merge_and_output": 3.5}
    assert checks.ci_runtimes(None) == {}


def test_assignment_pages_are_the_students_version(built):
    """No model answer and no hidden test reaches the book."""
    for src in book.assignments():
        text = (built / "en" / "assignments" / f"{src.stem}.html").read_text(encoding="utf-8")
        assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text, src.stem
        assert "YOUR CODE HERE" in text, f"{src.stem}: no stub where the solution was"


def test_committed_notebooks_carry_the_state_of_every_widget_they_show():
    shown = 0
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        views = [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
                 for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
                 if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        state = nb["metadata"].get("widgets", {}).get(
            "application/vnd.jupyter.widget-state+json", {}).get("state", {})
        missing = [v for v in views if v not in state]
        assert not missing, f"{path.name}: widget views without saved state {missing}: run `make notebooks`"
        shown += len(views)
    assert shown >= 3  # the explorer (08, 16) and the training scrubber (10) at least


def test_anchor_links_follow_each_editions_headings():
    """A link to a section (JupyterLab's anchor) becomes the slug of that heading in each edition."""
    en = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T\n\n## The `logsumexp` merge")])
    zh = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T\n\n## `logsumexp` 合并")])
    anchors = {"12_x": book._anchor_map(en, zh)}
    text = "[a](12_x.ipynb#The-logsumexp-merge) [b](README.md#top) [c](https://x.org/y.md)"
    out = book._relink(text, "13_y", anchors, {"12_x.ipynb"}, "notebooks")
    assert "[a](12_x.ipynb#logsumexp-合并)" in out
    assert "/blob/main/notebooks/README.md#top)" in out and "[c](https://x.org/y.md)" in out


# In a browser ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(built):
    """The book over HTTP on localhost (as a reader's static host would serve it)."""
    handler = functools.partial(_QuietHandler, directory=str(built))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output readable
        pass


@pytest.fixture(scope="module")
def browser(server):
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not pathlib.Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def _open(browser, server, theme: str = "light"):
    """A page with the network cut: requests off localhost are refused and recorded, as are
    console errors, page errors and failed (4xx / 5xx) responses. `theme` is set before load."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"localStorage.setItem('mode', '{theme}'); localStorage.setItem('theme', '{theme}');")
    page = context.new_page()
    page.problems = []
    page.on("console", lambda m: page.problems.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))
    page.on("response", lambda r: page.problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    def route(r):
        if r.request.url.startswith(server) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            page.problems.append(f"network request off the site: {r.request.url}")
            r.abort()
    page.route("**/*", route)
    return page


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("lang", book.LANGS)
def test_book_in_chromium_the_explorer_lesson(server, browser, lang, theme):
    ARTIFACTS.mkdir(exist_ok=True)
    page = _open(browser, server, theme)
    page.goto(f"{server}/{lang}/index.html")
    page.click(f'nav a[href="{EXPLORER_LESSON}.html"]')  # follow the sidebar, as a reader would
    page.wait_for_url(f"**/{lang}/{EXPLORER_LESSON}.html")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("() => document.documentElement.dataset.theme") == theme
    title = page.title()
    assert title.startswith("08 · ") and (CJK.search(title) if lang == "zh_CN" else not CJK.search(title)), title
    # Maths: MathJax typesets every formula; none is left as raw TeX in the prose.
    page.wait_for_function("() => document.querySelectorAll('.MathJax').length > 10", timeout=60_000)
    raw = page.evaluate("() => Array.from(document.querySelectorAll('article p, article li'))"
                        ".filter(e => /\\\\\\(|\\$[^$\\s][^$]*\\$/.test(e.innerText)).length")
    assert raw == 0, f"{raw} paragraphs still show raw maths"
    # Heatmaps: the notebook's PNG outputs decode and have a size.
    sizes = page.evaluate("() => Array.from(document.querySelectorAll('.cell_output img'))"
                          ".map(i => [i.naturalWidth, i.naturalHeight])")
    assert len(sizes) >= 3 and all(w > 100 and h > 100 for w, h in sizes), sizes
    # The explorer from its saved state: its controls and its heatmap image.
    page.wait_for_selector(".widget-dropdown select", timeout=60_000)
    page.locator("img.widget-image").first.scroll_into_view_if_needed()
    page.wait_for_function("() => { const i = document.querySelector('img.widget-image');"
                           " return i && i.naturalWidth > 100; }", timeout=60_000)
    assert page.locator(".widget-slider").count() >= 3
    note = page.locator("article .admonition.note").first.inner_text()
    assert ("launch button" in note) if lang == "en" else ("启动按钮" in note), note  # sliders need a kernel
    # Launch buttons are links (nothing is fetched until a reader clicks one).
    assert page.locator('a[href*="mybinder.org"]').count() >= 1
    page.locator("article").first.scroll_into_view_if_needed()
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / f"book_{lang}_{theme}_{EXPLORER_LESSON}.png"))
    page.click('a.right-next')  # the next lesson, from the page's footer
    page.wait_for_url(f"**/{lang}/09_pytorch_port.html")
    page.wait_for_load_state("networkidle")
    assert page.problems == [], page.problems


@pytest.mark.parametrize("lang, query, expect", [
    ("en", "softmax", "06_softmax.html"),
    ("en", "PagedAttention", "18_serving.html"),
    ("zh_CN", "因果掩码", "05_causal_mask.html"),
    ("zh_CN", "写时复制", "18_serving.html"),
])
def test_book_in_chromium_search_works_offline(server, browser, lang, query, expect):
    """Sphinx's own index, in the page: jieba split the Chinese text into words at build time."""
    page = _open(browser, server)
    page.goto(f"{server}/{lang}/search.html?q={query}")
    page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0",
                           timeout=60_000)
    hits = page.evaluate("() => Array.from(document.querySelectorAll('#search-results li a'))"
                         ".map(a => a.getAttribute('href'))")
    assert any(h.split("?")[0].split("#")[0].endswith(expect) for h in hits), (query, hits[:10])
    if lang == "zh_CN":
        page.screenshot(path=str(ARTIFACTS / "book_zh_CN_search.png"))
    assert page.problems == [], page.problems


def test_book_in_chromium_checks_and_errata_pages(server, browser):
    page = _open(browser, server)
    for lang in book.LANGS:
        page.goto(f"{server}/{lang}/checks.html")
        page.wait_for_load_state("networkidle")
        assert page.locator("article table tbody tr").count() == len(LESSONS)
        page.goto(f"{server}/{lang}/errata.html")
        page.wait_for_load_state("networkidle")
        assert page.locator("article a[href$='.html']").count() >= 10  # each correction links its lesson
    assert page.problems == [], page.problems


def test_every_catalog_is_complete():
    """CI fails on an untranslated, fuzzy or invalid entry (here and in `make test`'s lint)."""
    bad = [s for s in i18n.stat() if not s.complete]
    assert not bad, [f"{s.domain}: {s.untranslated} untranslated, {s.fuzzy} fuzzy, {s.invalid} invalid"
                     for s in bad]
