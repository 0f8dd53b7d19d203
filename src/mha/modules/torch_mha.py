"""Multi-head attention in PyTorch: the numpy module's twin, built on `F.scaled_dot_product_attention`.

The class holds the weights and the forward pass only; moving weights to and from numpy
and nn.MultiheadAttention lives in `mha.modules.convert` (a mixin, so the methods are the same),
and the shape ledger in `mha.ledger`.

Same names, same forward signature and same errors as `mha.modules.numpy_mha.MultiHeadAttention`;
the seven steps map one to one (see 09_pytorch_port.ipynb):

    1) project            nn.Linear (or one fused Linear + split); k, v to n_kv_heads heads
    2) split heads        .view(B, T, h, d_k).transpose(1, 2)
    3-6) attention core   `torch_attention.attention(q, k, v, spec, bias, backend=...)` on a
                          named backend: "sdpa" (F.scaled_dot_product_attention), "manual"
                          (scores, mask, safe softmax, weights @ v; keeps .attn), "flex"
                          (FlexAttention) or "triton" (12_flash_attention.ipynb's kernel); the mask goes in
                          as one `masking.MaskSpec` that each backend lowers its own way
    7) merge heads        .transpose(1, 2).reshape(B, T, d_model), then out_proj

The options (n_kv_heads, rope, alibi, window) and the forward's positions and cache are the
numpy module's, hooked in by `mha.modules.compose` the same way.

Shape legend: B batch, T query length, S key length, h heads, d_k = d_model // h.

Two layout facts to remember:
  * numpy stores a projection as W of shape (in, out) and computes `x @ W`; nn.Linear stores
    `weight` of shape (out, in) and computes `x @ weight.T`. Moving weights either way is a
    transpose (`from_numpy` / `to_numpy`).
  * Boolean masks: SDPA and this module use True = may attend; nn.MultiheadAttention uses
    the opposite, True = masked out (`torch_mha_forward` flips it for you).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mha import ledger
from mha.attention import torch_attention
from mha.attention.backends import Call
from mha.attention.posenc import alibi_slopes
from mha.inference.kv_cache import TorchKVCache
from mha.inference.paged import TorchPagedKVCache
from mha.ledger import LedgerRow
from mha.modules import compose, numpy_mha
from mha.modules.convert import WeightConversion
from mha.validate import (
    mask_shape,
    require_bool,
    require_float,
    require_heads,
    require_int,
    require_query_and_context,
)


def allowed_mask(
    B: int, h: int, T: int, S: int, causal: bool, mask, device=None
) -> torch.Tensor | None:
    """Combine `causal` and a boolean `mask` (True = may attend) into one mask broadcastable to (B, h, T, S)."""
    if mask is not None:
        mask_shape(mask, B, h, T, S)  # dtype and shape first, the same errors as numpy
        mask = mask.to(device) if isinstance(mask, torch.Tensor) else torch.as_tensor(mask, device=device)
    T_pos, S_pos = torch.arange(T, device=device), torch.arange(S, device=device)
    return compose.allowed(T_pos, S_pos, causal, None, mask, B, h)  # None or (.., T, S)


def project_qkv(m: MultiHeadAttention, x: torch.Tensor, ctx: torch.Tensor):
    """Step 1: q from x (B, T, d_model); k, v (B, S, h_kv * d_k) from ctx, separate or fused."""
    if not m.fused_qkv:
        return m.q_proj(x), m.k_proj(ctx), m.v_proj(ctx)
    sizes = [m.d_model, m.n_kv_heads * m.d_k, m.n_kv_heads * m.d_k]  # q, k, v rows of qkv_proj
    if ctx is x:  # one GEMM: (B, T, d_model) @ (d_model, d_model + 2 h_kv d_k)
        return m.qkv_proj(x).split(sizes, dim=-1)  # (B, T, d_model), 2 x (B, T, h_kv * d_k)
    W_q, W_kv = m.qkv_proj.weight.split([sizes[0], 2 * sizes[1]], dim=0)  # cross-attention:
    b_q, b_kv = m.qkv_proj.bias.split([sizes[0], 2 * sizes[1]], dim=0)  # q reads x, k and v ctx
    k, v = F.linear(ctx, W_kv, b_kv).chunk(2, dim=-1)  # (B, S, 2 h_kv d_k) -> 2 x (B, S, h_kv d_k)
    return F.linear(x, W_q, b_q), k, v


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k), the twin of mha.steps.split_heads (a view, no copy)."""
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)  # (B,T,h,d_k) -> (B,h,T,d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, d_model), the twin of mha.steps.merge_heads.

    reshape, not view: after the transpose the tensor is usually not contiguous, and
    reshape copies exactly when it has to (09_pytorch_port.ipynb).
    """
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, h, d_k) -> (B, T, d_model)


# What `trace` writes for each call, in call order (see mha.ledger).
LEDGER_LABELS = {
    "project_qkv": [[("1 project", "q", "(B, T, d_model)"), ("1 project", "k", "(B, S, d_model)"),
                     ("1 project", "v", "(B, S, d_model)")]],
    "split_heads": [("2 split heads", "q", "(B, h, T, d_k)"), ("2 split heads", "k", "(B, h, S, d_k)"),
                    ("2 split heads", "v", "(B, h, S, d_k)")],
    "merge_heads": [("7 merge heads", "concat of heads", "(B, T, d_model)")],
}
CORE_LEDGER_LABELS = {  # recorded in mha.attention.torch_attention, where the core's kernels live
    "sdpa_attention": [("3-6 sdpa", "scaled_dot_product_attention", "(B, h, T, d_k)")],
    "manual_attention": [[("3-6 manual", "weights @ v", "(B, h, T, d_k)"),
                          ("3-5 manual", "attention weights", "(B, h, T, S)")]],
}


class MultiHeadAttention(WeightConversion, nn.Module):
    """Multi-head attention on `F.scaled_dot_product_attention`, the twin of the numpy module.

    `MultiHeadAttention(d_model, n_heads, seed)` draws exactly the weights the numpy module
    with the same seed draws (N(0, 1/d_model) weights, zero biases), so the two start equal.
    `backend` picks the core's kernel (`torch_attention.BACKENDS`): "sdpa" (default), "manual"
    (nanoGPT's `self.flash` switch; keeps the weights (B, h, T, S) on `.attn`; `use_sdpa=False`
    says the same), "flex" or "triton"; a forward may pick another for one call. A backend
    that cannot serve the module's options is refused when the module is built. `fused_qkv=True` uses one Linear for q, k, v (rows stacked q, k, v, the layout of
    nn.MultiheadAttention's in_proj_weight). The options are the numpy module's (`mha.modules.compose`):
    n_kv_heads, rope, rope_base, alibi, window. Shapes: x (B, T, d_model) -> (B, T, d_model).
    """

    def __init__(self, d_model: int, n_heads: int, seed: int = 0,
                 dtype: torch.dtype = torch.float32, fused_qkv: bool = False,
                 use_sdpa: bool = True, device=None, *, backend: str | None = None,
                 n_kv_heads: int | None = None, rope: str | None = None, rope_base: float = 10000.0,
                 alibi: bool = False, window: int | None = None, use_enable_gqa: bool = True):
        super().__init__()
        self.d_k = require_heads(d_model, n_heads)
        self.d_model, self.n_heads = int(d_model), int(n_heads)
        self.options = compose.check_options(self.n_heads, self.d_k, n_kv_heads, rope, rope_base,
                                             alibi, window)
        require_int("seed", seed, minimum=0)  # before nn.Linear draws from torch's global RNG
        fused_qkv, use_sdpa = (require_bool(n, v) for n, v in
                               (("fused_qkv", fused_qkv), ("use_sdpa", use_sdpa)))
        use_enable_gqa = require_bool("use_enable_gqa", use_enable_gqa)
        self.n_kv_heads = self.options.n_kv_heads
        self.group = self.n_heads // self.n_kv_heads
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        backend = ("sdpa" if use_sdpa else "manual") if backend is None else backend
        self.dtype, self.fused_qkv = dtype, bool(fused_qkv)
        self.backend = self._serving(backend, device)
        self.use_enable_gqa = bool(use_enable_gqa)
        kw, d_kv = dict(dtype=dtype, device=device), self.n_kv_heads * self.d_k
        if self.fused_qkv:
            self.qkv_proj = nn.Linear(d_model, d_model + 2 * d_kv, **kw)  # weight (out, in)
        else:
            self.q_proj = nn.Linear(d_model, d_model, **kw)  # weight (d_model out, d_model in)
            self.k_proj = nn.Linear(d_model, d_kv, **kw)  # (h_kv * d_k, d_model)
            self.v_proj = nn.Linear(d_model, d_kv, **kw)
        self.out_proj = nn.Linear(d_model, d_model, **kw)
        self.attn: torch.Tensor | None = None
        # Same draws as the numpy twin (float64), then cast: seed s gives the same module.
        self.load_numpy_(numpy_mha.MultiHeadAttention(d_model, n_heads, seed=seed,
                                                      **self.options.kwargs()))

    def _needs(self) -> frozenset[str]:
        """The features every call of this module needs from its backend (its options)."""
        needs = {"gqa"} if self.n_kv_heads != self.n_heads else set()
        needs |= {"bias"} if self.options.alibi else set()
        return frozenset(needs | ({"window"} if self.options.window is not None else set()))

    def _serving(self, backend: str, device=None) -> str:
        """`backend` if it can serve this module's options (and dtype, on CUDA); else ValueError.

        Other devices (a "meta" module built for its shapes) are checked when a forward runs.
        """
        dev = "cuda" if device is not None and torch.device(device).type == "cuda" else "cpu"
        dtype = str(self.dtype).removeprefix("torch.")
        torch_attention.BACKENDS.check(backend, Call(dev, dtype, self._needs()))
        return backend

    @property
    def use_sdpa(self) -> bool:
        """True on the SDPA backend; setting False switches to the manual path (and back)."""
        return self.backend == "sdpa"

    @use_sdpa.setter
    def use_sdpa(self, on: bool) -> None:
        self.backend = "sdpa" if on else "manual"

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, causal: bool = False,
                mask=None, positions=None, cache=None, core=None, backend: str | None = None
                ) -> torch.Tensor:
        """Attend from x (B, T, d_model) to context (B, S, d_model; default x) -> (B, T, d_model).

        Same arguments as the numpy twin: `causal`, a boolean `mask` (True = may attend),
        `positions` (T,) or (B, T) (negative = padding) and a TorchKVCache or TorchPagedKVCache
        `cache` (a paged one takes no `mask`).
        The manual backend keeps the weights (B, h, T, S) on `.attn`. `backend` runs this call
        on another backend than the module's (`torch_attention.BACKENDS`); `mask` may also be a
        `masking.MaskSpec` (packed documents), joined with the module's own rules.
        `core` replaces steps 3-6 for self-attention on a slice of a longer sequence (see
        `mha.parallel.ring.ring_core`): it gets q (B, h, T, d_k), k, v (B, h_kv, T, d_k), their
        positions (T,) and `rule(q_pos, k_pos) -> (allowed, bias)`, this module's masks and
        ALiBi for any two sets of positions, and returns the heads (B, h, T, d_k).
        """
        B, T, S = self._check_inputs(x, context, mask, cache)
        causal = compose.require_causal(causal, self.options.window)
        backend = self.backend if backend is None else self._serving(backend, x.device)
        if core is not None:
            return self._forward_with_core(x, causal, positions, core, context, mask, cache)
        q_pos = compose.query_positions(positions, B, T, cache, x)  # (T,) or (B, T)
        k_pos = q_pos if context is None else torch.arange(S, device=x.device)
        q, k, v = project_qkv(self, x, x if context is None else context)  # 1) (B, T|S, ...)
        q = split_heads(q, self.n_heads)  # 2) (B, h, T, d_k)
        k, v = (split_heads(a, self.n_kv_heads) for a in (k, v))  # (B, h_kv, S, d_k)
        q, k = compose.rotate(q, q_pos, self.options), compose.rotate(k, k_pos, self.options)
        if cache is not None:  # the past joins: k, v (B, h_kv, S_all, d_k), k_pos (B, S_all)
            k, v, k_pos = cache.update(k, v, k_pos.expand(B, T))
            q_pos, k_pos = _one_row(q_pos), _one_row(k_pos)  # (T,), (S_all,) when rows agree
        # one description of what may be attended; each backend lowers it (SDPA: no mask or
        # is_causal where exact, Flex: a BlockMask, the manual path: a dense mask)
        spec = compose.mask_spec(q_pos, k_pos, causal, self.options.window, _on(mask, x.device),
                                 B, self.n_heads)
        bias, options = self._bias(backend, q_pos, k_pos, q.dtype)
        heads, weights = torch_attention.attention(q, k, v, spec, bias, backend=backend,
                                                   **options)  # 3-6) the one core
        self.attn = None if weights is None else weights.detach()
        merged = merge_heads(heads)  # 7) (B, h, T, d_k) -> (B, T, d_model) ...
        return self.out_proj(merged)  # ... then the output projection

    def _bias(self, backend: str, q_pos: torch.Tensor, k_pos: torch.Tensor, dtype: torch.dtype
              ) -> tuple[torch.Tensor | None, dict]:
        """ALiBi for this call (a bias tensor, or Flex's score_mod on positions) and the backend's options."""
        options = {}
        if backend in ("sdpa", "flex") and not self.use_enable_gqa:
            options["enable_gqa"] = False  # repeat the shared heads first, the explicit way
        if not self.options.alibi:
            return None, options
        if backend == "flex":  # a score_mod that reads positions, not a (B, h, T, S) table
            slopes = torch.as_tensor(alibi_slopes(self.n_heads), dtype=dtype, device=q_pos.device)
            return None, options | {"score_mod": torch_attention.alibi_score_mod(slopes, q_pos, k_pos)}
        return compose.alibi(self.options, self.n_heads, q_pos, k_pos, dtype), options

    def _forward_with_core(self, x, causal, positions, core, context, mask, cache) -> torch.Tensor:
        """Steps 1-2 and 7 here, steps 3-6 by `core`, for x (B, T, d_model) at `positions`."""
        if context is not None or mask is not None or cache is not None:
            given = [n for n, a in (("context", context), ("mask", mask), ("cache", cache))
                     if a is not None]
            raise ValueError(f"a core= forward is self-attention over positions: it takes causal "
                             f"and positions, not {', '.join(given)}")
        B, T = x.shape[0], x.shape[1]
        pos = compose.query_positions(positions, B, T, None, x)  # (T,) global positions
        if pos.ndim != 1:
            raise ValueError(f"a core= forward takes positions of shape (T,), got {tuple(pos.shape)}")
        q, k, v = project_qkv(self, x, x)  # 1) (B, T, d_model), 2 x (B, T, h_kv * d_k)
        q = split_heads(q, self.n_heads)  # 2) (B, h, T, d_k)
        k, v = (split_heads(a, self.n_kv_heads) for a in (k, v))  # (B, h_kv, T, d_k)
        q, k = compose.rotate(q, pos, self.options), compose.rotate(k, pos, self.options)

        def rule(q_pos: torch.Tensor, k_pos: torch.Tensor):
            """This module's mask (None or (.., T_q, T_k)) and ALiBi bias for these positions."""
            allowed = compose.allowed(q_pos, k_pos, causal, self.options.window, None, B,
                                      self.n_heads)
            return allowed, compose.alibi(self.options, self.n_heads, q_pos, k_pos, q.dtype)

        heads = core(q, k, v, pos, pos, rule)  # 3-6) (B, h, T, d_k), across ranks
        self.attn = None
        return self.out_proj(merge_heads(heads))  # 7) (B, T, d_model)

    def trace(self, x, context=None, causal=False, mask=None) -> list[LedgerRow]:
        """Run forward once (without autograd) and return the shape ledger of every tensor it made."""
        with torch.no_grad(), ledger.recording(sys.modules[__name__], LEDGER_LABELS) as rows, \
                ledger.recording(torch_attention, CORE_LEDGER_LABELS) as core:
            out = self.forward(x, context=context, causal=causal, mask=mask)
        last = LedgerRow("7 project", "out = out_proj(merged)", "(B, T, d_model)", tuple(out.shape))
        # rows: project (3), split heads (3), merge heads (1); the core ran between split and merge
        return ledger.input_rows(x, context) + rows[:-1] + core + rows[-1:] + [last]

    def new_cache(self, B: int, max_len: int) -> TorchKVCache:
        """A KV cache for this module on its device: (B, h_kv, max_len, d_k), or a ring of `window` slots."""
        return TorchKVCache(B, self.n_kv_heads, max_len, self.d_k, self.dtype,
                            self.out_proj.weight.device, window=self.options.window)

    def num_parameters(self) -> int:
        """Total number of learnable numbers (4 * d_model**2 + 4 * d_model without GQA)."""
        return sum(p.numel() for p in self.parameters())

    def extra_repr(self) -> str:
        extra = self.options.describe(self.n_heads)
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_k={self.d_k}, "
                f"dtype={self.dtype}, fused_qkv={self.fused_qkv}, backend={self.backend!r}"
                + (f", {extra}" if extra else ""))

    def _check_inputs(self, x, context, mask=None, cache=None) -> tuple[int, int, int]:
        """Validate x and context like the numpy module does, plus torch-only checks."""
        for name, a in (("x", x), ("context", context)):
            if a is not None and isinstance(a, np.ndarray):
                raise TypeError(f"{name} must be a torch.Tensor, got a numpy array "
                                f"(convert with torch.from_numpy({name}))")
        B, T, S = require_query_and_context(x, context, self.d_model)
        device = self.out_proj.weight.device
        for name, a in (("x", x), ("context", context)):
            if a is None:
                continue
            if a.dtype != self.dtype:
                require_float(name, a)
                raise TypeError(
                    f"{name} must be {self.dtype} to match the weights, got {a.dtype} "
                    f"(convert with {name}.to({self.dtype}) or build the module with dtype={a.dtype})"
                )
            if a.device != device:
                raise ValueError(f"{name} is on {a.device} but the weights are on {device} "
                                 f"(move it with {name}.to('{device}'))")
        compose.check_cache(self, cache, (TorchKVCache, TorchPagedKVCache), B, T, context, mask)
        if mask is not None and not torch_attention.is_spec(mask):  # a MaskSpec: compose checks it
            mask_shape(mask, B, self.n_heads, T, S if cache is None else len(cache) + T)
        return B, T, S


