"""Run a function on W torch.distributed ranks on CPU (gloo), one process each, and never hang.

    run_workers(fn, world_size, args=(), timeout_s=60.0, collective_timeout_s=20.0,
                backend="gloo") -> list
        the results of fn(rank, world_size, *args), in rank order

Why it cannot hang a test run or a notebook:
- bad input (world_size, a lambda, a function defined in __main__ or a notebook, arguments that
  cannot be pickled) raises before any process starts;
- every gloo collective carries `collective_timeout_s`, so a mismatched collective (one rank
  skips an all_reduce) raises in the ranks that wait, instead of waiting forever;
- the first rank that fails stops the others after a short grace, and the whole call has one
  deadline, `timeout_s`: past it, this call terminates, then kills, only the processes it started
  and raises TimeoutError naming the ranks that had not finished;
- a `finally` joins every process and removes the rendezvous directory, also on Ctrl-C (a
  notebook's interrupt), and each rank exits by itself a little after the deadline even if the
  parent died.

Processes come from the "forkserver" start method: children fork from a small clean server that
has imported torch once (fast), never from the caller, whose OpenMP threads or notebook state a
plain fork could deadlock on. Where forkserver does not exist (Windows), "spawn" is used.
Results and arguments travel as plain pickled bytes, so tensors are copied by value and never
left in shared memory that dies with the rank that made it.
"""

from __future__ import annotations

import importlib
import math
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from mha.validate import require_int

MAX_WORLD_SIZE = 64
"""The most ranks one call starts: a typo such as world_size=4000 must not fork-bomb the machine."""

FAIL_GRACE_S = 1.0
"""After the first rank fails, how long the others get to report before they are stopped."""

KILL_GRACE_S = 1.0
"""How long a terminated (SIGTERM) rank gets to exit before it is killed (SIGKILL)."""

ORPHAN_MARGIN_S = 5.0
"""A rank exits by itself this long after the deadline, in case its parent is gone."""

ORPHAN_EXIT_CODE = 70
"""The exit code of a rank that outlived timeout_s + ORPHAN_MARGIN_S and ended itself."""


def _function_error(fn: Any) -> str | None:
    """Why fn cannot be imported by name in a fresh worker process, or None if it can."""
    if not callable(fn):
        return f"fn must be a function, got {type(fn).__name__} {fn!r}"
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return f"fn must be a module-level function, got {type(fn).__name__} {fn!r}"
    if "<lambda>" in qualname or "<locals>" in qualname:
        return f"fn must be a module-level function, got {qualname!r} (a lambda or nested function)"
    if module in ("__main__", "__mp_main__"):
        return (f"fn {qualname!r} is defined in __main__ (a script or a notebook), which worker "
                "processes cannot import: move it into a module, e.g. mha.parallel._launch_examples")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        found = None
    if found is not fn:
        return f"fn {module}.{qualname} cannot be imported by that name from a worker process"
    return None


