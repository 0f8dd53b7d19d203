"""make gpu-check's plumbing (benchmarks/gpu_check.py), on a CPU: CUDA faked, the steps stubbed.

What needs the GPU itself (the tests, lessons and benchmarks it runs) runs only there; here we
check what it decides: whether to run at all, which steps in which order with which budgets,
which tests and lessons it picks, what it records, and that a failing or hanging step neither
stops the others nor passes unnoticed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc
_spec.loader.exec_module(gc)

STEPS = ["cuda-tests", "gpu-lessons", "sdpa-bench", "triton-bench"]
FAKE = {"python": "3.11.7", "executable": "/opt/py/bin/python", "torch": "2.13.0+cu130",
        "torch_cuda": "13.0", "cuda_available": True, "gpu": "NVIDIA H200", "gpu_count": 1,
        "capability": "sm_90", "gpu_memory_gib": 139.8, "cudnn": 91002,
        "modules": {"torch": "2.13.0+cu130", "triton": "3.6.0", "numpy": "2.4.0",
                    "pytest": "9.0", "xdist": "3.8", "nbval": "0.11.0", "hypothesis": "6.140",
                    "matplotlib": "3.11", "tqdm": "4.67", "mha": "0.1"},
        "mha_path": str(ROOT / "src" / "mha"), "c_compiler": "/usr/bin/cc", "python_h": True}
JUNIT = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_broken"><failure message="boom"/></testcase>
<testcase classname="tests.test_b" name="test_two_gpus"><skipped message="needs CUDA: 2 GPUs"/></testcase>
</testsuite></testsuites>"""


class Stub:
    """A step runner that runs nothing: records each call, writes what the step would write."""

    def __init__(self, root: Path, fail: tuple[str, ...] = ()):
        self.calls: list[tuple[str, float]] = []
        self.root, self.fail = root, fail

    def __call__(self, step, timeout_s, log):
        self.calls.append((step.name, timeout_s))
        log.write_text(f"ran {step.name}\n")
        if step.junit:
            (log.parent / step.junit).write_text(JUNIT)
        for src, _ in step.copies:
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text("# Triton kernel vs SDPA flash\n")
        return gc.Ran(1 if step.name in self.fail else 0, 0.01, False)


def _fake_run(tmp_path, monkeypatch, fail=(), argv=()):
    monkeypatch.setattr(gc, "nvidia_smi", lambda: ("NVIDIA-SMI 580.159.03\n",
                                                   {"driver": "580.159.03", "smi_gpu": "NVIDIA H200"}))
    out, said = tmp_path / "out", []
    stub = Stub(tmp_path / "root", fail)
    rc = gc.main(["--out-dir", str(out), *argv], probe_fn=lambda python: dict(FAKE),
                 runner=stub, driver=lambda: True, say=said.append, root=stub.root)
    return rc, out, stub, "\n".join(said)


def test_without_a_driver_it_says_so_exits_0_and_runs_nothing(tmp_path):
    def never(*a, **k):
        raise AssertionError("nothing may run without CUDA")

    said = []
    rc = gc.main(["--out-dir", str(tmp_path / "out")], probe_fn=never, runner=never,
                 driver=lambda: False, say=said.append)
    assert rc == 0 and "no CUDA here" in said[0] and "nothing was run" in said[0]
    assert not (tmp_path / "out").exists(), "no results folder without a GPU"
    assert gc.main(["--preflight"], driver=lambda: False, say=said.append) == gc.NO_DRIVER_EXIT
    assert gc.main(["--preflight"], driver=lambda: True, say=said.append) == 0


