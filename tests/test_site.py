"""The static site (`make site`): built offline, read in headless Chromium with the network cut.

`make test` builds the site into _site/ after the unit tests (so the checks page carries
this run's notebook runtimes) and runs this file with SITE_DIR=_site. Run alone, it builds
a site into a temporary folder first.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import pathlib
import re
import threading

import nbformat
import pytest

from tools import site

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / ".ci-reports"
EXPLORER_LESSON = "08_merge_and_output"  # the lesson that ends with the attention explorer


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """The site make built (SITE_DIR), or a fresh build in a temporary folder."""
    if os.environ.get("SITE_DIR"):
        out = pathlib.Path(os.environ["SITE_DIR"]).resolve()
        if not (out / "index.html").exists():
            raise AssertionError(f"SITE_DIR={out} holds no index.html: run `make site` first")
        return out
    out = tmp_path_factory.mktemp("site") / "site"
    site.build(out, progress=False)
    return out


# Without a browser ----------------------------------------------------------------------
def test_index_renders_the_readme_markdown():
    assert site.inline_markdown("divide by $\\sqrt{d_k}$ in `mha.steps` <b>") == \
        "divide by $\\sqrt{d_k}$ in <code>mha.steps</code> &lt;b&gt;"


def test_every_lesson_has_a_page_in_series_order(built):
    stems = [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    index = (built / "index.html").read_text()
    positions = [index.find(f'href="{s}.html"') for s in stems]
    assert all(p >= 0 for p in positions), f"index misses {[s for s, p in zip(stems, positions, strict=True) if p < 0]}"
    assert positions == sorted(positions), "index lists the lessons out of order"
    for s in stems:
        assert (built / f"{s}.html").exists(), f"no page for {s}"


def _link(page: str, rel: str) -> list[str]:
    """The hrefs of the <a rel=...> links of a page (attributes in either order)."""
    pattern = rf'<a (?:href="([^"]+)" rel="{rel}"|rel="{rel}" href="([^"]+)")'
    return [a or b for a, b in re.findall(pattern, page)]


def test_pages_link_to_neighbours_and_fold_answers(built):
    page = (built / f"{EXPLORER_LESSON}.html").read_text()
    assert _link(page, "prev") == ["07_weighted_sum.html"] * 2  # top and bottom bars
    assert _link(page, "next") == ["09_pytorch_port.html"] * 2
    assert "<summary>Show answer</summary>" in page  # the folded answer survives rendering
    assert 'id="widget-note"' in page  # the page says the sliders need a kernel
    first = (built / "00_overview.html").read_text()
    assert _link(first, "prev") == [] and _link(first, "next")[0].startswith("01_")
    assert "`" not in re.search(r"<title>(.*?)</title>", page).group(1)  # markdown stripped


def test_lessons_link_to_one_another_by_their_pages(built):
    """A lesson's link to another lesson's notebook becomes a link to that lesson's page."""
    seen = 0
    for page in sorted(built.glob("[0-9][0-9]_*.html")):
        text = page.read_text()
        assert not re.search(r'href="\d\d_[a-z0-9_]+\.ipynb', text), f"{page.name} links a .ipynb"
        for target in re.findall(r'href="(\d\d_[a-z0-9_]+\.html)', text):
            assert (built / target).exists(), f"{page.name} links {target}, which is not a page"
            seen += 1
    assert seen > 50, f"expected the lessons' cross-links on the pages, found {seen}"
    assert site.lesson_links('<a href="05_causal_mask.ipynb#x">') == '<a href="05_causal_mask.html#x">'


def test_no_page_loads_anything_from_the_network(built):
    for page in built.glob("*.html"):
        text = page.read_text()
        for cdn in ("cdnjs.cloudflare.com", "unpkg.com", "cdn.jsdelivr.net", "fonts.googleapis.com"):
            # inside a <script src=...> or <link href=...>: an asset the browser would fetch
            assert f'src="https://{cdn}' not in text and f'href="https://{cdn}' not in text, \
                f"{page.name} loads {cdn}"
        assert 'src="vendor/require.js"' in text or page.name in ("index.html", "checks.html")


def test_checks_page_is_generated_from_the_notebooks(built, tmp_path):
    page = (built / "checks.html").read_text()
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        found = site.notebook_checks(nb)
        assert f'<tr id="{nb.stem}">' in page
        assert (f'<td class="num">{found.total}</td><td class="num">{found.checked_cells}</td>'
                f'<td class="num">{found.asserts + found.raises}</td>') in page
    # The counts follow the code: a notebook with one more check counts one more.
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("checks.check_causal(f)\nif x:\n    raise AssertionError('no')\n"
                                  "assert y, 'why'"),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\n%matplotlib inline\nnp.testing.assert_allclose(a, b)"),
    ])
    nbformat.write(nb, tmp_path / "nb.ipynb")
    found = site.notebook_checks(tmp_path / "nb.ipynb")
    assert dict(found.calls) == {"checks.check_causal": 1, "np.testing.assert_allclose": 1}
    assert (found.raises, found.asserts, found.checked_cells, found.total) == (1, 1, 1, 4)


