"""Positions and attention variants: RoPE, ALiBi, grouped-query attention, sliding windows, FlexAttention.

Shape legend: B batch, T query length, S key length, d_model, h query heads, h_kv key/value
heads (h_kv divides h; g = h / h_kv query heads share one key/value head), d_k = d_model / h.

Attention by itself does not know where a token is: permute the keys and the weights permute
with them. This module adds position the two common ways, where 16_positions_and_variants.ipynb
puts them:

    rope(x, positions, base)           rotate q and k (..., T, d_k) by their positions (numpy or torch);
                                       then q_m . k_n depends on m - n only (RoFormer)
    check_relative(score_fn)           the named check: scores move with offsets, never with a shift;
                                       names the usual RoPE mistakes (ROPE_BUGS)
    alibi_slopes(h), alibi_bias(h, T)  ALiBi: add -slope_head * distance to the scores (Press et al.)
    attend / torch_attend              the seven steps with rope=True and/or alibi=True
                                       (numpy keeps the weights on module.attn; torch uses SDPA)

and the variants that change which keys a query reads:

    GroupedQueryAttention, TorchGroupedQueryAttention   h_kv < h key/value heads (MQA: h_kv = 1)
    repeat_kv(k, g)                    (B, h_kv, S, d_k) -> (B, h, S, d_k), each head g times in a row
    gqa_param_count(d_model, h, h_kv)  2 (d_model + 1)(d_model + h_kv d_k)
    sliding windows                    mha.masks.sliding_window_mask, combined with padding masks
    FlexAttention                      causal_mod, sliding_window_mod, padding_mod (mask_mod) and
                                       alibi_score_mod (score_mod); flex_attend / torch_flex_attend

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
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import (
    BlockMask,
    and_masks,
    create_block_mask,
    flex_attention,
)

from . import compose, masks, numpy_attention, numpy_mha, steps, torch_mha
from .posenc import (  # noqa: F401  (RoPE and ALiBi, re-exported: the lessons reach them here)
    _rotate,
    alibi_bias,
    alibi_slopes,
    check_positions,
    rope,
    rope_frequencies,
    rope_permutation,
    rope_tables,
    rotate_half,
    rotate_pairs,
    torch_alibi_bias,
)
from .validate import is_torch, require_heads, require_int, shape_of

ScoreFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""score_fn(q (B, h, T, d_k), k (B, h, S, d_k), q_positions (T,), k_positions (S,)) -> (B, h, T, S)."""


# ---- RoPE and ALiBi live in mha.posenc (the modules use them too); re-exported here ---------------
_rope = rope  # attend's flag is called `rope` too


def rope_scores(q: np.ndarray, k: np.ndarray, q_positions: Any = None,
                k_positions: Any = None) -> np.ndarray:
    """Scaled scores of rotated q (B, h, T, d_k) and k (B, h, S, d_k) -> (B, h, T, S): a correct score_fn."""
    return steps.scaled_scores(rope(q, q_positions), rope(k, k_positions))  # (B, h, T, S)


