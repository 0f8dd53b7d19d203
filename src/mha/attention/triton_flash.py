"""The tiled forward of `mha.attention.flash` as a Triton kernel: one program per (query block, batch x head).

The same loop as `flash._tiled`, written for a GPU: each program loads one block of queries,
streams the key/value tiles (none above the diagonal when causal), keeps the running max `m`,
the sum `ell` and the unnormalised output `acc` in float32 registers, and writes the output and
the row logsumexp once (grouped-query heads read their shared key/value head in place). Scores and accumulation are float32 whatever the inputs' dtype (mixed
precision, as `torch_attention.compute_dtype` does); P is cast to the values' dtype for the P V
matmul, as FlashAttention does. Every `tl.dot` asks for `input_precision="ieee"`: on a GPU,
float32 tiles are then multiplied in float32, where Triton's default would round them to TF32
(10 mantissa bits) first; for float16 / bfloat16 tiles the option changes nothing.

Where it runs is decided per call, from the tensors' device: CUDA tensors go to the compiled
kernel, CPU tensors to Triton's interpreter (the same code executed with numpy, slowly: a test
of the algorithm and its indexing, not of speed), whether or not the machine has a GPU. The
interpreter is switched on (`triton.knobs.runtime.interpret`, i.e. TRITON_INTERPRET=1) only
while its kernel is defined and run. One difference: triton 3.9's interpreter computes `tl.dot`
of two bfloat16 (or float16) tiles wrongly (errors of 1e10 on a 16 x 16 product of N(0, 1)
entries, checked here), so under the interpreter the tiles are upcast to float32 before each dot
(`UPCAST`); on a GPU the dots take the low-precision tiles and accumulate in float32. Triton is
an optional, test-time dependency (`pip install triton`; torch's CUDA wheels bring their own):
`available()` says whether it is installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
from collections.abc import Iterator

import torch

from mha.validate import require_bool, require_int, require_tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes the kernel takes (float8 has no exact path here: refused, not answered wrongly)."""

MAX_ELEMENTS = 2**31 - 1
"""The kernel's offsets (bh * T * D + ...) are int32: larger q, k or v would wrap around."""


def available() -> bool:
    """True when the triton package is installed."""
    return importlib.util.find_spec("triton") is not None


@contextlib.contextmanager
def _triton_mode(interpret: bool) -> Iterator[None]:
    """Triton's interpreter on (CPU tensors) or off (CUDA tensors) for the duration, then as it was."""
    import triton  # imported here, outside the switch: triton.language keeps the mode it loads in

    knobs = getattr(triton, "knobs", None)
    if knobs is not None and knobs.runtime.interpret == interpret:  # already so: nothing to switch
        yield
        return
    if knobs is not None:  # triton >= 3.4: the knob (and TRITON_INTERPRET with it) restored on exit
        with knobs.runtime.scope():
            knobs.runtime.interpret = interpret
            yield
        return
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


@functools.cache
def _kernel(interpret: bool):
    """Define the kernel once per mode: in Triton's interpreter (CPU tensors) or compiled (CUDA)."""
    import triton
    import triton.language as tl

    with _triton_mode(interpret):

        @triton.jit
        def flash_forward_kernel(Q, K, V, Out, LSE, T, S, offset, scale, H, GROUP,
                                 CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr,
                                 BLOCK_K: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr):
            # Row max and row sum by tl.reduce with triton's own combine functions, not tl.max /
            # tl.sum: those are @jit helpers fixed to the mode triton was imported in, and the
            # interpreter would refuse them in a process whose triton was imported for compiling.
            i = tl.program_id(0)  # which block of queries
            bh = tl.program_id(1)  # which (batch, head)
            kv = (bh // H) * (H // GROUP) + (bh % H) // GROUP  # the key/value head it shares (GQA)
            rows = i * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BLOCK_Q,) query positions
            dims = tl.arange(0, D)  # (D,)
            q = tl.load(Q + bh * T * D + rows[:, None] * D + dims[None, :],
                        mask=rows[:, None] < T, other=0.0)  # (BLOCK_Q, D)
            if UPCAST:  # the interpreter's tl.dot is wrong for bfloat16 / float16: dot in float32
                q = q.to(tl.float32)
            m = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # running row max
            ell = tl.full([BLOCK_Q], 0.0, tl.float32)  # running sum of exp(score - m)
            acc = tl.full([BLOCK_Q, D], 0.0, tl.float32)  # unnormalised output
            hi = S
            if CAUSAL:  # the block's last query sees keys < (i + 1) * BLOCK_Q + offset: no tile after
                hi = tl.minimum(S, (i + 1) * BLOCK_Q + offset)
            for s0 in range(0, hi, BLOCK_K):
                cols = s0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,) key positions
                k = tl.load(K + kv * S * D + cols[:, None] * D + dims[None, :],
                            mask=cols[:, None] < S, other=0.0)  # (BLOCK_K, D)
                if UPCAST:
                    k = k.to(tl.float32)
                scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_Q, BLOCK_K)
                ok = (cols[None, :] < S) & (rows[:, None] >= 0)
                if CAUSAL:
                    ok = ok & (cols[None, :] <= rows[:, None] + offset)
                scores = tl.where(ok, scores, float("-inf"))
                m_new = tl.maximum(m, tl.reduce(scores, 1, tl.standard._elementwise_max))  # (BLOCK_Q,)
                base = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: no NaN
                p = tl.exp(scores - base[:, None])  # (BLOCK_Q, BLOCK_K); masked -> 0
                alpha = tl.exp(m - base)  # rescales what was summed under the old max
                ell = ell * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
                v = tl.load(V + kv * S * D + cols[:, None] * D + dims[None, :],
                            mask=cols[:, None] < S, other=0.0)  # (BLOCK_K, D)
                if UPCAST:
                    v = v.to(tl.float32)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")  # (BLOCK_Q, D)
                m = m_new
            safe = tl.where(ell > 0, ell, 1.0)  # a row with no key stays 0, like steps.softmax
            out = acc / safe[:, None]  # (BLOCK_Q, D)
            lse = tl.where(ell > 0, m + tl.log(safe), float("-inf"))  # (BLOCK_Q,)
            tl.store(Out + bh * T * D + rows[:, None] * D + dims[None, :],
                     out.to(Out.dtype.element_ty), mask=rows[:, None] < T)
            tl.store(LSE + bh * T + rows, lse, mask=rows < T)

        return flash_forward_kernel

