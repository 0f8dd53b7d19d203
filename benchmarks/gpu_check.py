"""The GPU half of the course in one go, on a machine with a CUDA GPU: tests, lessons, benchmarks.

    make gpu-check                               # installs .venv if needed (needs PyPI), then this
    make gpu-check GPU_PYTHON=python3            # offline: an interpreter that already has it all
    python benchmarks/gpu_check.py --list        # the plan, without running anything

Steps, in this order, each with its own timeout, all inside one total budget (8 minutes):

  1 versions      nvidia-smi, torch, torch.version.cuda, cuDNN, triton, the GPU (a probe process)
  2 cuda-tests    pytest on every test whose skip reason starts with "needs CUDA" (the only skips
                  CI allows), every test whose code names cuda, and all of CUDA_FILES
  3 gpu-lessons   nbval of the lessons whose code cells use CUDA or Triton
  4 sdpa-bench    benchmarks/sdpa_backends.py --device cuda, a quick sweep
  5 triton-bench  benchmarks/triton_flash.py (our kernel against SDPA flash)

A failing step does not stop the others; the exit code is 1 if any failed or ran out of time.
Everything lands in benchmarks/results/gpu-check/ (emptied first): summary.md (versions, one
row per step, failures and skips), versions.json, nvidia-smi.txt, a log per step, the junit
XML of both pytest steps and the benchmarks' own files. Without an NVIDIA driver it says so
and exits 0, having imported nothing heavier than the standard library.

This file is also the pytest plugin that picks the CUDA tests (`-p gpu_check`, with
benchmarks/ on PYTHONPATH): see pytest_collection_modifyitems.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "gpu-check"
BUDGET_S = 480.0  # the whole run, install excluded: 8 minutes on one H200
CUDA_REASON = "needs CUDA"  # .ci/check_skips.py allows only skips whose reason starts so
CUDA_FILES = ("tests/test_triton_flash.py",)  # interpreter or compiled follows the device: all of it
LESSON_PATTERN = re.compile(r"cuda|triton", re.IGNORECASE)  # a code cell that reaches for the GPU
MIN_STEP_S = 5.0  # a step is not started with less of the total budget left
NO_DRIVER_EXIT = 3  # --preflight: no NVIDIA driver here (make gpu-check then exits 0)
FORCE_ENV = "MHA_GPU_CHECK_CUDA"  # "none": behave as on a machine without a driver (tests)


# ---- the plan ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Step:
    """One command of the check: its name, what it does, its timeout and what we expect on an H200."""

    name: str
    what: str
    cmd: tuple[str, ...]
    timeout_s: float
    estimate_s: float
    junit: str | None = None  # file name under the output folder, for pytest steps
    needs: tuple[str, ...] = ()  # modules the command imports; missing -> not run
    copies: tuple[tuple[Path, str], ...] = ()  # (file a step writes, name to keep it by in OUT)


@dataclasses.dataclass
class Outcome:
    """How one step ended."""

    step: Step
    status: str  # passed, failed, timed out, not run
    seconds: float = 0.0
    rc: int | None = None
    note: str = ""
    tests: dict | None = None  # from its junit XML


def gpu_lessons(root: Path = ROOT) -> list[Path]:
    """The lessons with a code cell that names CUDA or Triton (read as JSON: no nbformat needed)."""
    found = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        sources = ("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
        if any(LESSON_PATTERN.search(s) for s in sources):
            found.append(path)
    return found


def cuda_test_files(root: Path = ROOT) -> list[Path]:
    """Test files that hold a CUDA test (see is_cuda_test), so pytest collects only those."""
    found = []
    for path in sorted((root / "tests").glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        if rel in CUDA_FILES or ("cuda" in text.lower() and code_uses_cuda(text)):
            found.append(path)
    return found


def plan(python: str, out: Path, lessons: list[Path], test_files: list[Path],
         xdist: bool = True, root: Path = ROOT) -> list[Step]:
    """The steps after the version probe, in order, with their timeouts and H200 estimates
    (root: where benchmarks/triton_flash.py writes its table; the tests point it elsewhere)."""
    rel = [_rel(p) for p in lessons]
    par = ("-n", "4", "--dist", "loadfile") if xdist else ()
    tests = (python, "-m", "pytest", *map(_rel, test_files), "-p", "gpu_check",
             "-p", "no:cacheprovider", "-q", "-rfEs", *par, f"--junitxml={out / 'cuda-tests.xml'}")
    nbval = (python, "-m", "pytest", *rel, "--nbval-lax", "--nbval-current-env",
             "--nbval-cell-timeout=120", "-p", "no:cacheprovider", "-q", "-rfE",
             *(("-n", str(min(4, max(1, len(rel)))), "--dist", "loadscope") if xdist else ()),
             f"--junitxml={out / 'gpu-lessons.xml'}")
    sdpa = (python, "benchmarks/sdpa_backends.py", "--device", "cuda", "--dtypes",
            "bfloat16,float32", "--T", "1024,4096,16384", "--repeats", "10", "--min-time", "0.2",
            "--out-dir", str(out))
    if not test_files:  # pytest given no path would run its testpaths: the whole suite
        tests = ()
    if not rel:
        nbval = ()
    return [
        Step("cuda-tests", "pytest: tests marked 'needs CUDA', tests naming cuda, "
             + ", ".join(CUDA_FILES), tests, 160, 90, junit="cuda-tests.xml",
             needs=("pytest", "hypothesis", "triton")),
        Step("gpu-lessons", "nbval --nbval-lax: " + ", ".join(p.name for p in lessons), nbval,
             140, 60, junit="gpu-lessons.xml", needs=("pytest", "nbval")),
        Step("sdpa-bench", "benchmarks/sdpa_backends.py --device cuda, bf16 + fp32, "
             "T = 1024, 4096, 16384", sdpa, 90, 45, needs=("matplotlib", "tqdm")),
        Step("triton-bench", "benchmarks/triton_flash.py: our kernel vs SDPA flash, bf16 causal",
             (python, "benchmarks/triton_flash.py"), 60, 25, needs=("triton",),
             copies=((root / "benchmarks/results/triton_flash.md", "triton_flash.md"),)),
    ]


def _rel(path: Path) -> str:
    """path relative to the checkout where it lies inside it (shorter commands and logs)."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