def test_make_gpu_check_without_cuda_exits_0_before_installing_anything(tmp_path):
    venv = tmp_path / "venv"  # a venv that does not exist: an install would create it
    env = {**os.environ, gc.FORCE_ENV: "none"}
    run = subprocess.run(["make", "-s", "gpu-check", f"VENV={venv}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no CUDA here" in run.stdout and "nothing was run" in run.stdout
    assert not venv.exists(), "make gpu-check started an install on a machine without CUDA"


def test_with_cuda_it_runs_every_step_in_order_within_the_budget(tmp_path, monkeypatch):
    rc, out, stub, said = _fake_run(tmp_path, monkeypatch)
    assert rc == 0, said
    assert [name for name, _ in stub.calls] == STEPS
    steps = gc.plan(sys.executable, out, gc.gpu_lessons(), gc.cuda_test_files())
    assert sum(s.timeout_s for s in steps) <= gc.BUDGET_S, "every step at its timeout fits 8 min"
    assert all(t <= s.timeout_s for (_, t), s in zip(stub.calls, steps, strict=True))
    for n, name in enumerate(STEPS, 1):
        assert f"[{n}/4] {name}" in said, f"no progress line for {name}"
    assert "4 of 4 steps passed" in said and "warning" not in said
    assert (out / "triton_flash.md").exists(), "the Triton table is kept with the results"
    versions = json.loads((out / "versions.json").read_text())
    assert versions["driver"] == "580.159.03" and versions["cudnn"] == 91002


def test_the_summary_names_versions_steps_failures_and_skips(tmp_path, monkeypatch):
    rc, out, _, said = _fake_run(tmp_path, monkeypatch, fail=("gpu-lessons",))
    assert rc == 1, "a failed step makes the whole check fail"
    assert "FAILED: gpu-lessons" in said
    text = (out / "summary.md").read_text()
    assert "**FAILED: gpu-lessons (failed)**" in text
    for fact in ("NVIDIA H200", "sm_90", "580.159.03", "| CUDA of torch (torch.version.cuda) | 13.0 |",
                 "| cuDNN (torch.backends.cudnn.version()) | 91002 |", "| torch | 2.13.0+cu130 |",
                 "| triton | 3.6.0 |"):
        assert fact in text, f"summary.md lacks {fact!r}"
    cells = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")]
    results = {c[1]: c[3] for c in cells if len(c) > 3 and c[1] in STEPS}  # step -> result
    assert results["gpu-lessons"].startswith("failed"), results
    assert results["sdpa-bench"] == "passed" and results["triton-bench"] == "passed", \
        "the steps after a failure still ran"
    assert "(1 passed, 1 failed, 1 skipped)" in results["cuda-tests"]
    assert "- FAILED tests.test_a::test_broken" in text
    assert "- skipped tests.test_b::test_two_gpus: needs CUDA: 2 GPUs" in text


def test_a_missing_c_compiler_is_warned_about_before_triton_fails(tmp_path, monkeypatch):
    monkeypatch.setitem(FAKE, "c_compiler", None)
    rc, _, _, said = _fake_run(tmp_path, monkeypatch)
    assert rc == 0 and "warning: Triton builds a small C launcher" in said and "gcc" in said


def test_only_reruns_the_named_steps_and_refuses_unknown_names(tmp_path, monkeypatch):
    rc, _, stub, _ = _fake_run(tmp_path, monkeypatch, argv=("--only", "sdpa-bench"))
    assert rc == 0 and [n for n, _ in stub.calls] == ["sdpa-bench"]
    rc, _, stub, said = _fake_run(tmp_path, monkeypatch, argv=("--only", "sdpa"))
    assert rc == 2 and stub.calls == [] and "no step named ['sdpa']" in said


def test_a_torch_without_cuda_beside_a_driver_is_explained_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "nvidia_smi", lambda: ("", {}))
    cpu_build = {**FAKE, "torch": "2.13.0+cpu", "torch_cuda": None, "cuda_available": False}
    said = []
    rc = gc.main(["--out-dir", str(tmp_path)], probe_fn=lambda p: cpu_build,
                 runner=Stub(tmp_path), driver=lambda: True, say=said.append)
    assert rc == 1 and "CPU-only build" in said[-1] and "make clean && make gpu-check" in said[-1]
    assert "Not run" in (tmp_path / "summary.md").read_text()


def test_a_hanging_step_is_killed_at_its_timeout_and_the_next_ones_run(tmp_path):
    sh = ("sh", "-c")
    steps = [gc.Step("ok", "echo", (*sh, "echo fine"), 10, 1),
             gc.Step("hangs", "sleep", (*sh, "echo started; sleep 30"), 0.5, 1),
             gc.Step("fails", "exit 2", (*sh, "exit 2"), 10, 1),
             gc.Step("after", "echo", (*sh, "echo still ran"), 10, 1)]
    said = []
    start = time.monotonic()
    outcomes = gc.run_steps(steps, tmp_path, lambda s, t, log: gc.run_streaming(
        s.cmd, t, log, echo=lambda line: None), budget_s=60, modules={}, say=said.append)
    assert time.monotonic() - start < 8, "the sleep was not cut at its timeout"
    assert [o.status for o in outcomes] == ["passed", "timed out", "failed", "passed"]
    assert outcomes[2].rc == 2 and outcomes[1].rc is None
    log = (tmp_path / "hangs.log").read_text()
    assert "started" in log and "killed after its timeout" in log
    assert (tmp_path / "after.log").read_text() == "still ran\n"


def test_the_total_budget_cuts_a_step_short_and_skips_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "MIN_STEP_S", 0.5)  # 5 s in a real run
    steps = [gc.Step("long", "sleep", ("sleep", "30"), 100, 1),
             gc.Step("never", "echo", ("echo", "hi"), 100, 1)]
    outcomes = gc.run_steps(steps, tmp_path, lambda s, t, log: gc.run_streaming(
        s.cmd, t, log, echo=lambda line: None), budget_s=1.0, modules={}, say=lambda m: None)
    assert [o.status for o in outcomes] == ["timed out", "not run"]
    assert outcomes[1].note == "the total budget was spent"