def test_runtimes_come_from_the_junit_report(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="notebooks.08_merge_and_output.ipynb" name="Cell 0" time="1.5"/>
      <testcase classname="notebooks.08_merge_and_output.ipynb" name="Cell 1" time="2.0"/>
      <testcase classname="tests.test_steps" name="test_x" time="9.0"/>
    </testsuite></testsuites>""")
    assert site.ci_runtimes(junit) == {"08_merge_and_output": 3.5}
    assert site.ci_runtimes(None) == {}


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


# In a browser ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(built):
    """The site over HTTP on localhost (as a reader's static host would serve it)."""
    handler = functools.partial(_QuietHandler, directory=str(built))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output readable
        pass


@pytest.fixture(scope="module")
def page_factory(server):
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not pathlib.Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])

        def new_page():
            """A page that records console errors and refuses every request off localhost."""
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.problems = []
            page.on("console", lambda m: page.problems.append(f"console: {m.text}")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))

            def route(r):
                if r.request.url.startswith(server) or r.request.url.startswith("data:"):
                    r.continue_()
                else:
                    page.problems.append(f"network request off the site: {r.request.url}")
                    r.abort()
            page.route("**/*", route)
            return page

        yield new_page
        browser.close()


def test_site_in_chromium_index_to_the_explorer_lesson(server, page_factory):
    ARTIFACTS.mkdir(exist_ok=True)
    page = page_factory()
    page.goto(f"{server}/index.html")
    assert page.title() == "Attention by Hand"
    assert page.locator("tbody tr").count() == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    # The table's markdown is rendered: code spans as <code>, $...$ typeset by MathJax.
    page.wait_for_function("() => document.querySelectorAll('tbody .MathJax').length > 0",
                           timeout=60_000)
    cells = page.locator("tbody").inner_text()
    assert "`" not in cells and "\\sqrt" not in cells, "the index shows raw markdown"
    assert page.locator("tbody code").count() >= 5
    page.screenshot(path=str(ARTIFACTS / "site_index.png"), full_page=True)

    page.click(f'a[href="{EXPLORER_LESSON}.html"]')  # follow the link, as a reader would
    page.wait_for_url(f"**/{EXPLORER_LESSON}.html")
    page.wait_for_load_state("networkidle")
    assert page.title().startswith("08 · Step 7: merge, project, and the whole module")
    # Math: MathJax typesets every $...$ into its own elements; none is left as raw TeX.
    page.wait_for_function("() => document.querySelectorAll('.MathJax').length > 10", timeout=60_000)
    raw = page.evaluate("() => Array.from(document.querySelectorAll('.jp-MarkdownOutput'))"
                        ".filter(e => /\\$[^$\\s][^$]*\\$/.test(e.innerText)).length")
    assert raw == 0, f"{raw} markdown cells still show raw $...$"
    # Heatmaps: the notebook's PNG outputs decode and have a size.
    sizes = page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output img'))"
                          ".map(i => [i.naturalWidth, i.naturalHeight])")
    assert len(sizes) >= 3 and all(w > 100 and h > 100 for w, h in sizes), sizes
    # The explorer from its saved state: its controls and its heatmap image.
    page.wait_for_selector(".widget-dropdown select", timeout=60_000)
    img = page.locator("img.widget-image").first
    img.scroll_into_view_if_needed()
    page.wait_for_function("() => { const i = document.querySelector('img.widget-image');"
                           " return i && i.naturalWidth > 100; }", timeout=60_000)
    assert page.locator(".widget-slider").count() >= 3
    assert "cannot move" in page.locator("#widget-note").inner_text()
    page.screenshot(path=str(ARTIFACTS / "site_08_explorer.png"))
    page.screenshot(path=str(ARTIFACTS / f"site_{EXPLORER_LESSON}.png"), full_page=True)

    page.click('nav.bottom a[rel="next"]')
    page.wait_for_url("**/09_pytorch_port.html")
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(ARTIFACTS / "site_09_pytorch_port.png"))
    assert page.problems == [], page.problems


def test_site_in_chromium_checks_page(server, page_factory):
    page = page_factory()
    page.goto(f"{server}/checks.html")
    page.wait_for_load_state("networkidle")
    assert page.locator("tbody tr").count() == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    page.screenshot(path=str(ARTIFACTS / "site_checks.png"), full_page=True)
    assert page.problems == [], page.problems