def _one_row(pos: torch.Tensor) -> torch.Tensor:
    """Positions (B, n) whose rows are all equal as one row (n,), so the mask spec can tell a
    plain staircase (SDPA's is_causal) from per-sequence positions; else as they are."""
    if pos.ndim == 2 and bool((pos == pos[:1]).all()):
        return pos[0]  # (n,)
    return pos


def _on(mask, device) -> torch.Tensor | None:
    """A torch or numpy boolean mask as a tensor on `device` (None and a MaskSpec stay as they are)."""
    if mask is None or torch_attention.is_spec(mask) or (
            isinstance(mask, torch.Tensor) and mask.device == device):
        return mask
    return mask.to(device) if isinstance(mask, torch.Tensor) else torch.as_tensor(mask, device=device)


# ---- nn.MultiheadAttention: the same maths, the opposite mask convention -----------------------
def torch_mha_mask(allowed: torch.Tensor | None, B: int, h: int, T: int, S: int) -> torch.Tensor | None:
    """Turn our mask (True = may attend, broadcastable to (B, h, T, S)) into nn.MultiheadAttention's.

    nn.MultiheadAttention wants True = masked OUT, shaped (T, S) or (B*h, T, S): negate, expand.
    """
    if allowed is None:
        return None
    if allowed.dim() == 2:
        return ~allowed  # (T, S)
    full = allowed.expand(B, h, T, S)  # (B|1, h|1, T, S) -> (B, h, T, S)
    return ~full.reshape(B * h, T, S)  # (B*h, T, S): batch-major, as nn.MultiheadAttention expects


