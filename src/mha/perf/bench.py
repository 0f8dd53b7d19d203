"""Timing, FLOP and memory helpers shared by `benchmarks/sdpa_backends.py` and 11_sdpa_backends.ipynb.

Shape legend: B batch, h heads, T query length, S key length, d_k head width.
Nothing here asserts a time: CPU timings on shared machines swing 2-5x between runs,
so compare ratios measured in one run, never absolute numbers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mha import steps
from mha.attention import numpy_attention
from mha.attention.torch_attention import causal_mask, manual_attention
from mha.perf import hardware

BACKENDS: dict[str, SDPBackend] = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
"""SDPA's backends by short name; `torch.nn.attention.sdpa_kernel` forces one of them."""

# ---- FLOPs -----------------------------------------------------------------------------------
def attention_flops(B: int, h: int, T: int, d_k: int, S: int | None = None, causal: bool = False) -> int:
    """FLOPs of the attention core: 4 * B * h * T * S * d_k (halved when causal).

    Each (query, key) pair costs d_k multiply-adds for q.k and d_k for weights @ v: 2 * 2 * d_k
    FLOPs. Softmax and scaling are O(T * S) and left out, as FlashAttention's papers do.
    Causal keeps about half the pairs; the exact count T(T+1)/2 differs by T/2 pairs.
    """
    S = T if S is None else S
    flops = 4 * B * h * T * S * d_k
    return flops // 2 if causal else flops


def tflops(flops: float, seconds: float) -> float:
    """Achieved TFLOP/s for `flops` done in `seconds`."""
    return flops / seconds / 1e12


def score_matrix_bytes(B: int, h: int, T: int, S: int, dtype: torch.dtype) -> int:
    """Bytes of one (B, h, T, S) matrix: what the math path materialises (at least once)."""
    return B * h * T * S * torch.empty((), dtype=dtype).element_size()


# ---- timing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    """Seconds per call over `repeats` timed calls: median, minimum and maximum."""

    median_s: float
    min_s: float
    repeats: int
    max_s: float = float("nan")


@dataclass(frozen=True)
class Timed:
    """A call to time and the context it needs (e.g. `sdpa_kernel`), entered outside the timing.

    Calling it runs `fn()` inside `context()`, for untimed uses (memory, correctness).
    """

    fn: Callable[[], object]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def __call__(self) -> object:
        with self.context():
            return self.fn()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_fn(
    fn: Callable[[], object] | Timed, repeats: int = 5, warmup: int = 1, device: str = "cpu",
    min_time_s: float = 0.0,
) -> Timing:
    """Time `fn()` after `warmup` calls: at least `repeats` calls and at least `min_time_s` in all."""
    return time_interleaved({"fn": fn}, repeats, warmup, device, min_time_s)["fn"]


def _timed_call(spec: Timed, device: str) -> float:
    """Seconds of one call of spec.fn; its context is entered before the clock starts and left after."""
    with spec.context():
        _sync(device)
        t0 = time.perf_counter()
        spec.fn()
        _sync(device)
        return time.perf_counter() - t0