def test_a_step_whose_modules_are_missing_is_not_run_and_counts_as_failed(tmp_path):
    step = gc.Step("gpu-lessons", "nbval", ("false",), 10, 1, needs=("pytest", "nbval"))
    called = []
    out = gc.run_steps([step], tmp_path, lambda *a: called.append(a), 10,
                       modules={"pytest": "9", "nbval": None}, say=lambda m: None)
    assert called == [] and out[0].status == "not run" and "nbval" in out[0].note


def test_no_cuda_test_or_gpu_lesson_found_fails_rather_than_running_the_whole_suite(tmp_path):
    steps = gc.plan("python", tmp_path, lessons=[], test_files=[])
    assert [s.cmd for s in steps[:2]] == [(), ()]
    out = gc.run_steps(steps[:2], tmp_path, lambda *a: pytest.fail("ran an empty step"), 10,
                       modules={}, say=lambda m: None)
    assert [(o.status, o.note) for o in out] == [("failed", "found nothing to run")] * 2


def test_a_pytest_step_that_ran_no_test_fails(tmp_path):
    step = gc.Step("cuda-tests", "pytest", ("true",), 10, 1, junit="cuda-tests.xml")

    def runner(s, t, log):
        (tmp_path / "cuda-tests.xml").write_text("<testsuites><testsuite/></testsuites>")
        return gc.Ran(0, 0.1, False)

    out = gc.run_steps([step], tmp_path, runner, 10, modules={}, say=lambda m: None)
    assert out[0].status == "failed" and out[0].note == "no test ran"


def test_the_plugin_keeps_cuda_tests_and_the_triton_file_only(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (tests / "test_mixed.py").write_text(
        "import pytest\n"
        "GPU = pytest.mark.skipif(True, reason='needs CUDA: a GPU')\n"
        "def test_cpu():\n    x = 'cuda'  # names cuda only in a string\n"
        "@GPU\ndef test_marked():\n    pass\n"
        "@pytest.mark.parametrize('dev', ['cpu', pytest.param('gpu', marks=GPU)])\n"
        "def test_param(dev):\n    pass\n"
        "def test_counts_gpus(torch=None):\n    n = torch.cuda.device_count()\n"
        "@pytest.mark.skipif(True, reason='needs root')\ndef test_other_skip():\n    pass\n")
    (tests / "test_triton_flash.py").write_text("def test_any():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "tests", "-p", "gpu_check",
                          "-p", "no:cacheprovider", "--collect-only", "-q"], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "benchmarks"),
                              "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                         capture_output=True, text=True, timeout=60)
    ids = sorted(line for line in run.stdout.splitlines() if "::" in line)
    assert ids == ["tests/test_mixed.py::test_counts_gpus", "tests/test_mixed.py::test_marked",
                   "tests/test_mixed.py::test_param[gpu]", "tests/test_triton_flash.py::test_any"], \
        run.stdout + run.stderr
    assert gc.cuda_test_files(tmp_path) == sorted(tests.glob("test_*.py"))


