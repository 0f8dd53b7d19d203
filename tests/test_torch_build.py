"""make lab's choice of torch build (tools/torch_build.py), for each kind of machine."""

import subprocess
import sys

import pytest

from tools import torch_build

PIN = "torch==2.13.0"


def _choose(cpu="auto", system="Linux", nvidia=False, installed=None, resolved="2.13.0"):
    return torch_build.choose(cpu, system, nvidia, installed, PIN, lambda: resolved)[0]


def test_linux_without_a_gpu_gets_the_cpu_wheel_and_the_others_do_not():
    assert _choose() is True  # a laptop: PyPI would give the CUDA build
    assert _choose(nvidia=True) is False
    assert _choose(system="Darwin") is False
    assert _choose(resolved="2.13.0+cpu") is False  # our machines: the local wheel is a CPU build
    assert _choose(resolved=None) is True  # offline dry run: the laptop rule still holds
    assert _choose(installed="2.13.0+cpu") is False  # nothing to install


def test_the_override_wins_everywhere():
    for system, nvidia in (("Linux", False), ("Linux", True), ("Darwin", False)):
        assert _choose("1", system, nvidia, resolved="2.13.0+cpu") is True
        assert _choose("0", system, nvidia) is False


def test_a_bad_flag_is_refused_by_name():
    with pytest.raises(ValueError, match="CPU must be 0, 1 or auto, got 'yes'"):
        _choose("yes")


def test_the_script_prints_one_word_and_says_why():
    run = subprocess.run([sys.executable, torch_build.__file__, "--cpu", "1", "--pin", PIN],
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "cpu" and "CPU=1" in run.stderr