# ---- pytest plugin: which tests are the CUDA tests ---------------------------------------------
def is_cuda_test(item) -> bool:
    """A test CI skips for want of a GPU, one whose code names cuda (torch.cuda.device_count()
    decides a refusal), or one in CUDA_FILES."""
    for mark in item.iter_markers("skipif"):
        reason = str(mark.kwargs.get("reason", mark.args[1] if len(mark.args) > 1 else ""))
        if reason.startswith(CUDA_REASON):
            return True
    if item.nodeid.split("::")[0] in CUDA_FILES:
        return True
    fn = getattr(item, "function", None)
    try:
        import inspect

        return fn is not None and code_uses_cuda(inspect.getsource(fn))
    except (OSError, TypeError):
        return False


def code_uses_cuda(source: str) -> bool:
    """True where the code, not its strings or comments, names cuda (torch.cuda.device_count())
    or passes reason="needs CUDA..." (a skipif marker: the tests CI skips for want of a GPU)."""
    import ast
    import io
    import tokenize

    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
    except (tokenize.TokenError, SyntaxError):
        return False
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string == "cuda":
            return True
        if (tok.type == tokenize.STRING and i >= 2 and tokens[i - 2].string == "reason"
                and tokens[i - 1].string == "="):
            with contextlib.suppress(ValueError, SyntaxError):
                if str(ast.literal_eval(tok.string)).startswith(CUDA_REASON):
                    return True
    return False


def pytest_collection_modifyitems(config, items) -> None:
    """Keep only the CUDA tests (this module is loaded into pytest with -p gpu_check)."""
    chosen = {id(i) for i in items if is_cuda_test(i)}
    keep = [i for i in items if id(i) in chosen]
    dropped = [i for i in items if id(i) not in chosen]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


