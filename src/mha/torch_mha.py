"""Multi-head attention in PyTorch: the numpy module's twin, built on `F.scaled_dot_product_attention`.

The class holds the weights and the forward pass only; moving weights to and from numpy
and nn.MultiheadAttention lives in `mha.convert` (a mixin, so the methods are the same),
and the shape ledger in `mha.ledger`.

Same names, same forward signature and same errors as `mha.numpy_mha.MultiHeadAttention`;
the seven steps map one to one (see 09_pytorch_port.ipynb):

    1) project            nn.Linear (or one fused Linear + split); k, v to n_kv_heads heads
    2) split heads        .view(B, T, h, d_k).transpose(1, 2)
    3-6) attention core   `attention(q, k, v, mask, bias, backend)`: F.scaled_dot_product_attention
                          ("sdpa"), the manual path ("manual": scores, mask, safe softmax,
                          weights @ v; keeps .attn) or FlexAttention ("flex")
    7) merge heads        .transpose(1, 2).reshape(B, T, d_model), then out_proj

The options (n_kv_heads, rope, alibi, window) and the forward's positions and cache are the
numpy module's, hooked in by `mha.compose` the same way.

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

from . import compose, ledger, numpy_mha
from .convert import WeightConversion
from .kv_cache import TorchKVCache
from .ledger import LedgerRow
from .validate import (
    mask_shape,
    require_bool,
    require_float,
    require_heads,
    require_int,
    require_query_and_context,
    require_shape,
)

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


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, h_kv, S, d_k) -> (B, h_kv * n_rep, S, d_k), each head n_rep times in a row (numpy twin's order)."""
    n_rep = require_int("n_rep", n_rep)
    require_shape("x", x, (("B", None), ("h_kv", None), ("S", None), ("d_k", None)))
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)  # (B, h_kv * n_rep, S, d_k)


def masked_scores(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """Steps 3-4: q (B,h,T,d_k), k (B,h,S,d_k) -> scaled scores (B,h,T,S), plus bias, -inf where masked."""
    d_k = q.shape[-1]
    # 3) scores; math.sqrt keeps the dtype (a tensor sqrt would too, but this matches numpy)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    if bias is not None:
        scores = scores + bias  # ALiBi or any additive bias, after scaling (as SDPA adds attn_mask)
    # 4) mask with -inf before softmax, so masked keys get weight exactly 0
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))  # (B, h, T, S)
    return scores


LOW_PRECISION = (torch.float16, torch.bfloat16)
"""Input dtypes the manual path computes in float32 (`compute_dtype`)."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype steps 3-6 of the manual path run in: float32 for float16 / bfloat16, else dtype.

    Mixed precision as the fused kernels do it: the scores, the softmax and the weighted sum
    accumulate in float32, and only the results are rounded back to the input's dtype. A
    bfloat16 softmax would round every score to 8 significant bits first (and float16's scores
    overflow past 65504). The numpy twin does the same for float16 (`numpy_mha.compute_dtype`).
    """
    return torch.float32 if dtype in LOW_PRECISION else dtype


