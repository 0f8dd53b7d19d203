"""Start a JupyterLab server for tests and wait until it answers."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence

TOKEN = "ci-check-token"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(cmd: Sequence[str], port: int, cwd: str, timeout: float = 90) -> Iterator[dict]:
    """Run a Jupyter server command; yield its root listing once the API answers."""
    # Log to a file, not a pipe: an unread pipe fills up and freezes the server.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/api/contents?token={TOKEN}"
        deadline, listing = time.time() + timeout, None
        while time.time() < deadline and listing is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    listing = json.load(r)
            except OSError:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError("server exited:\n" + log.read().decode()) from None
                time.sleep(0.5)
        if listing is None:
            raise TimeoutError(f"Jupyter server did not answer within {timeout} s")
        yield listing
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()