# ---- probing the machine -----------------------------------------------------------------------
def driver_present() -> bool:
    """An NVIDIA driver here (nvidia-smi on PATH or the kernel module), as tools/torch_build.py."""
    if os.environ.get(FORCE_ENV) == "none":
        return False
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia/version").exists()


def versions() -> dict:
    """What this interpreter has: torch and its CUDA, cuDNN, the GPU, the modules the steps need."""
    import importlib.metadata
    import importlib.util
    import sysconfig

    info: dict = {"python": platform.python_version(), "executable": sys.executable}
    mods = {}
    for name, dist in [("torch", "torch"), ("triton", "triton"), ("numpy", "numpy"),
                       ("pytest", "pytest"), ("xdist", "pytest-xdist"), ("nbval", "nbval"),
                       ("hypothesis", "hypothesis"), ("matplotlib", "matplotlib"),
                       ("tqdm", "tqdm"), ("mha", "mha")]:
        if importlib.util.find_spec(name) is None:
            mods[name] = None
            continue
        try:
            mods[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            mods[name] = "unknown version"
    info["modules"] = mods
    mha = importlib.util.find_spec("mha")
    info["mha_path"] = str(Path(mha.origin).parent) if mha and mha.origin else None
    # Triton compiles a small C launcher per kernel, and torch.compile's inductor uses one too.
    info["c_compiler"] = next((shutil.which(c) for c in ("cc", "gcc", "clang") if shutil.which(c)),
                              None)
    info["python_h"] = (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
    if mods["torch"] is None:
        info["cuda_available"] = False
        return info
    import torch

    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda  # None on a CPU-only build
    info["cuda_available"] = bool(torch.cuda.is_available())
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["capability"] = "sm_{}{}".format(*torch.cuda.get_device_capability(0))
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def probe(python: str, timeout_s: float = 60) -> dict:
    """versions() as `python` sees it, in a process of its own (a hung CUDA init cannot hang us)."""
    try:
        run = subprocess.run([python, str(Path(__file__).resolve()), "--probe"], cwd=ROOT,
                             capture_output=True, text=True, timeout=timeout_s, env=_env())
    except subprocess.TimeoutExpired:
        return {"error": f"the probe ({python}) took over {timeout_s:.0f} s"}
    except OSError as e:
        return {"error": f"cannot run {python}: {e}"}
    if run.returncode != 0:
        return {"error": f"the probe ({python}) exited {run.returncode}: {run.stderr[-1500:]}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def nvidia_smi(timeout_s: float = 20) -> tuple[str, dict]:
    """nvidia-smi's full output and the driver version and GPU name it reports."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found on PATH\n", {}
    try:
        full = subprocess.run([exe], capture_output=True, text=True, timeout=timeout_s)
        query = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True,
                               timeout=timeout_s)
    except (subprocess.SubprocessError, OSError) as e:
        return f"nvidia-smi failed: {e}\n", {}
    fields = [f.strip() for f in query.stdout.splitlines()[0].split(",")] if query.stdout else []
    keys = ["smi_gpu", "driver", "smi_memory"]
    return full.stdout + full.stderr, dict(zip(keys, fields, strict=False))


def cuda_problem(info: dict) -> str | None:
    """Why this interpreter cannot use the GPU although a driver is here (None: it can)."""
    if info.get("error"):
        return info["error"]
    if info.get("cuda_available"):
        return None
    if info.get("modules", {}).get("torch") is None:
        return f"{info.get('executable', 'python')} has no torch: run `make gpu-check` (installs it)"
    if info.get("torch_cuda") is None:
        return (f"torch {info.get('torch')} is the CPU-only build, but an NVIDIA driver is here. "
                "A venv made before keeps it (CPU=auto leaves an installed torch 2.13.0 alone): "
                "`make clean && make gpu-check` installs PyPI's CUDA build, or point "
                "GPU_PYTHON= at an interpreter whose torch has CUDA")
    return (f"torch {info.get('torch')} (CUDA {info.get('torch_cuda')}) sees no GPU: is one "
            "visible (CUDA_VISIBLE_DEVICES), and is the driver new enough for this CUDA? "
            "See nvidia-smi's output above")


# ---- running a step ----------------------------------------------------------------------------
@dataclasses.dataclass
class Ran:
    """What the runner reports: exit code (None if killed), seconds, whether it hit its timeout."""

    rc: int | None
    seconds: float
    timed_out: bool


def run_streaming(cmd: tuple[str, ...], timeout_s: float, log: Path, env: dict | None = None,
                  echo: Callable[[str], None] | None = None) -> Ran:
    """Run cmd in its own process group, its output to `log` and (live) to `echo`; kill the
    whole group (SIGTERM, then SIGKILL) once it passes timeout_s."""
    echo = echo or (lambda line: print(line, end="", flush=True))
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env or _env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    text=True, errors="replace", start_new_session=True)
        except OSError as e:
            out.write(f"cannot start {cmd[0]}: {e}\n")
            return Ran(127, time.monotonic() - start, False)

        def pump() -> None:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                echo("    " + line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        reader.join(timeout=5)  # a grandchild of another session may still hold the pipe
        if timed_out:
            out.write(f"\n[gpu-check] killed after its timeout of {timeout_s:.0f} s\n")
    return Ran(None if timed_out else proc.returncode, time.monotonic() - start, timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the step's process group, SIGKILL it 5 s later if anything is left."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _env() -> dict:
    """The steps' environment: unbuffered output, no display, this file importable as a plugin."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    paths = [str(HERE), str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def junit_counts(path: Path) -> dict | None:
    """Tests, passed, failed (failures + errors), skipped, and the failed ids and skip reasons."""
    if not path.exists():
        return None
    try:
        cases = list(ET.parse(path).getroot().iter("testcase"))
    except ET.ParseError:
        return None
    failed, skipped = [], []
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        for skip in case.findall("skipped"):
            skipped.append(f"{name}: {(skip.get('message') or '').strip()}")
    return {"tests": len(cases), "failed": sorted(failed), "skipped": sorted(skipped),
            "passed": len(cases) - len(failed) - len(skipped)}


# ---- the whole check ---------------------------------------------------------------------------
Runner = Callable[[Step, float, Path], Ran]


def run_steps(steps: list[Step], out: Path, runner: Runner, budget_s: float, modules: dict,
              say: Callable[[str], None] = print) -> list[Outcome]:
    """Run every step in order within the budget; a failure never stops the ones after it."""
    deadline = time.monotonic() + budget_s
    outcomes = []
    for n, step in enumerate(steps, 1):
        left = deadline - time.monotonic()
        missing = [m for m in step.needs if modules and modules.get(m) is None]
        say(f"\n[{n}/{len(steps)}] {step.name}: {step.what}\n"
            f"    timeout {step.timeout_s:.0f} s (about {step.estimate_s:.0f} s on an H200), "
            f"{max(left, 0):.0f} s of the budget left")
        if not step.cmd:
            outcomes.append(Outcome(step, "failed", note="found nothing to run"))
            say(f"    -> failed: {outcomes[-1].note}")
            continue
        if missing:
            outcomes.append(Outcome(step, "not run", note=f"missing module(s): {', '.join(missing)}"))
            say(f"    -> not run: {outcomes[-1].note}")
            continue
        if left < MIN_STEP_S:
            outcomes.append(Outcome(step, "not run", note="the total budget was spent"))
            say("    -> not run: the total budget was spent")
            continue
        started = time.time()
        ran = runner(step, min(step.timeout_s, left), out / f"{step.name}.log")
        status = ("timed out" if ran.timed_out else "passed" if ran.rc == 0 else "failed")
        outcome = Outcome(step, status, ran.seconds, ran.rc)
        if ran.timed_out:
            outcome.note = f"killed after {min(step.timeout_s, left):.0f} s"
        if step.junit:
            outcome.tests = junit_counts(out / step.junit)
            if status == "passed" and (outcome.tests is None or outcome.tests["tests"] == 0):
                outcome.status, outcome.note = "failed", "no test ran"
        for path, name in step.copies:
            if path.exists() and path.stat().st_mtime >= started - 1:
                shutil.copy2(path, out / name)
            elif outcome.status == "passed":
                outcome.status, outcome.note = "failed", f"it did not write {_rel(path)}"
        outcomes.append(outcome)
        say(f"    -> {outcome.status} in {ran.seconds:.1f} s" + (f" ({outcome.note})"
                                                                 if outcome.note else ""))
    return outcomes


def _git_head() -> str:
    """The checkout's commit (and whether files differ from it), or why it is unknown."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, timeout=10,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, timeout=10, capture_output=True, text=True).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return "unknown (no git)"
    return (head or "unknown") + (" with uncommitted changes" if dirty else "")


def summary(info: dict, smi: dict, outcomes: list[Outcome], budget_s: float, wall_s: float,
            out: Path) -> str:
    """summary.md: the machine and versions, a row per step, then failures and skips."""
    failed = [o for o in outcomes if o.status != "passed"]
    mods = info.get("modules", {})
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    verdict = ("all steps passed" if not failed else
               "FAILED: " + ", ".join(f"{o.step.name} ({o.status})" for o in failed))
    rows = [("GPU", f"{info.get('gpu', smi.get('smi_gpu', 'none'))} ({info.get('capability', '?')}, "
                    f"{info.get('gpu_memory_gib', '?')} GiB, {info.get('gpu_count', '?')} visible)"),
            ("NVIDIA driver (nvidia-smi)", smi.get("driver", "unknown")),
            ("CUDA of torch (torch.version.cuda)", str(info.get("torch_cuda"))),
            ("cuDNN (torch.backends.cudnn.version())", str(info.get("cudnn", "unknown"))),
            ("torch", str(info.get("torch", mods.get("torch")))),
            ("triton", str(mods.get("triton"))),
            ("python", f"{info.get('python')} ({info.get('executable')})"),
            ("numpy / pytest / nbval / hypothesis",
             " / ".join(str(mods.get(m)) for m in ("numpy", "pytest", "nbval", "hypothesis"))),
            ("mha imported from", str(info.get("mha_path"))),
            ("C compiler (Triton, inductor) / Python.h",
             f"{info.get('c_compiler')} / {'yes' if info.get('python_h') else 'no'}"),
            ("commit", _git_head())]
    lines = [f"# GPU check, {when}", "", f"**{verdict}**, in {wall_s:.0f} s "
             f"(budget {budget_s:.0f} s; `make gpu-check`, benchmarks/gpu_check.py).", "",
             "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], "",
             "| # | step | what | result | seconds | timeout | H200 estimate | log |",
             "|---:|---|---|---|---:|---:|---:|---|"]
    for n, o in enumerate(outcomes, 1):
        res = o.status + (f": {o.note}" if o.note else "")
        if o.tests:
            t = o.tests
            res += (f" ({t['passed']} passed, {len(t['failed'])} failed, "
                    f"{len(t['skipped'])} skipped)")
        log = f"[{o.step.name}.log]({o.step.name}.log)" if (out / f"{o.step.name}.log").exists() \
            else "-"
        lines.append(f"| {n} | {o.step.name} | {o.step.what} | {res} | {o.seconds:.1f} | "
                     f"{o.step.timeout_s:.0f} | {o.step.estimate_s:.0f} | {log} |")
    for o in outcomes:
        if o.tests and (o.tests["failed"] or o.tests["skipped"]):
            lines += ["", f"## {o.step.name}: failed and skipped", ""]
            lines += [f"- FAILED {name}" for name in o.tests["failed"]]
            lines += [f"- skipped {reason}" for reason in o.tests["skipped"]]
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "summary.md")
    lines += ["", "Files here: " + ", ".join(files), ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=OUT, help="where results go (emptied first)")
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run")
    p.add_argument("--python", default=sys.executable, help="interpreter for the steps")
    p.add_argument("--only", default="", help="comma-separated step names to run (others skipped)")
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    p.add_argument("--preflight", action="store_true",
                   help=f"only look for an NVIDIA driver: exit 0 if there, {NO_DRIVER_EXIT} if not")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None, *, probe_fn: Callable[[str], dict] | None = None,
         runner: Runner | None = None, driver: Callable[[], bool] | None = None,
         say: Callable[[str], None] = print, root: Path = ROOT) -> int:
    """Run the check; probe_fn, runner, driver and root stand in for the real ones in tests."""
    args = parse_args(argv)
    if args.probe:
        print(json.dumps(versions()))
        return 0
    budget_start = time.monotonic()
    if args.list:
        say("\n".join(f"{s.name} ({s.timeout_s:.0f} s, ~{s.estimate_s:.0f} s on an H200): "
                      f"{' '.join(s.cmd)}" for s in plan(args.python, args.out_dir, gpu_lessons(),
                                            cuda_test_files())))
        return 0
    if not (driver or driver_present)():
        say("gpu-check: no CUDA here (no NVIDIA driver: nvidia-smi is not on PATH and "
            "/proc/driver/nvidia is absent), so there is nothing to check; nothing was run. "
            "Run `make gpu-check` on a machine with an NVIDIA GPU.")
        return NO_DRIVER_EXIT if args.preflight else 0
    if args.preflight:
        return 0
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if old.is_file():
            old.unlink()
    say(f"[0] versions: probing {args.python} and nvidia-smi")
    smi_text, smi = nvidia_smi()
    (out / "nvidia-smi.txt").write_text(smi_text)
    info = (probe_fn or probe)(args.python)
    (out / "versions.json").write_text(json.dumps({**info, **smi}, indent=1) + "\n")
    say(smi_text.rstrip())
    problem = cuda_problem(info)
    if problem:
        say(f"gpu-check: an NVIDIA driver is here but CUDA cannot be used: {problem}")
        (out / "summary.md").write_text(f"# GPU check\n\n**Not run**: {problem}\n")
        return 1
    say(f"    {info.get('gpu')} ({info.get('capability')}), torch {info.get('torch')}, "
        f"CUDA {info.get('torch_cuda')}, cuDNN {info.get('cudnn')}, driver {smi.get('driver')}")
    if not info.get("c_compiler") or not info.get("python_h"):
        say("    warning: Triton builds a small C launcher for each kernel (and torch.compile's "
            "inductor compiles C too): it needs a C compiler and Python.h (Debian: gcc, "
            f"python3-dev); found compiler {info.get('c_compiler')}, Python.h "
            f"{'yes' if info.get('python_h') else 'no'}")
    mods = info.get("modules", {})
    steps = plan(args.python, out, gpu_lessons(), cuda_test_files(),
                 xdist=mods.get("xdist") is not None, root=root)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s.name for s in steps}
        if unknown:
            say(f"--only: no step named {sorted(unknown)}; steps: {[s.name for s in steps]}")
            return 2
        steps = [s for s in steps if s.name in wanted]
    budget_left = args.budget - (time.monotonic() - budget_start)

    def default_runner(step: Step, timeout_s: float, log: Path) -> Ran:
        return run_streaming(step.cmd, timeout_s, log)

    outcomes = run_steps(steps, out, runner or default_runner, budget_left, mods, say)
    wall = time.monotonic() - budget_start
    (out / "summary.md").write_text(summary(info, smi, outcomes, args.budget, wall, out))
    bad = [o.step.name for o in outcomes if o.status != "passed"]
    say(f"\ngpu-check: {len(outcomes) - len(bad)} of {len(outcomes)} steps passed in {wall:.0f} s"
        + (f"; FAILED: {', '.join(bad)}" if bad else "") + f". Results: {out}/summary.md")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