def upcast(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Each tensor in the dtype the manual path computes in (None stays None)."""
    return [None if t is None or not t.is_floating_point() else t.to(compute_dtype(t.dtype))
            for t in tensors]


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     allowed: torch.Tensor | None = None, bias: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 3-6 written out: q (B,h,T,d_k), k, v (B,h,S,d_k) -> (out (B,h,T,d_k), weights (B,h,T,S)).

    float16 / bfloat16 inputs are computed in float32 and both results rounded back once.
    """
    dtype = q.dtype
    q, k, v, bias = upcast(q, k, v, bias)
    weights = safe_softmax(masked_scores(q, k, allowed, bias))  # 5) (B, h, T, S), rows sum to 1 (or 0)
    out = weights @ v  # 6) (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
    return out.to(dtype), weights.to(dtype)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  allowed: torch.Tensor | None = None, bias: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The manual core on one block of keys, with each row's logsumexp: -> (out (B,h,T,d_k), lse (B,h,T)).

    out is normalised over this block only; lse = log sum_s exp(score_s) is what merging blocks
    needs (`mha.parallel.merge_partials`). A row with no allowed key gives out 0 and lse -inf.
    Both come in `compute_dtype` (float32 for float16 / bfloat16 inputs): they are partial
    results, to be merged first and rounded once at the end, as FlashAttention keeps its lse.
    """
    q, k, v, bias = upcast(q, k, v, bias)  # float16 / bfloat16: float32, as manual_attention
    scores = masked_scores(q, k, allowed, bias)  # (B, h, T, S)
    out = safe_softmax(scores) @ v  # (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k), as manual_attention
    return out, torch.logsumexp(scores, dim=-1)  # (B, h, T): -inf where every key is masked


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed=None, bias=None,
                   is_causal: bool = False, enable_gqa: bool = False) -> torch.Tensor:
    """Steps 3-6 in one fused call: q (B, h, T, d_k), k, v (B, h|h_kv, S, d_k) -> (B, h, T, d_k).

    A boolean mask goes in as is (True = may attend); with a bias, one float mask: the bias
    where allowed, -inf elsewhere. is_causal (top-left) lets kernels skip the masked half.
    """
    attn_mask = allowed
    if bias is not None:
        attn_mask = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          enable_gqa=enable_gqa)  # (B, h, T, d_k)


def flex_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed=None, bias=None,
              is_causal: bool = False, enable_gqa: bool = False) -> torch.Tensor:
    """Steps 3-6 in FlexAttention, from the same mask and bias tensors: -> (B, h, T, d_k).

    The mask becomes a mask_mod that looks it up, the bias a score_mod that adds it. Eager
    (no torch.compile) and, on CPU, inference only (torch 2.13 has no CPU flex backward).
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, h, T, _ = q.shape
    S = k.shape[2]
    if is_causal:
        allowed = causal_mask(T, S, device=q.device)
    block_mask = None
    if allowed is not None:
        full = allowed.expand(B, h, T, S)  # (B, h, T, S) view: one lookup per (b, head, t, s)
        block_mask = create_block_mask(lambda b, hh, t, s: full[b, hh, t, s], B, h, T, S,
                                       device=str(q.device))
    score_mod = None
    if bias is not None:
        full_bias = bias.expand(B, h, T, S)
        score_mod = lambda score, b, hh, t, s: score + full_bias[b, hh, t, s]  # noqa: E731
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                          enable_gqa=enable_gqa)  # (B, h, T, d_k)


BACKENDS = ("sdpa", "manual", "flex")
"""The torch core's backends: SDPA's fused kernels, steps 3-6 written out, FlexAttention."""


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, bias=None,
              backend: str = "sdpa", is_causal: bool = False, enable_gqa: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps 3-6, the one torch attention core: q (B,h,T,d_k), k, v (B,h_kv,S,d_k) -> (out, weights).

    The twin of `mha.numpy_mha.attention`: boolean `mask` (True = may attend) and additive
    `bias` broadcast to (B, h, T, S). `backend` picks the kernel: "sdpa", "manual" (the only
    one that returns the weights (B, h, T, S); the others return None) or "flex".
    `is_causal` is the top-left causal mask without a tensor. h_kv < h: SDPA and flex get
    `enable_gqa`; the manual path (or enable_gqa=False) repeats the heads first.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    h, h_kv = q.shape[1], k.shape[1]
    if h % h_kv:
        raise ValueError(f"k and v must have a number of heads h_kv that divides q's h={h} "
                         f"(grouped-query attention), got h_kv={h_kv}")
    if h_kv != h and (backend == "manual" or not enable_gqa):
        k, v = repeat_kv(k, h // h_kv), repeat_kv(v, h // h_kv)  # (B, h, S, d_k): shared heads
    gqa = k.shape[1] != h
    if backend == "manual":
        if is_causal:
            mask = causal_mask(q.shape[2], k.shape[2], device=q.device)  # (T, S)
        return manual_attention(q, k, v, mask, bias)
    core = sdpa_attention if backend == "sdpa" else flex_core
    return core(q, k, v, mask, bias, is_causal, gqa), None


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
    "sdpa_attention": [("3-6 sdpa", "scaled_dot_product_attention", "(B, h, T, d_k)")],
    "manual_attention": [[("3-6 manual", "weights @ v", "(B, h, T, d_k)"),
                          ("3-5 manual", "attention weights", "(B, h, T, S)")]],
    "merge_heads": [("7 merge heads", "concat of heads", "(B, T, d_model)")],
}


