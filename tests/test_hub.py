"""The class hub (notebooks/assignments/hub/), driven by headless Chromium: what a student sees.

A local JupyterHub from the course's own jupyterhub_config.py (PAM login, LocalProcessSpawner,
configurable-http-proxy from hub/node_modules), on 127.0.0.1 with a private exchange; a Unix
user with a password logs in, gets JupyterLab with nbgrader's Assignments tab and none of
the teacher's tools, fetches A1 and submits it; the submission must land in the exchange's
inbound folder. A screenshot goes to .ci-reports/hub/.

Needs root (a Unix user; the hub spawns servers as that user), Debian's chromium and
configurable-http-proxy (`npm ci` in notebooks/assignments/hub; .ci/run does both).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import free_port
from tests.test_exchange import (
    COURSE_ID,
    HUB,
    NAME,
    ROOT,
    VENV_BIN,
    Laps,
    course,
    exchange_root,
    scratch,
    unix_users,
)
from tests.test_exchange import pytestmark as needs_root

CHROMIUM = "/usr/bin/chromium"
CHP = HUB / "node_modules" / ".bin" / "configurable-http-proxy"
ARTIFACTS = ROOT / ".ci-reports" / "hub"
STUDENT = "abh_hubstudent"
PASSWORD = "abh-hub-Secret-7"  # a throwaway account that exists only during this test

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [
    *needs_root,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} missing: apt-get install -y chromium"),
]

# JupyterLab's app (exposed with --LabApp.expose_app_in_browser): the nbgrader commands the
# page has. A disabled plugin never registers its command.
COMMANDS = """() => Object.fromEntries(['nbgrader:open-assignment-list', 'nbgrader:open-course-list',
  'nbgrader:open-formgrader', 'nbgrader:open-formgrader-local', 'nbgrader:open-create-assignment']
  .map(c => [c, window.jupyterapp.commands.hasCommand(c)]))"""


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Wait until url answers 200, or fail with the log if proc exits.

    Any status is not enough: the proxy answers 404 until the hub has added its route, and a
    browser sent to /hub/login in that gap gets the 404 page (a CI run failed that way)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused, or an HTTPError such as the proxy's 404
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"jupyterhub exited ({proc.returncode}):\n"
                               + log.read_text()[-6000:])
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout} s:\n" + log.read_text()[-6000:])


def _spawned_pids(db: Path) -> list[int]:
    """PIDs of the single-user servers the hub started (from its database)."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute("SELECT state FROM spawners").fetchall()
    return [json.loads(s)["pid"] for (s,) in rows if s and json.loads(s).get("pid")]


@contextlib.contextmanager
def hub(base: Path, exchange: Path, uid: int) -> Iterator[tuple[str, str]]:
    """The course's jupyterhub_config.py plus test overrides; yields (url, auth used)."""
    state = base / "state"
    state.mkdir()
    port, hub_port, api_port = free_port(), free_port(), free_port()
    # PAM needs the `login` PAM service (Debian's login package); else the hub's dummy
    # authenticator with a password, same users and spawner.
    pam = Path("/etc/pam.d/login").exists()
    auth = "pam" if pam else "dummy"
    overrides = f"""
c = get_config()  # noqa: F821
load_subconfig({str(HUB / "jupyterhub_config.py")!r})  # noqa: F821
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
c.ConfigurableHTTPProxy.pid_file = {str(state / "proxy.pid")!r}
c.JupyterHub.db_url = "sqlite:///{state / "jupyterhub.sqlite"}"
c.JupyterHub.cookie_secret_file = {str(state / "cookie_secret")!r}
c.JupyterHub.pid_file = {str(state / "jupyterhub.pid")!r}
c.JupyterHub.cleanup_servers = True
c.JupyterHub.authenticator_class = {auth!r}
c.PAMAuthenticator.allowed_groups = set()
c.PAMAuthenticator.admin_groups = set()
c.Authenticator.allowed_users = {{{STUDENT!r}}}
c.DummyAuthenticator.password = {PASSWORD!r}
c.Spawner.environment["NBGRADER_EXCHANGE_ROOT"] = {str(exchange)!r}
c.Spawner.args = ["--LabApp.expose_app_in_browser=True"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
"""
    config = state / "jupyterhub_config.py"
    config.write_text(overrides)
    log = state / "jupyterhub.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(VENV_BIN / "jupyterhub"), "-f", str(config)], cwd=state,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PATH": os.pathsep.join(
                                    [str(VENV_BIN), os.environ.get("PATH", "/usr/bin:/bin")])})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/hub/api", proc, log)
        yield url, auth
    except BaseException:
        print(log.read_text()[-6000:])
        raise
    finally:
        pids = _spawned_pids(state / "jupyterhub.sqlite")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the hub stops the servers and the proxy
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for pid in pids:  # a server the hub could not stop: only ours, by its pid
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    os.kill(pid, signal.SIGKILL)


