"""Positions and attention variants: RoPE, ALiBi, grouped-query attention, sliding windows, FlexAttention.

Shape legend: B batch, T query length, S key length, d_model, h query heads, h_kv key/value
heads (h_kv divides h; g = h / h_kv query heads share one key/value head), d_k = d_model / h.

Attention by itself does not know where a token is: permute the keys and the weights permute
with them. This module adds position the two common ways, where 16_positions_and_variants.ipynb
puts them:

    rope(x, positions, base)           rotate q and k (..., T, d_k) by their positions (numpy or torch);
                                       then q_m . k_n depends on m - n only (RoFormer)
    rope_scores(q, k, pq, pk)          scaled scores of rotated q and k (the named check of RoPE,
                                       check_relative, is in mha_course.diagnose.positions)
    alibi_slopes(h), alibi_bias(h, T)  ALiBi: add -slope_head * distance to the scores (Press et al.)
    attend / torch_attend              the seven steps with rope=True and/or alibi=True
                                       (numpy keeps the weights on module.attn; torch uses SDPA)

and the variants that change which keys a query reads:

    grouped-query attention            a module's n_kv_heads option (h_kv < h; MQA: h_kv = 1)
    gqa_from_mha(module, h_kv)         a trained MHA module as GQA, kv heads mean-pooled per group
    gqa_param_count(d_model, h, h_kv)  2 (d_model + 1)(d_model + h_kv d_k)
    sliding windows                    mha.attention.masks.sliding_window_mask, combined with padding masks
    FlexAttention                      the mask as `mha.attention.masking.MaskSpec` (flex_spec: its mask_mod
                                       and BlockMask), ALiBi as alibi_score_mod; flex_attend and
                                       torch_flex_attend

RoPE convention used here: the HALF SPLIT, as GPT-NeoX and Hugging Face's Llama code
(`rotate_half`) do: feature i is paired with feature i + d_k/2 and both turn by position * theta_i.
RoFormer, GPT-J and Meta's original Llama code rotate ADJACENT pairs (2i, 2i+1) instead; the two
differ by a fixed permutation of the d_k features (of q and k alike), so they give the same
scores once the projection weights are permuted to match (which is what Hugging Face's Llama
conversion script does).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import flex_attention

from mha import steps
from mha.attention.masking import MaskSpec
from mha.attention.posenc import alibi_slopes, rope
from mha.modules import compose, numpy_mha, torch_mha
from mha.validate import is_torch, require_heads, require_int

# ---- RoPE and ALiBi live in mha.attention.posenc (the modules use them too) ---------------
_rope = rope  # attend's flag is called `rope` too


def rope_scores(q: np.ndarray, k: np.ndarray, q_positions: Any = None,
                k_positions: Any = None) -> np.ndarray:
    """Scaled scores of rotated q (B, h, T, d_k) and k (B, h, S, d_k) -> (B, h, T, S): a correct score_fn."""
    return steps.scaled_scores(rope(q, q_positions), rope(k, k_positions))  # (B, h, T, S)


# ---- grouped-query attention: the modules' n_kv_heads option ----------------------------------------
def gqa_param_count(d_model: int, n_heads: int, n_kv_heads: int) -> int:
    """Weights and biases of one GQA block: 2 (d_model + 1)(d_model + h_kv d_k).

    Wq and Wo stay (d_model, d_model) with biases; Wk and Wv shrink to (d_model, h_kv d_k).
    With h_kv = h this is MultiHeadAttention's 4 d_model^2 + 4 d_model.
    """
    d_k = require_heads(d_model, n_heads)
    compose.check_options(n_heads, d_k, n_kv_heads)  # n_kv_heads must divide n_heads
    return 2 * (d_model + 1) * (d_model + n_kv_heads * d_k)


def gqa_from_mha(module: Any, n_kv_heads: int) -> Any:
    """A trained MHA module as GQA: each kv head is the MEAN of its group's heads (Ainslie et al., 2023).

    numpy in, numpy out; torch in, torch out: the same class built with n_kv_heads, Wq and Wo
    (and every other option) copied, Wk and Wv mean-pooled over each group of g = h / h_kv heads.
    """
    if isinstance(module, torch.nn.Module):
        pooled = gqa_from_mha(module.to_numpy(), n_kv_heads)  # pooled in float64
        twin = torch_mha.MultiHeadAttention.from_numpy(pooled, dtype=module.dtype,
                                                       backend=module.backend)
        return twin.to(module.out_proj.weight.device)
    if not isinstance(module, numpy_mha.MultiHeadAttention):
        raise TypeError(f"module must be a numpy or torch MultiHeadAttention, got "
                        f"{type(module).__name__}")
    if module.n_kv_heads != module.n_heads:
        raise ValueError(f"module must be plain multi-head attention (n_kv_heads = n_heads = "
                         f"{module.n_heads}), got n_kv_heads={module.n_kv_heads}")
    opts = dataclasses.replace(module.options, n_kv_heads=n_kv_heads).kwargs()
    out = numpy_mha.MultiHeadAttention(module.d_model, module.n_heads, dtype=module.dtype, **opts)
    d, g, d_k = module.d_model, out.group, module.d_k
    out.Wq, out.bq, out.Wo, out.bo = (a.copy() for a in (module.Wq, module.bq, module.Wo, module.bo))
    for name in ("k", "v"):
        W = getattr(module, f"W{name}").reshape(d, n_kv_heads, g, d_k)  # (d, h_kv, g, d_k)
        b = getattr(module, f"b{name}").reshape(n_kv_heads, g, d_k)  # (h_kv, g, d_k)
        setattr(out, f"W{name}", W.mean(axis=2).reshape(d, n_kv_heads * d_k))  # (d, h_kv*d_k)
        setattr(out, f"b{name}", b.mean(axis=1).reshape(n_kv_heads * d_k))  # (h_kv*d_k,)
    return out


def with_positions(module, rope: bool = False, alibi: bool = False):
    """A view of `module` (numpy or torch) that also uses RoPE ("half") and/or ALiBi; weights shared."""
    view = copy.copy(module)  # shallow: the same weight arrays / parameters, its own options
    view.options = dataclasses.replace(module.options, rope="half" if rope else module.options.rope,
                                       alibi=alibi or module.options.alibi)
    return view


# ---- the seven steps with positions, per call ---------------------------------------------------
def attend(module, x: np.ndarray, context: np.ndarray | None = None, causal: bool = False,
           mask: np.ndarray | None = None, rope: bool = False, alibi: bool = False) -> np.ndarray:
    """`module`'s forward with RoPE and/or ALiBi switched on for this call (numpy).

    rope=True rotates q (positions 0..T-1) and k (0..S-1) just before the scores; alibi=True adds
    alibi_bias(h, T, S) to the scaled scores before the mask. The weights (B, h, T, S) are kept
    on module.attn. x (B, T, d_model), context (B, S, d_model; default x) -> (B, T, d_model).
    """
    view = with_positions(module, rope, alibi)
    out = numpy_mha.MultiHeadAttention.forward(view, x, context, causal, mask)
    module.attn = view.attn
    return out


# ---- the torch twins -------------------------------------------------------------------------------
def torch_attend(module, x: torch.Tensor, context: torch.Tensor | None = None, causal: bool = False,
                 mask=None, rope: bool = False, alibi: bool = False) -> torch.Tensor:
    """Twin of `attend`: the torch module's forward with RoPE and/or ALiBi for this call."""
    return torch_mha.MultiHeadAttention.forward(with_positions(module, rope, alibi), x, context,
                                                causal, mask)