def torch_mha_forward(ref: nn.MultiheadAttention, x, context=None, causal=False, mask=None) -> torch.Tensor:
    """Call a batch_first nn.MultiheadAttention with this package's signature and mask convention.

    need_weights=False keeps it on the SDPA path; fully masked rows still come out NaN in its
    eval-mode fast path, so callers must give every query at least one key.
    """
    if not ref.batch_first:
        raise ValueError("build nn.MultiheadAttention with batch_first=True (inputs are (B, T, d_model))")
    ctx = x if context is None else context
    B, T, _ = x.shape
    S = ctx.shape[1]
    allowed = allowed_mask(B, ref.num_heads, T, S, causal, mask, x.device)
    attn_mask = torch_mha_mask(allowed, B, ref.num_heads, T, S)
    out, _ = ref(x, ctx, ctx, attn_mask=attn_mask, need_weights=False)  # (B, T, d_model)
    return out


# ---- capturing attention maps ----------------------------------------------------------------
@contextlib.contextmanager
def capture_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record every attention map (B, h, T, S) that `model`'s MultiHeadAttention layers compute.

    Inside the block each such layer runs the manual path, and a forward hook appends a
    copy of its `.attn` to the yielded list after every call (in call order). On exit the
    hooks are removed and each layer's `backend` is restored.
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} contains no mha.modules.torch_mha.MultiHeadAttention")
    maps: list[torch.Tensor] = []
    saved = [m.backend for m in layers]

    def hook(module, inputs, output):
        maps.append(module.attn.clone())

    handles = [m.register_forward_hook(hook) for m in layers]
    for m in layers:
        m.backend = "manual"
    try:
        yield maps
    finally:
        for m, s, hnd in zip(layers, saved, handles, strict=True):
            m.backend = s
            hnd.remove()