def time_interleaved(
    fns: dict[str, Callable[[], object] | Timed], repeats: int = 5, warmup: int = 1,
    device: str = "cpu", min_time_s: float = 0.0,
) -> dict[str, Timing]:
    """Time several functions in rounds (one call of each per round), so load bursts hit all alike.

    Each function gets at least `repeats` timed calls and at least `min_time_s` of calls.
    A `Timed` runs inside its context, but the clock covers only its call: entering and leaving
    `sdpa_kernel` costs tens of microseconds, as much as a whole small SDPA call on a GPU.
    CUDA work is asynchronous, so each call is bracketed by torch.cuda.synchronize().
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    specs = {name: fn if isinstance(fn, Timed) else Timed(fn) for name, fn in fns.items()}
    for spec in specs.values():
        for _ in range(warmup):
            spec()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in specs}
    while any(len(t) < repeats or sum(t) < min_time_s for t in times.values()):
        for name, spec in specs.items():
            t = times[name]
            if len(t) < repeats or sum(t) < min_time_s:
                t.append(_timed_call(spec, device))
    return {n: Timing(statistics.median(t), min(t), len(t), max(t)) for n, t in times.items()}


# ---- memory ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2: the profiler's C++ side prints start/stop lines there."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn: Callable[[], object], device: str = "cpu") -> int:
    """Peak extra bytes allocated by torch while `fn()` runs (above what was live before).

    CUDA: torch.cuda.max_memory_allocated. CPU: torch has no peak counter and tracemalloc
    cannot see torch's allocator, so we replay torch.profiler's allocation record: each op's
    own allocations count from its start, its frees at its end, and we take the running max.
    The profiler books a free at the end of the innermost op that encloses it, so inside a
    long Python-level op (an autograd Function's forward, a record_function block) frees all
    land at its end and the peak comes out too high: measure the code it wraps instead.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas = []
    for e in prof.events():
        b = e.self_cpu_memory_usage
        if b > 0:
            deltas.append((e.time_range.start, b))
        elif b < 0:
            deltas.append((e.time_range.end, b))
    live = peak = 0
    for _, b in sorted(deltas):
        live += b
        peak = max(peak, live)
    return peak


def numpy_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes numpy allocates while `fn()` runs, via tracemalloc (numpy reports to it; torch does not)."""
    import tracemalloc

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


# ---- the attention cores being compared ------------------------------------------------------
def numpy_core(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    """Steps 3-6: the numpy module's attention core (what it runs between its projections)."""
    allowed = steps.causal_mask(q.shape[-2], k.shape[-2]) if causal else None  # (T, S)
    return numpy_attention.attention(q, k, v, allowed)[0]  # (B, h, T, d_k)


def manual_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Steps 3-6 in torch, the torch module's manual path (forms the (B, h, T, S) weights)."""
    allowed = causal_mask(q.shape[-2], k.shape[-2], device=q.device) if causal else None
    return manual_attention(q, k, v, allowed)[0]  # (B, h, T, d_k)


def sdpa_core(q, k, v, causal: bool = False, backend: str | None = None) -> torch.Tensor:
    """F.scaled_dot_product_attention, forced onto `backend` ("math", "flash", ...) or left to choose.

    Not for timing: it enters `sdpa_kernel` on every call. Time `sdpa_timed(...)` instead.
    """
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, h, T, d_k)
    with sdpa_kernel(BACKENDS[backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, h, T, d_k)


def _forced(backend: str) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of `sdpa_kernel` contexts that force `backend`, checked by name now."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)} or None, got {backend!r}")
    return functools.partial(sdpa_kernel, BACKENDS[backend])


def sdpa_timed(q, k, v, causal: bool = False, backend: str | None = None) -> Timed:
    """What to time for SDPA on `backend`: the bare call, and `sdpa_kernel` held around it untimed."""
    call = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal)
    return Timed(call) if backend is None else Timed(call, _forced(backend))


def context_cost(backend: str = "math", repeats: int = 2000) -> float:
    """Seconds to enter and leave `sdpa_kernel(backend)` once (best of 5 runs of `repeats`)."""
    enter = _forced(backend)

    def enter_and_leave() -> None:
        for _ in range(repeats):
            with enter():
                pass

    return time_fn(enter_and_leave, repeats=5).min_s / repeats


# ---- which backend accepts what --------------------------------------------------------------
def _short_reason(messages: list[str], error: str) -> str:
    """The most specific line among SDPA's warnings, without the 'Triggered internally' tail."""
    lines = [re.sub(r"\s*\(Triggered internally at .*\)\s*$", "", m, flags=re.S).strip()
             for m in messages]
    lines = [m for m in lines if m and not m.endswith("not used because:")]
    return lines[-1] if lines else error.splitlines()[0]