# ---- FlexAttention: the mask as MaskSpec.mask_mod / block_mask, ALiBi as a score_mod -------------
def flex_spec(T: int, S: int | None = None, causal: bool = False, window: int | None = None,
              lengths: torch.Tensor | None = None, device: Any = "cpu") -> MaskSpec:
    """The MaskSpec of causal / window / right padding (`lengths`) on `device`, for FlexAttention.

    Its `mask_mod()` is FlexAttention's mask_mod(b, h, q_idx, kv_idx), its `block_mask()` the
    BlockMask: the same description the modules, SDPA and the tiled kernels lower.
    """
    if lengths is not None and not is_torch(lengths):
        raise TypeError(f"lengths must be a torch tensor (B,) for FlexAttention, got "
                        f"{type(lengths).__name__}")
    window = None if window is None else require_int("window", window)
    if lengths is None:
        spec = MaskSpec.plain(T, S, causal=causal, like=torch.empty(0, device=device))
    else:
        spec = MaskSpec.padded(lengths.to(device), T, S, causal=causal)  # pads: document -1
    return spec if window is None else spec.with_(causal=True, window=window)


def alibi_score_mod(n_heads: int, offset: int = 0, dtype: torch.dtype = torch.float32,
                    device=None) -> Callable:
    """score_mod: score - slope[h] * |q_idx + offset - kv_idx|, the alibi_bias, added after scaling.

    The slopes are made once, in the scores' dtype and on their device: torch.compile cannot
    move a captured tensor between devices inside the fused kernel.
    """
    slopes = torch.as_tensor(alibi_slopes(n_heads), dtype=dtype, device=device)  # (h,)

    def mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
            kv_idx: torch.Tensor) -> torch.Tensor:
        distance = (q_idx + offset - kv_idx).abs().to(score.dtype)
        return score - slopes[h] * distance
    return mod


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                window: int | None = None, lengths: torch.Tensor | None = None,
                alibi: bool = False) -> torch.Tensor:
    """Steps 3-6 with FlexAttention: q (B, h, T, d_k), k, v (B, h_kv, S, d_k) -> (B, h, T, d_k).

    Eager (no torch.compile): correct, but it forms the whole (T, S) score matrix and warns so;
    torch.compile(flex_attention) is what turns the mods into one fused kernel. On CPU, torch
    2.13 has no FlexAttention backward: inputs that require grad raise NotImplementedError, so
    run it under torch.no_grad() there (inference only).
    """
    B, h, T, _ = q.shape
    S, h_kv = k.shape[2], k.shape[1]
    spec = flex_spec(T, S, causal, window, lengths, q.device)  # what may be attended
    block_mask = spec.block_mask(B, h, T, S, q.device)  # None when every key is allowed
    score_mod = alibi_score_mod(h, dtype=q.dtype, device=q.device) if alibi else None
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                          enable_gqa=h_kv < h)  # (B, h, T, d_k)


def torch_flex_attend(module, x: torch.Tensor, causal: bool = False, window: int | None = None,
                      lengths: torch.Tensor | None = None, rope: bool = False,
                      alibi: bool = False) -> torch.Tensor:
    """Self-attention of a torch module with the core on its FlexAttention backend: (B, T, d_model) -> same.

    The module's own forward (RoPE stays outside FlexAttention: it changes q and k themselves,
    not one score at a time); `window` and `lengths` become its mask. On CPU call it under
    torch.no_grad(): FlexAttention has no CPU backward in torch 2.13 (NotImplementedError).
    """
    module._check_inputs(x, None)
    if lengths is not None and (not is_torch(lengths) or lengths.shape != (x.shape[0],)):
        raise ValueError(f"lengths must be a torch tensor (B={x.shape[0]},), got {lengths!r}")
    view = with_positions(module, rope, alibi)
    view.backend = "flex"
    if window is not None:
        view.options = dataclasses.replace(view.options, window=require_int("window", window))
    mask = None if lengths is None else MaskSpec.padded(lengths, x.shape[1])  # pads: document -1
    return torch_mha.MultiHeadAttention.forward(view, x, causal=causal or window is not None,
                                                mask=mask)