def _require_seconds(name: str, value: Any) -> float:
    """Return value as float if it is a finite number of seconds > 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return float(value)


def _pack_job(fn: Callable[..., Any], args: Sequence[Any], backend: str = "gloo") -> bytes:
    """fn, args and the backend as plain pickled bytes; raise TypeError naming what cannot be pickled."""
    if (why := _function_error(fn)) is not None:
        raise TypeError(why)
    try:
        return pickle.dumps((fn, tuple(args), backend))
    except Exception as exc:  # pickle raises several kinds (PicklingError, TypeError, ...)
        raise TypeError(f"args must be picklable to reach the workers: {exc}") from exc


def _detached(value: Any) -> Any:
    """value with every tensor inside (lists, tuples, dicts) detached, on the CPU and cloned."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, list | tuple):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _error_message(rank: int, exc: BaseException) -> tuple:
    """An exception as (kind, rank, type name, message, traceback text): plain strings travel."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ("error", rank, type(exc).__name__, str(exc), text)


def _use_loopback() -> None:
    """Make gloo talk over the loopback device (all ranks are on this host) unless told otherwise."""
    if "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"


def _run_rank(rank: int, world_size: int, job: bytes, store: str, collective_s: float) -> Any:
    """Join the process group (gloo, or nccl on GPU `rank`), run the job, leave; return fn's result."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 cores, W ranks: more threads per rank only fight (and hung once)
    _use_loopback()
    fn, args, backend = pickle.loads(job)
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one GPU per rank; NCCL refuses two ranks on one device
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=collective_s))
    try:
        return _detached(fn(rank, world_size, *args))
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world_size: int, job: bytes, store: str, collective_s: float,
            life_s: float, conn: Connection) -> None:
    """Entry point of one rank: run it and send back ("ok", rank, result) or the error."""
    # If the parent dies (kill -9) nobody stops this rank: it ends itself after life_s.
    timer = threading.Timer(life_s, os._exit, args=(ORPHAN_EXIT_CODE,))
    timer.daemon = True
    timer.start()
    try:
        message: tuple = ("ok", rank, _run_rank(rank, world_size, job, store, collective_s))
        payload = pickle.dumps(message)
    except BaseException as exc:  # report everything, Ctrl-C and SystemExit included
        payload = pickle.dumps(_error_message(rank, exc))
    try:
        conn.send_bytes(payload)
    finally:
        conn.close()


def _context() -> Any:
    """forkserver (children fork from a clean server with torch imported), or spawn without it."""
    import torch.multiprocessing as tmp

    if "forkserver" not in mp.get_all_start_methods():  # Windows has no forkserver
        return tmp.get_context("spawn")
    ctx = tmp.get_context("forkserver")
    # Import torch once in the server, so W ranks do not each pay ~3 s for it. Only takes effect
    # when the server starts (first call in this process). The server runs no torch op, so it
    # has one thread, no OpenMP pool, when it forks a rank. torch._dynamo too (2.5 s, no thread):
    # the profiler that bench.peak_memory_bytes uses imports it on first use, 2.7 s in every rank.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", __name__])
    return ctx


def _start(world_size: int, job: bytes, store: str, collective_s: float,
           life_s: float) -> tuple[list, list[Connection]]:
    """Start one process per rank; return the processes and the parent's ends of their pipes."""
    ctx = _context()
    procs, readers = [], []
    try:
        for rank in range(world_size):
            reader, writer = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, name=f"mha-rank-{rank}", daemon=True,
                            args=(rank, world_size, job, store, collective_s, life_s, writer))
            readers.append(reader)
            p.start()
            procs.append(p)  # only started processes: _stop joins each of them
            writer.close()  # only the child holds the write end: its exit reads as EOF here
    except BaseException:
        _stop(procs)
        _close(readers)
        raise
    return procs, readers


def _close(readers: list[Connection]) -> None:
    """Close the parent's ends of the pipes."""
    for reader in readers:
        reader.close()


def _receive(rank: int, reader: Connection, proc: Any) -> tuple:
    """The message a finished rank sent, or an error message if it died without one."""
    try:
        return pickle.loads(reader.recv_bytes())
    except EOFError:
        proc.join(KILL_GRACE_S)
        return ("error", rank, "ProcessExited", _exit_reason(proc.exitcode), "(no traceback)\n")
    except Exception as exc:  # the result arrived but cannot be unpickled here
        return _error_message(rank, exc)


def _exit_reason(code: int | None) -> str:
    """Why a rank's process may have ended without sending a result."""
    why = f"its process exited with code {code} before sending a result"
    if code == ORPHAN_EXIT_CODE:
        return why + " (it outlived timeout_s + ORPHAN_MARGIN_S and ended itself)"
    if code is not None and code < 0:
        return why + f" (killed by signal {-code})"
    return why + (" (its stderr says why; a script that calls run_workers needs `if __name__ == "
                  "'__main__':` around its top level, since each rank re-imports the main script)")


