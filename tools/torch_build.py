"""Which torch wheel `make lab` installs: PyPI's default build or the CPU-only one.

Standard library only: the Makefile runs this file with the venv's python before anything
else is installed (`python tools/torch_build.py --cpu auto --pin torch==2.13.0`). It prints
`cpu` or `default` on stdout and the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path


def nvidia_present() -> bool:
    """True where an NVIDIA driver is installed (nvidia-smi on PATH or the kernel module loaded)."""
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia/version").exists()


def installed_version(name: str = "torch") -> str | None:
    """The version of `name` installed in this interpreter, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def default_resolution(pin: str, python: str = sys.executable) -> str | None:
    """The version pip's configured indexes give for `pin` (e.g. '2.13.0+cpu'), or None if unknown.

    A dry run with --no-deps: on PyPI it fetches only the wheel's metadata.
    """
    cmd = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
           "--quiet", "--report", "-", pin]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        return json.loads(run.stdout)["install"][0]["metadata"]["version"]
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError):
        return None


def choose(cpu: str, system: str, nvidia: bool, installed: str | None, pin: str,
           resolve: Callable[[], str | None]) -> tuple[bool, str]:
    """(use the CPU index?, why) for CPU=1, CPU=0 or CPU=auto on this machine."""
    if cpu not in ("0", "1", "auto"):
        raise ValueError(f"CPU must be 0, 1 or auto, got {cpu!r}")
    if cpu == "1":
        return True, "CPU=1 asks for the CPU-only wheel"
    if cpu == "0":
        return False, "CPU=0 asks for the default wheel from your package index"
    wanted = pin.split("==", 1)[-1]
    if installed is not None and installed.split("+")[0] == wanted:
        return False, f"torch {installed} is already installed (CPU=1 or CPU=0 to change build)"
    if system != "Linux":
        return False, f"{system}: PyPI's torch wheels are CPU (and MPS) builds already"
    if nvidia:
        return False, "an NVIDIA driver is present: PyPI's CUDA build (CPU=1 for the CPU-only wheel)"
    version = resolve()
    if version is not None and version.endswith("+cpu"):
        return False, f"your package index already gives the CPU build {version}"
    return True, ("Linux without an NVIDIA driver: the CPU-only wheel, a few hundred MB instead of "
                  "several GB (CPU=0 for PyPI's CUDA build)")


def main(argv: list[str] | None = None) -> int:
    """Print cpu or default for the Makefile, and why on stderr."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", default="auto", help="0, 1 or auto (the Makefile's CPU=)")
    parser.add_argument("--pin", required=True, help="the torch requirement, e.g. torch==2.13.0")
    args = parser.parse_args(argv)
    use_cpu, why = choose(args.cpu, platform.system(), nvidia_present(), installed_version(),
                          args.pin, lambda: default_resolution(args.pin))
    print("cpu" if use_cpu else "default")
    print(f"torch build: {'CPU-only' if use_cpu else 'default'} ({why})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