def _power_of_two(name: str, n: int, least: int) -> int:
    n = require_int(name, n)
    if n < least or n & (n - 1):
        raise ValueError(f"{name} must be a power of two >= {least} (Triton's tl.arange and tl.dot "
                         f"need one), got {n}")
    return n


def _require_tensors(q: object, k: object, v: object) -> None:
    """q, k and v must be torch tensors."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, t)


def interpreted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when the kernel runs in Triton's interpreter for these tensors (CPU), False when compiled (CUDA)."""
    _require_tensors(q, k, v)
    devices = [t.device for t in (q, k, v)]
    if len(set(devices)) > 1:
        raise ValueError(f"q, k and v must be on one device, got {', '.join(map(str, devices))}")
    if devices[0].type not in ("cpu", "cuda"):
        raise ValueError(f"q, k and v must be CPU tensors (Triton's interpreter) or CUDA tensors "
                         f"(the compiled kernel), got device {devices[0]}")
    return devices[0].type == "cpu"


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Check q (B, h, T, d_k) and k, v (B, h_kv, S, d_k) (h_kv dividing h) of one float dtype; return (B, h, T, S, d_k)."""
    _require_tensors(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] \
            or q.shape[1] % max(k.shape[1], 1) or (k.shape[1] == 0) != (q.shape[1] == 0) \
            or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"expected q (B, h, T, d_k) and k, v (B, h_kv, S, d_k) with h_kv dividing "
                         f"h, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, h, T, d = q.shape
    S = k.shape[2]
    _power_of_two("d_k", d, 16)
    biggest = max(q.numel(), k.numel())
    if biggest > MAX_ELEMENTS:
        raise ValueError(f"q, k and v must have at most 2**31 - 1 elements each (the kernel's "
                         f"offsets are int32), got {biggest}")
    return B, h, T, S, d


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  offset: int = 0, block_q: int = 64, block_k: int = 64
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 3-6 in the Triton kernel: q (B, h, T, d_k), k, v (B, h_kv, S, d_k) -> (out (B, h, T, d_k), lse (B, h, T)).

    The contract of `flash.flash_attention` (causal query t sees keys s <= t + offset; lse in
    float32, -inf for a row with no key), for d_k a power of two >= 16 and float16, bfloat16,
    float32 or float64 tensors, all on the CPU (interpreter) or all on one CUDA device.
    Grouped-query heads (h_kv < h) are read in place: query head j uses key/value head
    j // (h / h_kv), the order of `torch_attention.repeat_kv`; nothing is repeated in memory.
    """
    if not available():
        raise ModuleNotFoundError("mha.attention.triton_flash needs the triton package: pip install triton")
    B, h, T, S, d = _check(q, k, v)
    causal = require_bool("causal", causal)
    offset = require_int("offset", offset, minimum=-(2**63))
    block_q, block_k = _power_of_two("block_q", block_q, 16), _power_of_two("block_k", block_k, 16)
    interpret = interpreted(q, k, v)
    offset = min(max(offset, -T), S)  # the same mask (none visible .. all visible), and int32-safe
    qc, kc, vc = (t.contiguous() for t in (q, k, v))  # (B, h, T|S, d_k), rows of d_k numbers
    out = torch.empty_like(qc)  # (B, h, T, d_k)
    lse = torch.empty((B, h, T), dtype=torch.float32, device=q.device)  # (B, h, T)
    if out.numel() == 0:
        return out, lse  # no query: nothing to launch
    if not interpret:
        _require_compiled_language()
    kernel = _kernel(interpret)
    grid = (-(-T // block_q), B * h)  # one program per (query block, batch x head)
    on_device = contextlib.nullcontext() if interpret else torch.cuda.device(q.device)  # launch where they live
    with _triton_mode(interpret), on_device:
        kernel[grid](qc, kc, vc, out, lse, T, S, offset, 1.0 / math.sqrt(d), h, h // k.shape[1],
                     CAUSAL=causal, BLOCK_Q=block_q, BLOCK_K=block_k, D=d,
                     UPCAST=interpret and q.dtype in (torch.bfloat16, torch.float16))
    return out, lse


def _require_compiled_language() -> None:
    """Refuse to compile when triton.language was loaded for the interpreter: its helpers cannot be compiled."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    if not isinstance(tl.standard._elementwise_max, JITFunction):
        raise RuntimeError(
            "triton was imported with TRITON_INTERPRET=1 set, so triton.language's helpers are "
            "interpreter functions the compiler cannot use, and CUDA tensors need the compiled "
            "kernel. Start Python without TRITON_INTERPRET (CPU tensors still run in the interpreter).")
