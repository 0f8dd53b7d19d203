"""make's installer (tools/install.py): uv from the indexes pip is set up for, else pip."""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import install

LISTING = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/old-wheels'
global.index-url='https://mirror.example/simple'
freeze.all='true'
install.constraint='/etc/pip/constraints.txt'
:env:.find-links='/opt/wheels'
:env:.disable-pip-version-check='1'
:env:.default-timeout='180'
"""


def test_pip_settings_take_the_install_sections_with_the_environment_winning():
    settings = install.pip_settings(LISTING)
    assert settings["find-links"] == "/opt/wheels", "PIP_FIND_LINKS overrides the config file"
    assert settings["constraint"] == "/etc/pip/constraints.txt"
    assert "all" not in settings, "[freeze] settings are not pip install's"
    assert install.pip_settings("global.find_links='/w'") == {"find-links": "/w"}


def test_each_setting_becomes_the_uv_option_pip_would_have_used():
    options, env = install.uv_options(install.pip_settings(LISTING), ["-r", "requirements.txt"])
    pairs = list(zip(options, options[1:], strict=False))
    for flag, value in [("--extra-index-url", "file:///opt/pypi/simple"),
                        ("--extra-index-url", "file:///opt/pypi-more/simple"),
                        ("--find-links", "/opt/wheels"), ("--constraint", "/etc/pip/constraints.txt"),
                        ("--index-url", "https://mirror.example/simple"),
                        ("--index-strategy", "unsafe-best-match")]:
        assert (flag, value) in pairs, f"{flag} {value} missing from {options}"
    assert "/srv/old-wheels" not in options, "a lower-priority find-links is replaced, not added"
    assert "--compile-bytecode" in options, "pip compiles .pyc files; uv must too"
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}


def test_an_index_url_on_the_command_line_replaces_the_configured_one():
    options, _ = install.uv_options({"index-url": "https://mirror.example/simple"},
                                    ["--index-url", "https://download.pytorch.org/whl/cpu", "torch"])
    assert "https://mirror.example/simple" not in options, options


def test_a_setting_uv_cannot_take_is_named():
    with pytest.raises(ValueError, match=r"pip is set up with platform = 'win_amd64'"):
        install.uv_options({"platform": "win_amd64"}, [])


def test_a_bad_installer_is_refused_by_name():
    with pytest.raises(ValueError, match="installer must be auto or pip, got 'conda'"):
        install.install(["x"], "conda")


def _wheel(folder: Path, name: str = "abh_probe", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel, so the test needs no index."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": b"X = 1\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
                     for path, data in files.items()) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in {**files, f"{dist}/RECORD": record.encode()}.items():
            z.writestr(member, data)
    return path


def _dry_run(tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """install.py --dry-run of the probe wheel, with pip's own configuration switched off."""
    _wheel(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, **extra_env)
    return subprocess.run([sys.executable, install.__file__, "--dry-run", "--no-deps", "--no-index",
                           "--find-links", str(tmp_path), "abh_probe"],
                          capture_output=True, text=True, env=env, timeout=300)


def test_auto_installs_with_uv_when_pip_has_nothing_it_cannot_pass_on(tmp_path):
    run = _dry_run(tmp_path)
    assert run.returncode == 0, run.stderr
    assert "installing with pip" not in run.stderr, run.stderr
    assert "abh-probe==1.0" in run.stderr + run.stdout, "uv lists what it would install"


def test_a_setting_uv_cannot_take_falls_back_to_pip_and_says_why(tmp_path):
    run = _dry_run(tmp_path, PIP_PREFER_BINARY="1")
    assert run.returncode == 0, run.stderr
    assert "installing with pip: pip is set up with prefer-binary = '1'" in run.stderr, run.stderr
    assert "Would install abh_probe-1.0" in run.stdout, run.stdout