class MultiHeadAttention(WeightConversion, nn.Module):
    """Multi-head attention on `F.scaled_dot_product_attention`, the twin of the numpy module.

    `MultiHeadAttention(d_model, n_heads, seed)` draws exactly the weights the numpy module
    with the same seed draws (N(0, 1/d_model) weights, zero biases), so the two start equal.
    `backend` picks the core's kernel: "sdpa" (default), "manual" (nanoGPT's `self.flash`
    switch; keeps the weights (B, h, T, S) on `.attn`; `use_sdpa=False` says the same) or
    "flex". `fused_qkv=True` uses one Linear for q, k, v (rows stacked q, k, v, the layout of
    nn.MultiheadAttention's in_proj_weight). The options are the numpy module's (`mha.compose`):
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
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.dtype, self.fused_qkv, self.backend = dtype, bool(fused_qkv), backend
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

    @property
    def use_sdpa(self) -> bool:
        """True on the SDPA backend; setting False switches to the manual path (and back)."""
        return self.backend == "sdpa"

    @use_sdpa.setter
    def use_sdpa(self, on: bool) -> None:
        self.backend = "sdpa" if on else "manual"

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, causal: bool = False,
                mask=None, positions=None, cache=None, core=None) -> torch.Tensor:
        """Attend from x (B, T, d_model) to context (B, S, d_model; default x) -> (B, T, d_model).

        Same arguments as the numpy twin: `causal`, a boolean `mask` (True = may attend),
        `positions` (T,) or (B, T) (negative = padding) and a TorchKVCache `cache`.
        The manual backend keeps the weights (B, h, T, S) on `.attn`.
        `core` replaces steps 3-6 for self-attention on a slice of a longer sequence (see
        `mha.parallel.ring_core`): it gets q (B, h, T, d_k), k, v (B, h_kv, T, d_k), their
        positions (T,) and `rule(q_pos, k_pos) -> (allowed, bias)`, this module's masks and
        ALiBi for any two sets of positions, and returns the heads (B, h, T, d_k).
        """
        B, T, S = self._check_inputs(x, context, mask, cache)
        causal = compose.require_causal(causal, self.options.window)
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
        # plain causal self-attention needs no mask tensor: is_causal lets kernels skip tiles
        plain = causal and mask is None and cache is None and positions is None and not (
            self.options.alibi or self.options.window)
        allowed = None if plain else compose.allowed(q_pos, k_pos, causal, self.options.window,
                                                     _on(mask, x.device), B, self.n_heads)
        bias = compose.alibi(self.options, self.n_heads, q_pos, k_pos, q.dtype)  # or None
        heads, weights = attention(q, k, v, allowed, bias, self.backend, plain,
                                   self.use_enable_gqa)  # 3-6) the one core
        self.attn = None if weights is None else weights.detach()
        merged = merge_heads(heads)  # 7) (B, h, T, d_k) -> (B, T, d_model) ...
        return self.out_proj(merged)  # ... then the output projection

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
        with torch.no_grad(), ledger.recording(sys.modules[__name__], LEDGER_LABELS) as rows:
            out = self.forward(x, context=context, causal=causal, mask=mask)
        last = LedgerRow("7 project", "out = out_proj(merged)", "(B, T, d_model)", tuple(out.shape))
        return ledger.input_rows(x, context) + rows + [last]

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
        compose.check_cache(self, cache, TorchKVCache, B, T, context, mask)
        if mask is not None:
            mask_shape(mask, B, self.n_heads, T, S if cache is None else len(cache) + T)
        return B, T, S


def _on(mask, device) -> torch.Tensor | None:
    """A torch or numpy boolean mask as a tensor on `device` (None stays None)."""
    if mask is None or (isinstance(mask, torch.Tensor) and mask.device == device):
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
        raise ValueError(f"{type(model).__name__} contains no mha.torch_mha.MultiHeadAttention")
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
