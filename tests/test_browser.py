"""The series in a real JupyterLab, driven by headless Chromium: what a learner sees.

Needs Debian's chromium (`apt-get install -y chromium`; .ci/run installs it) and the
playwright package; no browser is downloaded.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from tests.lab import TOKEN, free_port, running

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / ".ci-reports"

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(not pathlib.Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} missing: apt-get install -y chromium")



@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab on a scratch copy of notebooks/ (so autosave never touches the real ones)."""
    root = tmp_path_factory.mktemp("lab")
    state = tmp_path_factory.mktemp("lab-state")  # workspaces and settings of this server only
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(nb, root / nb.name)
    # As `make lab` does: trust our own notebooks, so JupyterLab renders their rich outputs
    # (the live widget rather than its static PNG fallback).
    subprocess.run([sys.executable, "-m", "jupyter", "trust", *map(str, root.glob("*.ipynb"))],
                   check=True, capture_output=True)
    port = free_port()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
           "--expose-app-in-browser", f"--LabApp.workspaces_dir={state}",
           f"--LabApp.user_settings_dir={state}", "--allow-root"]
    with running(cmd, port, cwd=str(root)):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


KERNEL_READY = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""

WIDGETS_READY = """() => window.jupyterapp.shell.currentWidget.content.rendermime
  .mimeTypes.includes('application/vnd.jupyter.widget-view+json')"""

# The notebook model, not the DOM: JupyterLab only renders the cells near the viewport.
CODE_CELLS = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  const out = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type === 'code') out.push({count: c.executionCount, trusted: c.trusted, outputs: c.outputs.toJSON()});
  }
  return out;
}"""


def run_all(browser, lab: str, notebook: str):
    """Open a notebook in JupyterLab, clear it, run every cell; return (page, code cells)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    # A workspace of its own, reset: no tabs restored from an earlier page, one kernel.
    page.goto(f"{lab}/lab/workspaces/{pathlib.Path(notebook).stem}/tree/{notebook}?reset&token={TOKEN}")
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    # The widgets extension loads asynchronously; outputs rendered before it registers
    # its renderer fall back to their static PNG for good, so wait for it first.
    page.wait_for_function(WIDGETS_READY, timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    assert all(c["count"] is None for c in page.evaluate(CODE_CELLS))
    # Fire and forget: the command's promise can outlive the run, so do not await it.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.wait_for_function(
        f"() => ({CODE_CELLS})().every(c => c.count !== null) && ({KERNEL_READY})()",
        timeout=240_000)
    return page, page.evaluate(CODE_CELLS)


def errors_in(cells: list[dict]) -> list[str]:
    """Error outputs (exceptions) the notebook showed, as 'Name: message'."""
    return [f"{o['ename']}: {o['evalue']}" for c in cells for o in c["outputs"]
            if o["output_type"] == "error"]


def mime_count(cells: list[dict], mime: str) -> int:
    """How many outputs carry the given MIME type (e.g. image/png)."""
    return sum(mime in o.get("data", {}) for c in cells for o in c["outputs"])


def test_overview_runs_in_jupyterlab(browser, lab):
    page, cells = run_all(browser, lab, "00_overview.ipynb")
    assert errors_in(cells) == []
    assert [c["count"] for c in cells] == list(range(1, len(cells) + 1))
    assert mime_count(cells, "image/png") >= 1  # the pipeline diagram
    texts = " ".join(o.get("text", "") for c in cells for o in c["outputs"])
    assert "1,050,624" in texts and "bit-identical" in texts
    # A student's JupyterLab shows no grading tools: nbgrader is installed (make test needs
    # it) but its extension is disabled; the widgets extension is the positive control.
    plugins = page.evaluate("""() => ({
      nbgrader: window.jupyterapp.hasPlugin('@jupyter/nbgrader:menu'),
      widgets: window.jupyterapp.hasPlugin('@jupyter-widgets/jupyterlab-manager:plugin')})""")
    assert plugins == {"nbgrader": False, "widgets": True}, plugins
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_00_overview.png"))
    page.close()


SCROLL_TO = """src => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const cells = nb.model.cells;
  for (let i = 0; i < cells.length; i++) {
    if (cells.get(i).sharedModel.getSource().includes(src)) {
      nb.activeCellIndex = i;
      return nb.scrollToItem(i, 'start').then(() => i);
    }
  }
  return -1;
}"""


def wait_for_new_picture(page, before: str) -> None:
    """Wait until the explorer's image differs from `before` (its old data URL)."""
    page.wait_for_function(
        "s => Array.from(document.querySelectorAll('img.widget-image')).pop().src !== s",
        arg=before, timeout=60_000)


def test_explorer_sliders_redraw_in_jupyterlab(browser, lab):
    """Tick 'causal' and move the temperature slider: the picture and the caption follow."""
    ARTIFACTS.mkdir(exist_ok=True)
    page, cells = run_all(browser, lab, "08_merge_and_output.ipynb")
    assert errors_in(cells) == []
    img = page.locator("img.widget-image").last
    # JupyterLab renders only cells near the viewport and widget views render
    # asynchronously, so scroll to the explorer's cell until its picture exists.
    deadline = time.monotonic() + 90
    while page.locator("img.widget-image").count() == 0:
        if time.monotonic() > deadline:
            page.screenshot(path=str(ARTIFACTS / "browser_08_no_widget.png"))
            keys = [list(o.get("data", {})) for c in page.evaluate(CODE_CELLS) for o in c["outputs"]
                    if "explorer" in str(o.get("data", {}).get("text/plain", ""))]
            raise AssertionError(f"the explorer widget never rendered; outputs {keys}; "
                                 f"widgets ready: {page.evaluate(WIDGETS_READY)}; "
                                 f"trusted: {[c['trusted'] for c in page.evaluate(CODE_CELLS)]}")
        assert page.evaluate(SCROLL_TO, "explorer(d_model=16") >= 0
        page.wait_for_timeout(1000)
    img.scroll_into_view_if_needed()
    img.wait_for(state="visible", timeout=30_000)
    caption = page.locator(".widget-html-content").last
    # The caption is a second widget view; it may render a moment after the picture.
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.widget-html-content')).pop()"
        ".textContent.includes('causal on')", timeout=60_000)
    before = img.get_attribute("src")

    page.locator(".widget-checkbox input").last.click()  # causal off
    wait_for_new_picture(page, before)
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.widget-html-content')).pop()"
        ".textContent.includes('changed: causal True -> False')", timeout=60_000)
    assert "causal off" in caption.inner_text()

    before = img.get_attribute("src")
    handle = page.locator(".widget-hslider .noUi-handle").last  # temperature: the last slider
    handle.focus()
    # One step: each value change redraws and the caption names the last change only, so
    # after several presses "temperature 1 ->" would be visible for a moment at most.
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.widget-html-content')).pop()"
        ".textContent.includes('changed: temperature 1 ->')", timeout=60_000)
    wait_for_new_picture(page, before)

    before = img.get_attribute("src")  # the mask / bias selector: the last dropdown
    page.locator(".widget-dropdown select").last.select_option(label="sliding window")
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.widget-html-content')).pop()"
        ".textContent.includes('changed: pattern none -> window')", timeout=60_000)
    wait_for_new_picture(page, before)
    assert "sliding window: each query sees keys at most 2 positions away" in caption.inner_text()
    page.screenshot(path=str(ARTIFACTS / "browser_08_explorer.png"))
    page.close()
