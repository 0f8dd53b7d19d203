"""The series in a real JupyterLab, driven by headless Chromium: what a learner sees.

Needs Debian's chromium (`apt-get install -y chromium`; .ci/run installs it) and the
playwright package; no browser is downloaded.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

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
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(nb, root / nb.name)
    port = free_port()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
           "--expose-app-in-browser", "--LabApp.news_url=", "--allow-root"]
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

# The notebook model, not the DOM: JupyterLab only renders the cells near the viewport.
CODE_CELLS = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  const out = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type === 'code') out.push({count: c.executionCount, outputs: c.outputs.toJSON()});
  }
  return out;
}"""


def run_all(browser, lab: str, notebook: str):
    """Open a notebook in JupyterLab, clear it, run every cell; return (page, code cells)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{lab}/lab/tree/{notebook}?token={TOKEN}")
    page.wait_for_function(KERNEL_READY, timeout=90_000)
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
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_00_overview.png"))
    page.close()
