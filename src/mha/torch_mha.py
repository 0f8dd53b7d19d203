"""Multi-head attention in PyTorch: the numpy module's twin, built on `F.scaled_dot_product_attention`.

The class holds the weights and the forward pass only; moving weights to and from numpy
and nn.MultiheadAttention lives in `mha.convert` (a mixin, so the methods are the same),
and the shape ledger in `mha.ledger`.

Same names, same forward signature and same errors as `mha.numpy_mha.MultiHeadAttention`;
the seven steps map one to one (see notebook 09):

    1) project            nn.Linear (or one fused Linear(d_model, 3*d_model) + chunk)
    2) split heads        .view(B, T, h, d_k).transpose(1, 2)
    3-6) attention core   F.scaled_dot_product_attention  - or, with use_sdpa=False, the
                          manual path: scores, mask, safe softmax, weights @ v (keeps .attn)
    7) merge heads        .transpose(1, 2).reshape(B, T, d_model), then out_proj

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
import math
import sys
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import ledger, numpy_mha
from .convert import WeightConversion
from .ledger import LedgerRow
from .validate import mask_shape, require_float, require_heads, require_query_and_context

_TORCH_TO_NUMPY = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}


def causal_mask(T: int, S: int | None = None, device=None) -> torch.Tensor:
    """Boolean (T, S) tensor, True where query t may attend to key s <= t (top-left aligned)."""
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril()  # (T, S)


def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis that turns an all -inf row into zeros, like mha.steps.softmax."""
    row_max = scores.amax(dim=-1, keepdim=True)  # (..., 1)
    # A fully masked row has max -inf; subtracting it would give -inf - -inf = NaN.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)  # masked scores give exp(-inf) = exactly 0
    total = e.sum(dim=-1, keepdim=True)  # (..., 1)
    # total is 0 only for a fully masked row, whose e is all zeros: divide by 1 there, so the
    # row stays 0 and no 0/0 appears (torch.where would still back-propagate NaN through it).
    return e / torch.where(total > 0, total, torch.ones_like(total))


