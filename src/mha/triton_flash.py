"""The tiled forward of `mha.flash` as a Triton kernel: one program per (query block, batch x head).

The same loop as `flash._tiled`, written for a GPU: each program loads one block of queries,
streams the key/value tiles (none above the diagonal when causal), keeps the running max `m`,
the sum `ell` and the unnormalised output `acc` in float32 registers, and writes the output and
the row logsumexp once. Scores and accumulation are float32 whatever the inputs' dtype (mixed
precision, as `torch_mha.compute_dtype` does); P is cast to the values' dtype for the P V
matmul, as FlashAttention does.

Without a CUDA GPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 while the kernel
is defined and run): the same code, executed with numpy on CPU tensors, slowly. It is a test of
the algorithm and its indexing, not of speed. One difference: triton 3.9's interpreter computes
`tl.dot` of two bfloat16 (or float16) tiles wrongly (errors of 1e10 on a 16 x 16 product of
N(0, 1) entries, checked here), so under the interpreter the tiles are upcast to float32 before
each dot (`UPCAST`); on a GPU the dots take the low-precision tiles and accumulate in float32. Triton is an optional, test-time dependency
(`pip install triton`; torch's CUDA wheels bring their own): `available()` says whether it is
installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
from collections.abc import Iterator

import torch

from .validate import require_int


def available() -> bool:
    """True when the triton package is installed."""
    return importlib.util.find_spec("triton") is not None


@contextlib.contextmanager
def _interpreted() -> Iterator[None]:
    """TRITON_INTERPRET=1 for the duration when there is no CUDA device (triton reads it when a
    kernel is defined and while it runs), and the variable as it was afterwards."""
    if torch.cuda.is_available():
        yield
        return
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


@contextlib.contextmanager
def _explained() -> Iterator[None]:
    """Turn the interpreter's failure after an earlier compiled-mode import of triton into advice."""
    try:
        yield
    except Exception as exc:
        if "outside of the scope of a kernel" not in str(exc):
            raise
        raise RuntimeError(
            "triton was imported in this process before TRITON_INTERPRET=1 was set (torch.compile "
            "can do that), so its tl.max / tl.sum are compiled-mode functions the interpreter "
            "cannot call. Start Python with TRITON_INTERPRET=1 (e.g. TRITON_INTERPRET=1 jupyter "
            "lab) or call mha.triton_flash before anything else uses triton.") from exc


@functools.cache
def _kernel():
    """Define the kernel once (in Triton's interpreter when there is no CUDA device)."""
    with _interpreted():
        import triton
        import triton.language as tl

        @triton.jit
        def flash_forward_kernel(Q, K, V, Out, LSE, T, S, offset, scale,
                                 CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr,
                                 BLOCK_K: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr):
            i = tl.program_id(0)  # which block of queries
            bh = tl.program_id(1)  # which (batch, head)
            rows = i * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BLOCK_Q,) query positions
            dims = tl.arange(0, D)  # (D,)
            q = tl.load(Q + bh * T * D + rows[:, None] * D + dims[None, :],
                        mask=rows[:, None] < T, other=0.0)  # (BLOCK_Q, D)
            if UPCAST:  # the interpreter's tl.dot is wrong for bfloat16 / float16: dot in float32
                q = q.to(tl.float32)
            m = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # running row max
            ell = tl.zeros([BLOCK_Q], tl.float32)  # running sum of exp(score - m)
            acc = tl.zeros([BLOCK_Q, D], tl.float32)  # unnormalised output
            hi = S
            if CAUSAL:  # key tiles wholly above the diagonal are never loaded
                hi = tl.minimum(S, (i + 1) * BLOCK_Q + offset)
            for s0 in range(0, hi, BLOCK_K):
                cols = s0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,) key positions
                k = tl.load(K + bh * S * D + cols[:, None] * D + dims[None, :],
                            mask=cols[:, None] < S, other=0.0)  # (BLOCK_K, D)
                if UPCAST:
                    k = k.to(tl.float32)
                scores = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_Q, BLOCK_K), float32
                ok = (cols[None, :] < S) & (rows[:, None] >= 0)
                if CAUSAL:
                    ok = ok & (cols[None, :] <= rows[:, None] + offset)
                scores = tl.where(ok, scores, float("-inf"))
                m_new = tl.maximum(m, tl.max(scores, 1))  # (BLOCK_Q,)
                base = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: no NaN
                p = tl.exp(scores - base[:, None])  # (BLOCK_Q, BLOCK_K); masked -> 0
                alpha = tl.exp(m - base)  # rescales what was summed under the old max
                ell = ell * alpha + tl.sum(p, 1)
                v = tl.load(V + bh * S * D + cols[:, None] * D + dims[None, :],
                            mask=cols[:, None] < S, other=0.0)  # (BLOCK_K, D)
                if UPCAST:
                    v = v.to(tl.float32)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # (BLOCK_Q, D)
                m = m_new
            safe = tl.where(ell > 0, ell, 1.0)  # a row with no key stays 0, like steps.softmax
            out = acc / safe[:, None]  # (BLOCK_Q, D)
            lse = tl.where(ell > 0, m + tl.log(safe), float("-inf"))  # (BLOCK_Q,)
            tl.store(Out + bh * T * D + rows[:, None] * D + dims[None, :],
                     out.to(Out.dtype.element_ty), mask=rows[:, None] < T)
            tl.store(LSE + bh * T + rows, lse, mask=rows < T)

        return flash_forward_kernel, triton.cdiv


def _power_of_two(name: str, n: int, least: int) -> int:
    n = require_int(name, n)
    if n < least or n & (n - 1):
        raise ValueError(f"{name} must be a power of two >= {least} (Triton's tl.arange and tl.dot "
                         f"need one), got {n}")
    return n


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  offset: int = 0, block_q: int = 64, block_k: int = 64
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 3-6 in the Triton kernel: q (B, h, T, d_k), k, v (B, h, S, d_k) -> (out (B, h, T, d_k), lse (B, h, T)).

    The contract of `flash.flash_attention` (causal query t sees keys s <= t + offset; lse in
    float32, -inf for a row with no key), for d_k a power of two >= 16.
    """
    if not available():
        raise ModuleNotFoundError("mha.triton_flash needs the triton package: pip install triton")
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[:2] != k.shape[:2] \
            or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"expected q (B, h, T, d_k) and k, v (B, h, S, d_k), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, h, T, d = q.shape
    S = k.shape[2]
    _power_of_two("d_k", d, 16)
    block_q, block_k = _power_of_two("block_q", block_q, 16), _power_of_two("block_k", block_k, 16)
    kernel, cdiv = _kernel()
    qc, kc, vc = (t.contiguous() for t in (q, k, v))  # (B, h, T|S, d_k), rows of d_k numbers
    out = torch.empty_like(qc)  # (B, h, T, d_k)
    lse = torch.empty((B, h, T), dtype=torch.float32, device=q.device)
    grid = (cdiv(T, block_q), B * h)  # one program per (query block, batch x head)
    with _interpreted(), _explained():
        kernel[grid](qc, kc, vc, out, lse, T, S, int(offset), 1.0 / math.sqrt(d),
                     CAUSAL=bool(causal), BLOCK_Q=block_q, BLOCK_K=block_k, D=d,
                     UPCAST=q.dtype in (torch.bfloat16, torch.float16) and not torch.cuda.is_available())
    return out, lse