def test_student_sees_only_the_assignments_tab_fetches_and_submits(record_property):
    lap = Laps(record_property)

    assert CHP.exists(), f"{CHP} missing: run `npm ci` in {HUB} (.ci/run does)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with scratch("abh-hub-") as base, unix_users([STUDENT], base) as users:
        student = users[STUDENT]
        subprocess.run(["chpasswd"], input=f"{STUDENT}:{PASSWORD}\n", text=True, check=True,
                       capture_output=True, timeout=60)
        exchange = exchange_root(base)
        # The teacher (root here) releases A1 while the hub and the browser start.
        teacher = base / "teacher"
        teacher.mkdir()
        root = course.private_copy(teacher, [NAME])
        env = {**os.environ, "NBGRADER_EXCHANGE_ROOT": str(exchange),
               "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "/usr/bin:/bin")])}
        released: list[BaseException | None] = []

        def release() -> None:
            try:
                for cmd in ([sys.executable, "course.py", "release", NAME],
                            [str(VENV_BIN / "nbgrader"), "release_assignment", NAME]):
                    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                                       timeout=600)
                    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
                released.append(None)
            except BaseException as e:  # re-raised in the test's thread
                released.append(e)

        releaser = threading.Thread(target=release, daemon=True)
        releaser.start()
        lap("user")

        with hub(base, exchange, student.uid) as (url, auth), \
                playwright.sync_playwright() as p:
            record_property("hub_auth", auth)
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-sync"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(90_000)
                lap("hub+browser")

                # Log in; the hub spawns the student's server and sends them to /lab.
                page.goto(f"{url}/hub/login")
                page.fill("input[name=username]", STUDENT)
                page.fill("input[name=password]", PASSWORD)
                page.click("input[type=submit], button[type=submit]")
                page.wait_for_url(f"**/user/{STUDENT}/lab**", timeout=150_000)
                page.wait_for_function("() => !!window.jupyterapp && "
                                       "!!document.querySelector('#jp-main-dock-panel')")
                page.wait_for_selector(".lm-MenuBar-item:has-text('Nbgrader')")
                lap("login+spawn+lab")

                # Only the student's side of nbgrader: its commands, its menu, its server.
                commands = page.evaluate(COMMANDS)
                assert commands == {"nbgrader:open-assignment-list": True,
                                    "nbgrader:open-course-list": False,
                                    "nbgrader:open-formgrader": False,
                                    "nbgrader:open-formgrader-local": False,
                                    "nbgrader:open-create-assignment": False}, commands
                page.click(".lm-MenuBar-item:has-text('Nbgrader')")
                menu = page.locator("#jp-mainmenu-nbgrader")
                menu.wait_for()
                items = menu.locator(".lm-Menu-item:not(.lm-mod-hidden) .lm-Menu-itemLabel")
                assert items.all_inner_texts() == ["Assignment List"], items.all_inner_texts()
                server = f"{url}/user/{STUDENT}"
                ok = page.request.get(f"{server}/nbgrader_version?version=0.9.6")  # the student's
                assert ok.status == 200, f"/nbgrader_version answers {ok.status}"
                for path in ("formgrader", "formgraders"):  # the teacher's server extensions
                    status = page.request.get(f"{server}/{path}").status
                    assert status == 404, f"/{path} answers {status} for a student"

                # The release must be out before the student looks for it.
                releaser.join(timeout=600)
                assert released, "the release did not finish"
                if released[0] is not None:
                    raise released[0]
                lap("checks (+release)")

                items.first.click()  # Assignment List -> the Assignments tab
                fetch = page.locator("#released_assignments_list button", has_text="Fetch")
                fetch.wait_for()
                assert NAME in page.locator("#released_assignments_list").inner_text()
                fetch.click()
                submit = page.locator("#fetched_assignments_list button", has_text="Submit")
                submit.wait_for()
                assert (student.home / NAME / f"{NAME}.ipynb").exists(), "fetch wrote nothing"
                submit.click()
                page.locator("#submitted_assignments_list .list_item",
                             has_text=NAME).first.wait_for()
                page.screenshot(path=str(ARTIFACTS / "student-assignments.png"))
                lap("fetch+submit")
            except BaseException:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / "failure.png"))
                raise
            finally:
                browser.close()

        inbound = exchange / COURSE_ID / "inbound"
        got = sorted(inbound.glob(f"{STUDENT}+{NAME}+*/{NAME}.ipynb"))
        assert len(got) == 1, f"inbound holds {sorted(inbound.iterdir())}"
        assert got[0].stat().st_uid == student.uid, "the submission is not the student's own"
        lap("stop")

    lap.report(f"hub, one student ({auth})")