def test_the_real_tests_and_lessons_it_picks(tmp_path):
    files = {p.name for p in gc.cuda_test_files()}
    marked = {p.name for p in (ROOT / "tests").glob("test_*.py")
              if 'reason="needs CUDA' in p.read_text()}
    assert marked and marked <= files and "test_triton_flash.py" in files
    assert "test_exchange.py" not in files and "test_checks.py" not in files
    lessons = {p.name for p in gc.gpu_lessons()}
    assert {"11_sdpa_backends.ipynb", "12_flash_attention.ipynb"} <= lessons
    assert "01_attention_from_scratch.ipynb" not in lessons
    nb = tmp_path / "notebooks"
    nb.mkdir()
    cell = lambda kind, src: {"cell_type": kind, "source": src, "metadata": {}}  # noqa: E731
    (nb / "01_a.ipynb").write_text(json.dumps({"cells": [cell("markdown", "CUDA is not needed")]}))
    (nb / "02_b.ipynb").write_text(json.dumps({"cells": [cell("code", ["x = 1\n", "y.cuda()"])]}))
    assert [p.name for p in gc.gpu_lessons(tmp_path)] == ["02_b.ipynb"]


def test_the_probe_reports_torch_and_whether_cuda_is_in_reach():
    torch = pytest.importorskip("torch")
    info = gc.versions()
    assert info["torch"] == torch.__version__ and info["torch_cuda"] == torch.version.cuda
    assert info["modules"]["pytest"] and info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["cuda_available"] is torch.cuda.is_available()
    if info["cuda_available"]:  # a GPU machine: the probe names the GPU and cuDNN
        assert info["gpu"] == torch.cuda.get_device_name(0) and gc.cuda_problem(info) is None
    elif info["torch_cuda"] is None:  # this CPU build, beside a driver, would be explained
        assert "CPU-only build" in gc.cuda_problem(info)


def test_the_probe_s_cuda_branch_with_cuda_faked(monkeypatch):
    torch = pytest.importorskip("torch")
    props = type("Props", (), {"total_memory": 150 * 2**30})()
    for name, fake in [("is_available", lambda: True), ("device_count", lambda: 1),
                       ("get_device_name", lambda i=0: "NVIDIA H200"),
                       ("get_device_capability", lambda i=0: (9, 0)),
                       ("get_device_properties", lambda i=0: props)]:
        monkeypatch.setattr(torch.cuda, name, fake)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    info = gc.versions()
    assert (info["gpu"], info["capability"], info["gpu_memory_gib"], info["cudnn"]) == \
        ("NVIDIA H200", "sm_90", 150.0, 91002)
    assert gc.cuda_problem(info) is None
    assert json.loads(json.dumps(info)) == info, "the probe's answer travels as JSON"


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_probe_reads_the_last_json_line_and_reports_a_hang_or_a_crash(tmp_path):
    ok = _script(tmp_path / "ok", 'echo "a warning"; echo \'{"cuda_available": true}\'')
    assert gc.probe(ok) == {"cuda_available": True}
    hang = gc.probe(_script(tmp_path / "hang", "sleep 30"), timeout_s=0.5)
    assert "took over" in hang["error"] and "took over" in gc.cuda_problem(hang)
    crash = gc.probe(_script(tmp_path / "crash", "echo 'no torch' >&2; exit 1"))
    assert "exited 1" in crash["error"] and "no torch" in crash["error"]


def test_nvidia_smi_gives_the_driver_and_its_whole_output(tmp_path, monkeypatch):
    _script(tmp_path / "nvidia-smi", 'if [ -n "$1" ]; then echo "NVIDIA H200, 580.159.03, 143771 MiB"; '
            'else echo "| NVIDIA-SMI 580.159.03  Driver Version: 580.159.03 |"; fi')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    text, smi = gc.nvidia_smi()
    assert "Driver Version: 580.159.03" in text
    assert smi == {"smi_gpu": "NVIDIA H200", "driver": "580.159.03", "smi_memory": "143771 MiB"}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gc.nvidia_smi() == ("nvidia-smi not found on PATH\n", {})