def _collect(procs: list, readers: list[Connection], deadline: float) -> tuple[dict, list]:
    """Wait for messages until all ranks answered, one failed (plus a grace), or the deadline."""
    answers: dict[int, tuple] = {}
    failures: list[tuple] = []  # in the order they arrived
    stop_at = deadline
    while len(answers) < len(procs) and (left := stop_at - time.monotonic()) > 0:
        waiting = {readers[r]: r for r in range(len(procs)) if r not in answers}
        for reader in wait(list(waiting), timeout=min(left, 60.0)):  # a huge left overflows
            rank = waiting[reader]  # type: ignore[index]
            answers[rank] = _receive(rank, reader, procs[rank])
            if answers[rank][0] == "error":
                failures.append(answers[rank])
                stop_at = min(stop_at, time.monotonic() + FAIL_GRACE_S)
    return answers, failures


def _stop(procs: list) -> None:
    """Terminate, then kill, the given processes that still run, and join them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(KILL_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join(KILL_GRACE_S)


_KNOCK_ON = ("Connection closed by peer", "Connection reset by peer", "connectFullMesh",
             "NCCL communicator was aborted")
"""Errors a rank gets because another rank failed and left: reported after the cause."""


def _failure(failures: list[tuple], answers: dict, world_size: int) -> RuntimeError:
    """One RuntimeError: the failing rank that caused it (a knock-on connection error of a rank
    whose peer left comes after the peer's own error, whichever arrived first), its traceback,
    and how many others failed."""
    failures = sorted(failures, key=lambda f: any(k in str(f[3]) for k in _KNOCK_ON))
    _, rank, kind, message, text = failures[0]
    unfinished = [r for r in range(world_size) if r not in answers]
    lines = [f"rank {rank} of {world_size} failed: {kind}: {message}"]
    if len(failures) > 1:
        others = ", ".join(str(f[1]) for f in failures[1:])
        lines.append(f"{len(failures) - 1} other rank(s) failed too: {others}")
    if unfinished:
        lines.append(f"stopped rank(s) still running: {unfinished}")
    lines.append(f"traceback of rank {rank}:\n{text}")
    return RuntimeError("\n".join(lines))


def run_workers(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
                timeout_s: float = 60.0, collective_timeout_s: float = 20.0,
                backend: str = "gloo") -> list:
    """Return [fn(rank, world_size, *args) for each rank], each rank in its own process.

    backend "gloo" (CPU tensors, any machine) or "nccl" (rank r on GPU r; needs world_size GPUs).
    """
    world_size = require_int("world_size", world_size)
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be <= {MAX_WORLD_SIZE}, got {world_size}")
    timeout_s = _require_seconds("timeout_s", timeout_s)
    collective_s = _require_seconds("collective_timeout_s", collective_timeout_s)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        import torch

        if torch.cuda.device_count() < world_size:
            raise ValueError(f"backend='nccl' puts each rank on its own GPU: world_size={world_size} "
                             f"needs {world_size} CUDA devices, this machine has "
                             f"{torch.cuda.device_count()}")
    job = _pack_job(fn, args, backend)
    deadline = time.monotonic() + timeout_s
    tmpdir = tempfile.mkdtemp(prefix="mha-launch-")
    procs: list = []
    readers: list[Connection] = []
    try:
        procs, readers = _start(world_size, job, os.path.join(tmpdir, "store"), collective_s,
                                timeout_s + ORPHAN_MARGIN_S)
        answers, failures = _collect(procs, readers, deadline)
        if failures:
            raise _failure(failures, answers, world_size)
        if len(answers) < world_size:
            late = [r for r in range(world_size) if r not in answers]
            raise TimeoutError(f"run_workers timed out after {timeout_s:g} s: rank(s) {late} of "
                               f"{world_size} had not finished; stopped them")
        return [answers[r][2] for r in range(world_size)]
    finally:
        _stop(procs)
        _close(readers)
        shutil.rmtree(tmpdir, ignore_errors=True)
