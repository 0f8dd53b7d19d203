"""The repository's promises: README lists every notebook, and `make lab` serves the series."""

import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_readme_and_overview_list_every_notebook():
    readme = (ROOT / "README.md").read_text()
    overview = (ROOT / "notebooks" / "00_overview.ipynb").read_text()
    assert NOTEBOOKS, "no notebooks found"
    for stem in NOTEBOOKS:
        assert f"`{stem}`" in readme, f"README does not list {stem}"
        assert f"`{stem}`" in overview, f"00_overview does not list {stem}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_notebooks():
    port, token = _free_port(), "ci-check-token"
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"PORT={port}", f"LAB_ARGS=--IdentityProvider.token={token}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents?token={token}"
        deadline, listing = time.time() + 90, None
        while time.time() < deadline and listing is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    listing = json.load(r)
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.5)
        assert listing is not None, "JupyterLab did not answer within 90 s"
        served = {item["name"] for item in listing["content"]}
        assert {f"{stem}.ipynb" for stem in NOTEBOOKS} <= served
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