def try_backend(backend: str, q, k, v, **kwargs) -> tuple[bool, str]:
    """Run SDPA forced onto `backend`; return (True, "ok") or (False, SDPA's own short reason)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(BACKENDS[backend]):
                F.scaled_dot_product_attention(q, k, v, **kwargs)
            return True, "ok"
        except RuntimeError as e:
            return False, _short_reason([str(w.message) for w in caught], str(e))


def available_backends(device: str = "cpu", dtype: torch.dtype = torch.float32) -> list[str]:
    """Backends that run a plain (1, 2, 16, 64) self-attention on `device` in `dtype`."""
    q = torch.randn(1, 2, 16, 64, device=device, dtype=dtype)
    return [name for name in BACKENDS if try_backend(name, q, q, q)[0]]


# ---- tolerances, derived rather than guessed ----------------------------------------------------
DEFAULT_ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}
"""PyTorch's test_transformers.py default_atol per dtype: the floor under a derived tolerance."""

FUDGE = 3.0
"""Our choice: a fast path may be 3x as far from float64 as the plain low-precision path
(flash-attention's own tests allow 2x; our floor and shapes are small, so we give room)."""


def derived_tolerance(golden, lp_ref, dtype: torch.dtype) -> tuple[float, float]:
    """(ref_err, allowed): the plain low-precision path's error against a float64 golden
    output, and the error a fast path may have: max(default_atol, FUDGE * ref_err, one ulp).

    One ulp is torch.finfo(dtype).eps * max|golden|, the spacing of `dtype` at the largest
    output: no result in that dtype can be asked to be closer than one rounding of its output,
    however lucky the reference was (hypothesis found a tiny bfloat16 problem where the
    manual path was 0.0046 off and nn.MultiheadAttention 0.0141, under one ulp of 0.0156).
    """
    a = golden.detach().cpu().double().numpy() if hasattr(golden, "detach") else np.asarray(golden)
    b = lp_ref.detach().cpu().double().numpy() if hasattr(lp_ref, "detach") else np.asarray(lp_ref)
    ref_err = float(np.abs(a - b.astype(np.float64)).max())
    ulp = torch.finfo(dtype).eps * float(np.abs(a).max(initial=0.0))
    return ref_err, max(DEFAULT_ATOL[dtype], FUDGE * ref_err, ulp)


KERNEL_OPS: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",  # also ..._math_for_mps
}
"""The op each of SDPA's kernels runs as, as torch.profiler names it: how kernel_that_runs tells."""


def kernel_that_runs(q, k, v, **kwargs) -> str:
    """The kernel a default SDPA call picks for these inputs: 'flash', 'efficient', 'cudnn' or 'math'.

    Read off torch.profiler's record of the ops the call runs. The inputs go in as they are,
    requires_grad included: on CUDA whether the inputs need grad can change the choice (flash
    refuses training with some head sizes on sm86/sm89, for one), so the answer is the one
    for this very call, with grad, without it, or under torch.inference_mode.
    """
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    ops = [e.name for e in prof.events()]
    for op in ops:
        for prefix, name in KERNEL_OPS.items():
            if op.startswith(prefix):
                return name
    raise RuntimeError(f"none of SDPA's known kernels ran; the profiler saw {sorted(set(ops))}")


# ---- the machine -----------------------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux) or platform, else 'unknown CPU'."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def gpu_peak_bf16_tflops(name: str) -> float | None:
    """Dense bf16 peak TFLOP/s of a GPU named `name` (hardware.lookup), or None if unknown."""
    gpu = hardware.lookup(name)
    return None if gpu is None or gpu.peak_flops is None else gpu.peak_flops / 1e12


def machine_info() -> dict[str, str]:
    """CPU model, cores, threads, GPU (if any), versions, and the load average when it was asked."""
    info = {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "load_1min": f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "unknown",
    }
    return info


def machine_line(info: dict[str, str] | None = None) -> str:
    """One line describing the machine and versions, for tables and plot titles."""
    i = machine_info() if info is None else info
    gpu = "" if i["gpu"] == "none" else f", GPU {i['gpu']}"
    return (f"{i['cpu']} ({i['cores']} cores, torch threads {i['torch_threads']}{gpu}); "
            f"python {i['python']}, torch {i['torch']}, numpy {i['numpy']}")