def manual_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 3-6 written out: q (B,h,T,d_k), k, v (B,h,S,d_k) -> (out (B,h,T,d_k), weights (B,h,T,S))."""
    d_k = q.shape[-1]
    # 3) scores; math.sqrt keeps the dtype (a tensor sqrt would too, but this matches numpy)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    # 4) mask with -inf before softmax, so masked keys get weight exactly 0
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))  # (B, h, T, S)
    weights = safe_softmax(scores)  # 5) (B, h, T, S), rows sum to 1 (or are all 0)
    return weights @ v, weights  # 6) (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)


def _as_bool_tensor(mask, device) -> torch.Tensor:
    """A torch bool tensor on `device` from a torch or numpy boolean mask."""
    return mask.to(device) if isinstance(mask, torch.Tensor) else torch.as_tensor(mask, device=device)


def allowed_mask(
    B: int, h: int, T: int, S: int, causal: bool, mask, device=None
) -> torch.Tensor | None:
    """Combine `causal` and a boolean `mask` (True = may attend) into one mask broadcastable to (B, h, T, S)."""
    allowed = None
    if mask is not None:
        shape4 = mask_shape(mask, B, h, T, S)  # checks dtype and shape, same errors as numpy
        allowed = _as_bool_tensor(mask, device).reshape(shape4)  # (B|1, h|1, T, S)
    if causal:
        tril = causal_mask(T, S, device=device)  # (T, S)
        allowed = tril if allowed is None else allowed & tril  # broadcasts to (B|1, h|1, T, S)
    return allowed


def project_qkv(m: MultiHeadAttention, x: torch.Tensor, ctx: torch.Tensor):
    """Step 1: q from x (B, T, d_model); k, v from ctx (B, S, d_model), separate or fused."""
    if not m.fused_qkv:
        return m.q_proj(x), m.k_proj(ctx), m.v_proj(ctx)
    if ctx is x:  # one GEMM: (B, T, d_model) @ (d_model, 3*d_model) -> (B, T, 3*d_model)
        return m.qkv_proj(x).chunk(3, dim=-1)  # 3 x (B, T, d_model)
    d = m.d_model  # cross-attention: q reads x, k and v read the context
    W_q, W_kv = m.qkv_proj.weight.split([d, 2 * d], dim=0)  # (d, d), (2d, d)
    b_q, b_kv = m.qkv_proj.bias.split([d, 2 * d], dim=0)
    k, v = F.linear(ctx, W_kv, b_kv).chunk(2, dim=-1)  # (B, S, 2*d_model) -> 2 x (B, S, d_model)
    return F.linear(x, W_q, b_q), k, v  # (B, T, d_model), (B, S, d_model), (B, S, d_model)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k), the twin of mha.steps.split_heads (a view, no copy)."""
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)  # (B,T,h,d_k) -> (B,h,T,d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, d_model), the twin of mha.steps.merge_heads.

    reshape, not view: after the transpose the tensor is usually not contiguous, and
    reshape copies exactly when it has to (notebook 09).
    """
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, h, d_k) -> (B, T, d_model)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   mask=None) -> torch.Tensor:
    """Steps 3-6 in one fused call: q (B, h, T, d_k), k, v (B, h, S, d_k) -> (B, h, T, d_k).

    Causal-only goes in as is_causal=True (kernels skip the masked half); anything else as
    one boolean mask, True = may attend.
    """
    if causal and mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
    B, h, T, _ = q.shape
    allowed = allowed_mask(B, h, T, k.shape[2], causal, mask, q.device)  # None or (.., T, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, h, T, d_k)


# What `trace` writes for each call, in call order (see mha.ledger).
LEDGER_LABELS = {
    "project_qkv": [[("1 project", "q", "(B, T, d_model)"), ("1 project", "k", "(B, S, d_model)"),
                     ("1 project", "v", "(B, S, d_model)")]],
    "split_heads": [("2 split heads", "q", "(B, h, T, d_k)"), ("2 split heads", "k", "(B, h, S, d_k)"),
                    ("2 split heads", "v", "(B, h, S, d_k)")],
    "sdpa_attention": [("3-6 sdpa", "scaled_dot_product_attention", "(B, h, T, d_k)")],
    "manual_attention": [[("3-6 manual", "weights @ v", "(B, h, T, d_k)"),
                          ("3-5 manual", "attention weights", "(B, h, T, S)")]],
    "merge_heads": [("7 merge heads", "concat of heads", "(B, T, d_model)")],
}


class MultiHeadAttention(WeightConversion, nn.Module):
    """Multi-head attention on `F.scaled_dot_product_attention`, the twin of the numpy module.

    `MultiHeadAttention(d_model, n_heads, seed)` draws exactly the weights the numpy module
    with the same seed draws (N(0, 1/d_model) weights, zero biases), so the two start equal.
    `use_sdpa=False` switches to the manual path (nanoGPT's `self.flash` switch), which
    keeps the attention weights (B, h, T, S) on `.attn`; the SDPA path never forms them.
    `fused_qkv=True` uses one Linear(d_model, 3*d_model) for q, k, v (rows stacked q, k, v,
    the same layout as nn.MultiheadAttention's in_proj_weight).
    Shapes: x (B, T, d_model), context (B, S, d_model) -> (B, T, d_model).
    """

    def __init__(self, d_model: int, n_heads: int, seed: int = 0,
                 dtype: torch.dtype = torch.float32, fused_qkv: bool = False,
                 use_sdpa: bool = True, device=None):
        super().__init__()
        self.d_k = require_heads(d_model, n_heads)
        self.d_model, self.n_heads = int(d_model), int(n_heads)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        self.dtype, self.fused_qkv, self.use_sdpa = dtype, bool(fused_qkv), bool(use_sdpa)
        kw = dict(dtype=dtype, device=device)
        if self.fused_qkv:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, **kw)  # weight (3*d_model, d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model, **kw)  # weight (d_model out, d_model in)
            self.k_proj = nn.Linear(d_model, d_model, **kw)
            self.v_proj = nn.Linear(d_model, d_model, **kw)
        self.out_proj = nn.Linear(d_model, d_model, **kw)
        self.attn: torch.Tensor | None = None
        # Same draws as the numpy twin (float64), then cast: seed s gives the same module.
        self.load_numpy_(numpy_mha.MultiHeadAttention(d_model, n_heads, seed=seed))

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, causal: bool = False,
                mask=None) -> torch.Tensor:
        """Attend from x (B, T, d_model) to context (B, S, d_model; default x) -> (B, T, d_model).

        `causal=True` lets query t see keys s <= t. `mask` is boolean, True = may attend,
        shaped (T, S), (B, T, S) or (B|1, h|1, T, S); it is combined with `causal`.
        The manual path (use_sdpa=False) keeps the weights (B, h, T, S) on `.attn`.
        """
        B, T, S = self._check_inputs(x, context)
        h = self.n_heads
        q, k, v = project_qkv(self, x, x if context is None else context)  # 1) (B, T|S, d_model)
        q, k, v = (split_heads(a, h) for a in (q, k, v))  # 2) (B, h, T|S, d_k)
        if self.use_sdpa:  # 3-6) one fused kernel; it never forms the (T, S) weights
            heads, self.attn = sdpa_attention(q, k, v, causal, mask), None
        else:  # 3-6) written out: scores, -inf mask, safe softmax, weights @ v
            allowed = allowed_mask(B, h, T, S, causal, mask, x.device)
            heads, weights = manual_attention(q, k, v, allowed)  # (B,h,T,d_k), (B,h,T,S)
            self.attn = weights.detach()
        merged = merge_heads(heads)  # 7) (B, h, T, d_k) -> (B, T, d_model) ...
        return self.out_proj(merged)  # ... then the output projection

    def trace(self, x, context=None, causal=False, mask=None) -> list[LedgerRow]:
        """Run forward once (without autograd) and return the shape ledger of every tensor it made."""
        with torch.no_grad(), ledger.recording(sys.modules[__name__], LEDGER_LABELS) as rows:
            out = self.forward(x, context=context, causal=causal, mask=mask)
        last = LedgerRow("7 project", "out = out_proj(merged)", "(B, T, d_model)", tuple(out.shape))
        return ledger.input_rows(x, context) + rows + [last]

    def num_parameters(self) -> int:
        """Total number of learnable numbers (4 * d_model**2 + 4 * d_model)."""
        return sum(p.numel() for p in self.parameters())

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_k={self.d_k}, "
                f"dtype={self.dtype}, fused_qkv={self.fused_qkv}, use_sdpa={self.use_sdpa}")

    def _check_inputs(self, x, context) -> tuple[int, int, int]:
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
        return B, T, S


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
    hooks are removed and each layer's `use_sdpa` switch is restored.
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} contains no mha.torch_mha.MultiHeadAttention")
    maps: list[torch.Tensor] = []
    saved = [m.use_sdpa for m in layers]

    def hook(module, inputs, output):
        maps.append(module.attn.clone())

    handles = [m.register_forward_hook(hook) for m in layers]
    for m in layers:
        m.use_sdpa = False
    try:
        yield maps
    finally:
        for m, s, hnd in zip(layers, saved, handles, strict=True):
            m.use_sdpa = s
            hnd.remove()