# ---- the named check, and the mistakes it names ---------------------------------------------------
def _q_only(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: q is rotated, k is not."""
    return steps.scaled_scores(rope(q, q_positions), k)


def _k_reversed(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: k turns the opposite way (sin with the wrong sign), i.e. by -position * theta."""
    return steps.scaled_scores(rope(q, q_positions), rope(k, -check_positions(k_positions, k.shape[-2])))


def _adjacent_tables(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: cos/sin tables laid out for adjacent pairs (np.repeat(theta, 2)) used with rotate_half."""
    def turn(x: np.ndarray, p: Any) -> np.ndarray:
        theta = np.repeat(rope_frequencies(x.shape[-1]), 2)  # (d_k,): 0, 0, 1, 1, ... layout
        angles = check_positions(p, x.shape[-2])[:, None] * theta[None, :]  # (T, d_k)
        return _rotate(x, np.cos(angles), np.sin(angles))
    return steps.scaled_scores(turn(q, q_positions), turn(k, k_positions))


def _positions_ignored(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: rope called without the positions, so every call counts from 0."""
    return steps.scaled_scores(rope(q), rope(k))


def _no_positions(q: np.ndarray, k: np.ndarray, q_positions: Any, k_positions: Any) -> np.ndarray:
    """WRONG: no rotation at all, plain q k^T / sqrt(d_k)."""
    return steps.scaled_scores(q, k)


ROPE_BUGS: dict[str, tuple[ScoreFn, str]] = {
    "q_only": (_q_only, "only q is rotated: rotate k as well, by the keys' own positions"),
    "k_reversed": (_k_reversed, "k is turned the opposite way (the sign of sin flipped for k): the "
                                "angles then add up, so the score depends on m + n, not on m - n"),
    "adjacent_tables": (_adjacent_tables,
                        "cos/sin tables laid out for adjacent pairs (np.repeat(theta, 2)) used with "
                        "the half-split rotate_half: the two features of a pair turn by different "
                        "angles, which is no rotation; repeat the d_k/2 angles as [angles, angles]"),
    "positions_ignored": (_positions_ignored,
                          "the positions are not passed on, so rope counts from 0 in every call "
                          "(a chunk after a KV cache must use positions S - T + arange(T))"),
    "no_positions": (_no_positions, "no rotation at all: plain q k^T / sqrt(d_k) cannot tell where "
                                    "a token is, so nothing changes when the keys move"),
}
"""Planted RoPE mistakes: name -> (score_fn that makes it, the cause check_relative reports)."""


def _relative_probe(score_fn: ScoreFn, d_k: int, T: int, S: int, shift: int,
                    seed: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Run score_fn on seeded q, k at four position settings; return them (checked) and the inputs."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(1, 2, T, d_k))  # (B, h, T, d_k)
    k = rng.normal(size=(1, 2, S, d_k))  # (B, h, S, d_k)
    q_pos = np.arange(T) + (S - T)  # the last T of S positions, as in a decoder chunk
    k_pos = np.arange(S)
    same = np.arange(T) + 3  # q and k[:T] at equal positions: offset 0 on the diagonal
    runs = {
        "base": score_fn(q, k, q_pos, k_pos),
        "shifted": score_fn(q, k, q_pos + shift, k_pos + shift),
        "moved": score_fn(q, k, q_pos, k_pos + 1),
        "same": score_fn(q, k[:, :, :T], same, same),
    }
    for name, out in runs.items():
        want = (1, 2, T, T if name == "same" else S)
        if shape_of(out) != want:
            raise AssertionError(f"relative: score_fn must return scores (B, h, T, S) = {want}, "
                                 f"got {shape_of(out)} (in the {name!r} run)")
        runs[name] = np.asarray(out, dtype=np.float64)
    return runs, q, k


def _matching_bug(runs: dict, d_k: int, T: int, S: int, shift: int, seed: int,
                  atol: float) -> tuple[str, str] | None:
    """The ROPE_BUGS entry whose outputs equal the student's on every run, or None."""
    for name, (bug, why) in ROPE_BUGS.items():
        theirs, _, _ = _relative_probe(bug, d_k, T, S, shift, seed)
        if all(np.allclose(runs[r], theirs[r], rtol=0, atol=atol) for r in runs):
            return name, why
    return None


def check_relative(score_fn: ScoreFn, d_k: int = 8, T: int = 4, S: int = 6, shift: int = 37,
                   atol: float = 1e-10, seed: int = 0) -> str:
    """Assert a RoPE score_fn(q, k, q_positions, k_positions) depends on positions only through offsets.

    Three properties, on seeded float64 inputs: (1) shifting every query and key position by
    `shift` leaves every score unchanged; (2) moving the keys one position changes the scores
    (positions are used at all); (3) at equal positions the rotations cancel, so the score is
    q.k / sqrt(d_k). On failure the message names the ROPE_BUGS mistake that gives exactly the
    student's numbers, or, when none does, says only what was measured.
    """
    d_k, T, S = require_int("d_k", d_k), require_int("T", T), require_int("S", S)
    if d_k % 2 or T > S:
        raise ValueError(f"check_relative needs an even d_k and T <= S, got d_k={d_k}, T={T}, S={S}")
    runs, q, k = _relative_probe(score_fn, d_k, T, S, shift, seed)
    shift_err = float(np.abs(runs["shifted"] - runs["base"]).max())
    moved = float(np.abs(runs["moved"] - runs["base"]).max())
    plain = np.einsum("bhtd,bhtd->bht", q, k[:, :, :T]) / math.sqrt(d_k)  # (B, h, T): q_t . k_t
    same_err = float(np.abs(np.diagonal(runs["same"], axis1=-2, axis2=-1) - plain).max())
    if shift_err > atol:
        problem = (f"shifting every position by {shift} moved the scores by up to {shift_err:.3g} "
                   f"(expected at most {atol:g}): they depend on absolute positions, not on offsets")
    elif moved <= 1e-6:
        problem = (f"moving every key one position later changed no score (largest change "
                   f"{moved:.3g}): the positions do not reach the scores")
    elif same_err > atol:
        problem = (f"at equal query and key positions the rotations should cancel, giving "
                   f"q.k / sqrt(d_k), but the scores differ from it by up to {same_err:.3g}: the "
                   f"rotation changes lengths, or the scale 1/sqrt(d_k) is missing")
    else:
        return (f"relative: scores unchanged (within {atol:g}) when all positions shift by {shift}, "
                f"changed by up to {moved:.3g} when the keys move one place, q.k/sqrt(d_k) at offset 0")
    found = _matching_bug(runs, d_k, T, S, shift, seed, atol)
    cause = (f"likely cause ({found[0]}): {found[1]}" if found else
             "it matches none of the usual mistakes (" + ", ".join(ROPE_BUGS) + "); compare your "
             "function with positions.rope_scores on the same q, k and positions")
    raise AssertionError(f"relative: {problem}. {cause}")


# ---- grouped-query attention: fewer key/value heads ------------------------------------------------
def check_kv_heads(n_heads: int, n_kv_heads: int) -> int:
    """Check n_kv_heads divides n_heads; return the group size g = n_heads // n_kv_heads."""
    n_heads = require_int("n_heads", n_heads)
    return n_heads // compose.check_options(n_heads, 2, n_kv_heads).n_kv_heads


def repeat_kv(x: Any, n_rep: int) -> Any:
    """(B, h_kv, S, d_k) -> (B, h_kv * n_rep, S, d_k), each head n_rep times in a row (numpy or torch).

    Head j of the result is key/value head j // n_rep: query heads 0..g-1 share kv head 0, and
    so on. The same order as torch's repeat_interleave(n_rep, dim=1) and SDPA's enable_gqa.
    """
    return (torch_mha.repeat_kv if is_torch(x) else numpy_attention.repeat_kv)(x, n_rep)


def gqa_param_count(d_model: int, n_heads: int, n_kv_heads: int) -> int:
    """Weights and biases of one GQA block: 2 (d_model + 1)(d_model + h_kv d_k).

    Wq and Wo stay (d_model, d_model) with biases; Wk and Wv shrink to (d_model, h_kv d_k).
    With h_kv = h this is MultiHeadAttention's 4 d_model^2 + 4 d_model.
    """
    d_k = require_heads(d_model, n_heads)
    check_kv_heads(n_heads, n_kv_heads)
    return 2 * (d_model + 1) * (d_model + n_kv_heads * d_k)


class GroupedQueryAttention(numpy_mha.MultiHeadAttention):
    """Grouped-query attention in numpy: h query heads share h_kv key/value heads (MQA: h_kv = 1).

    The numpy MultiHeadAttention with `n_kv_heads` set (same seed, same draws): Wq, Wo
    (d_model, d_model); Wk, Wv (d_model, h_kv * d_k). Its cache is (B, h_kv, max_len, d_k).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, seed: int = 0,
                 dtype=np.float64, **options):
        super().__init__(d_model, n_heads, seed, dtype, n_kv_heads=n_kv_heads, **options)

    def forward(self, x, context=None, causal=False, mask=None, positions=None, cache=None,
                rope=False, alibi=False) -> np.ndarray:
        """Attend from x (B, T, d_model) to context (default x) -> (B, T, d_model); see `attend`."""
        if rope or alibi:
            return attend(self, x, context, causal, mask, rope=rope, alibi=alibi)
        return super().forward(x, context, causal, mask, positions, cache)

    __call__ = forward

    @classmethod
    def from_mha(cls, mha: numpy_mha.MultiHeadAttention, n_kv_heads: int) -> GroupedQueryAttention:
        """Convert an MHA module: each kv head is the MEAN of its group's heads (Ainslie et al., 2023)."""
        out = cls(mha.d_model, mha.n_heads, n_kv_heads, dtype=mha.dtype)
        d, g, d_k = mha.d_model, out.group, mha.d_k
        out.Wq, out.bq, out.Wo, out.bo = mha.Wq.copy(), mha.bq.copy(), mha.Wo.copy(), mha.bo.copy()
        for name in ("k", "v"):
            W = getattr(mha, f"W{name}").reshape(d, n_kv_heads, g, d_k)  # (d, h_kv, g, d_k)
            b = getattr(mha, f"b{name}").reshape(n_kv_heads, g, d_k)  # (h_kv, g, d_k)
            setattr(out, f"W{name}", W.mean(axis=2).reshape(d, n_kv_heads * d_k))  # (d, h_kv*d_k)
            setattr(out, f"b{name}", b.mean(axis=1).reshape(n_kv_heads * d_k))  # (h_kv*d_k,)
        return out

    def __repr__(self) -> str:
        return (f"GroupedQueryAttention(d_model={self.d_model}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, dtype={self.dtype})")


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
class TorchGroupedQueryAttention(torch_mha.MultiHeadAttention):
    """Grouped-query attention on SDPA, the twin of GroupedQueryAttention (same seed, same weights).

    k_proj, v_proj: Linear(d_model, h_kv * d_k). `use_enable_gqa=True` hands SDPA the h_kv heads
    with enable_gqa=True; False repeats them first (repeat_kv), the explicit way.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device=None, use_enable_gqa: bool = True,
                 **options):
        super().__init__(d_model, n_heads, seed, dtype, device=device, n_kv_heads=n_kv_heads,
                         use_enable_gqa=use_enable_gqa, **options)

    def forward(self, x, context=None, causal=False, mask=None, positions=None, cache=None,
                rope=False, alibi=False) -> torch.Tensor:
        """Attend from x (B, T, d_model) to context (default x) -> (B, T, d_model); see `torch_attend`."""
        if rope or alibi:
            return torch_attend(self, x, context, causal, mask, rope=rope, alibi=alibi)
        return super().forward(x, context, causal, mask, positions, cache)

    @classmethod
    def from_numpy(cls, np_module: GroupedQueryAttention, dtype: torch.dtype | None = None,
                   **kwargs) -> TorchGroupedQueryAttention:
        """A torch GQA with the numpy module's weights; dtype defaults to numpy's."""
        if dtype is None:
            dtype = torch.float64 if np_module.dtype == np.float64 else torch.float32
        m = cls(np_module.d_model, np_module.n_heads, np_module.n_kv_heads, dtype=dtype, **kwargs)
        return m.load_numpy_(np_module)


def torch_attend(module, x: torch.Tensor, context: torch.Tensor | None = None, causal: bool = False,
                 mask=None, rope: bool = False, alibi: bool = False) -> torch.Tensor:
    """Twin of `attend`: the torch module's forward with RoPE and/or ALiBi for this call."""
    return torch_mha.MultiHeadAttention.forward(with_positions(module, rope, alibi), x, context,
                                                causal, mask)


# ---- FlexAttention: masks as mask_mod, biases as score_mod ----------------------------------------
def causal_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """mask_mod: query t may see key s <= t (top-left aligned, as steps.causal_mask)."""
    return q_idx >= kv_idx


def sliding_window_mod(window: int, offset: int = 0) -> Callable:
    """mask_mod: query t sees keys t + offset - window < s <= t + offset, like masks.sliding_window_mask."""
    window = require_int("window", window, minimum=1)

    def mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        back = q_idx + offset - kv_idx  # how many positions the key lies behind the query
        return (back >= 0) & (back < window)
    return mod


def padding_mod(lengths: torch.Tensor) -> Callable:
    """mask_mod: in sequence b, real queries (t < lengths[b]) see real keys (s < lengths[b])."""
    if not is_torch(lengths):
        raise TypeError(f"lengths must be a torch tensor (B,) for FlexAttention, got {type(lengths).__name__}")

    def mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (q_idx < lengths[b]) & (kv_idx < lengths[b])
    return mod


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


def flex_block_mask(B: int, h: int, T: int, S: int, causal: bool = False, window: int | None = None,
                    lengths: torch.Tensor | None = None, device="cpu") -> BlockMask | None:
    """The BlockMask FlexAttention needs for causal / window / padding (None if nothing is masked)."""
    mods = [causal_mod] if causal else []
    if window is not None:
        mods.append(sliding_window_mod(window))
    if lengths is not None:
        mods.append(padding_mod(lengths))
    if not mods:
        return None
    mask_mod = mods[0] if len(mods) == 1 else and_masks(*mods)
    # B=None / H=None: the mask is the same for every batch item / head, so store it once
    return create_block_mask(mask_mod, B if lengths is not None else None, None, T, S,
                             device=str(device))


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
    block_mask = flex_block_mask(B, h, T, S, causal, window, lengths, q.device.type)
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
    mask = None if lengths is None else masks.padding_mask(lengths, x.shape[1])  # (B, 1, T, T)
    return torch_mha.MultiHeadAttention.forward(view, x, causal=causal or window is not None,
                                                mask=mask)
