"""Install requirements into this venv with uv where it can, from the indexes pip is set up for.

Standard library only: the Makefile runs this file with the venv's python before anything else
is installed, e.g. `python tools/install.py -r requirements.txt`. The arguments after our own
options are pip's and uv's common ones (-r FILE, --index-url URL, -q, requirement specs).

Why: on a 2-core machine pip took 3 min 8 s to install requirements-dev.txt from local wheels,
uv 31 s with an empty cache (48 s with bytecode compiled, as pip does). uv does not read pip's
configuration, so this file reads it (`pip config list`: files and PIP_* variables) and passes
each setting on as uv's option. A setting it cannot pass on, a missing uv that pip cannot fetch,
or a failed uv install falls back to pip, saying why. `--with pip` never tries uv.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from collections.abc import Sequence

# pip option -> uv option, one per value (pip splits these settings on whitespace).
LISTS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint",
         "trusted-host": "--allow-insecure-host"}
# pip option -> environment variable uv reads instead.
ENV = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT",
       "proxy": "HTTPS_PROXY"}
# pip options that change nothing about what is installed, or only pip's own output.
HARMLESS = {"disable-pip-version-check", "progress-bar", "no-cache-dir", "cache-dir", "quiet",
            "verbose", "no-input", "root-user-action", "no-warn-script-location", "retries",
            "require-virtualenv", "no-color", "break-system-packages", "no-python-version-warning",
            "config-file"}  # PIP_CONFIG_FILE: where the settings came from, read already
# Sections pip reads for `pip install`, lowest priority first (environment variables win).
SECTIONS = ("global", "install", ":env:")
UV_REQUIREMENT = "uv>=0.6,<1"


def pip_settings(listing: str) -> dict[str, str]:
    """The settings `pip install` uses, from `pip config list` output ("section.key='value'")."""
    by_section: dict[str, dict[str, str]] = {s: {} for s in SECTIONS}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not (sep and dot) or section not in by_section:
            continue  # another command's section (e.g. [freeze]) or a line that is no setting
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            value = value.strip("'\"")
        by_section[section][key.replace("_", "-")] = str(value)
    settings: dict[str, str] = {}
    for section in SECTIONS:
        settings.update(by_section[section])
    return settings


def uv_options(settings: dict[str, str], args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(uv options, environment) equal to pip's `settings`; ValueError names one uv can't take.

    An --index-url in `args` replaces the configured one, as it does for pip.
    """
    options = ["--compile-bytecode",  # pip writes .pyc files; without them every process compiles
               # pip takes the best version from any index; uv's default takes the first index
               # that has the package at all, so a local wheel mirror would hide newer releases.
               "--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    for key, value in settings.items():
        if key == "index-url" and any(a == "--index-url" or a.startswith("--index-url=")
                                      for a in args):
            continue
        if key in LISTS:
            for item in value.split():
                options += [LISTS[key], item]
        elif key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                options.append("--no-index")
        elif key in ENV:
            env[ENV[key]] = value
            if key == "proxy":
                env["HTTP_PROXY"] = value
        elif key not in HARMLESS:
            raise ValueError(f"pip is set up with {key} = {value!r}, which uv has no option for")
    return options, env


def _run(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run cmd with our environment plus `env`, and return its exit code."""
    return subprocess.run(cmd, env={**os.environ, **(env or {})}).returncode


def _pip(args: Sequence[str]) -> int:
    """pip install args, with its progress bar unless -q."""
    bar = [] if "-q" in args else ["--progress-bar", "on"]
    return _run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install", *bar, *args])


def _uv_ready() -> bool:
    """True once uv is importable in this venv (installing it with pip if need be)."""
    probe = [sys.executable, "-c", "import uv"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return True
    got = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "install",
                          "-q", UV_REQUIREMENT], capture_output=True, text=True)
    return got.returncode == 0


def install(args: Sequence[str], installer: str = "auto") -> int:
    """Install `args` with uv (auto) or pip, falling back to pip with the reason; exit code."""
    if installer not in ("auto", "pip"):
        raise ValueError(f"installer must be auto or pip, got {installer!r}")
    if installer == "pip":
        return _pip(args)
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True).stdout
    try:
        options, env = uv_options(pip_settings(listing), args)
    except ValueError as e:
        print(f"installing with pip: {e}", file=sys.stderr)
        return _pip(args)
    if not _uv_ready():
        print(f"installing with pip: pip could not install {UV_REQUIREMENT}", file=sys.stderr)
        return _pip(args)
    code = _run([sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable,
                 *options, *args], env)
    if code != 0:
        print(f"uv failed (exit {code}); trying pip", file=sys.stderr)
        return _pip(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse our own option, pass the rest to the installer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--with", dest="installer", default="auto", choices=("auto", "pip"),
                        help="auto: uv where it can, else pip (default); pip: pip only")
    ours, rest = parser.parse_known_args(argv)
    if not rest:
        parser.error("nothing to install: give -r FILE or requirement specs")
    return install(rest, ours.installer)


if __name__ == "__main__":
    sys.exit(main())
