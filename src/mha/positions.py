"""Positions and attention variants: RoPE, ALiBi, grouped-query attention, sliding windows, FlexAttention.

Shape legend: B batch, T query length, S key length, d_model, h query heads, h_kv key/value
heads (h_kv divides h; g = h / h_kv query heads share one key/value head), d_k = d_model / h.

Attention by itself does not know where a token is: permute the keys and the weights permute
with them. This module adds position the two common ways, right where notebook 16 says:

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

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import (
    BlockMask,
    and_masks,
    create_block_mask,
    flex_attention,
)

from . import numpy_mha, steps, torch_mha
from .kv_cache import KVCache, TorchKVCache
from .validate import require_float, require_heads, require_int, shape_of

ScoreFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""score_fn(q (B, h, T, d_k), k (B, h, S, d_k), q_positions (T,), k_positions (S,)) -> (B, h, T, S)."""


def _is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


# ---- RoPE: rotary position embedding -------------------------------------------------------------
def rope_frequencies(d_k: int, base: float = 10000.0) -> np.ndarray:
    """(d_k/2,) angular speeds theta_i = base^(-2i/d_k): pair 0 turns 1 rad per position, the last slowest."""
    d_k = require_int("d_k", d_k)
    if d_k % 2:
        raise ValueError(f"RoPE turns features in pairs, so d_k must be even, got d_k={d_k}")
    if isinstance(base, bool) or not isinstance(base, int | float) or not base > 1:
        raise ValueError(f"base must be a number > 1 (the usual one is 10000.0), got {base!r}")
    return float(base) ** (-np.arange(0, d_k, 2, dtype=np.float64) / d_k)  # (d_k/2,)


def check_positions(positions: Any, T: int) -> np.ndarray:
    """Return positions as a (T,) int64 numpy array; the default is 0..T-1."""
    if positions is None:
        return np.arange(T)
    p = positions.detach().cpu().numpy() if _is_torch(positions) else np.asarray(positions)
    if p.ndim != 1 or p.shape[0] != T:
        raise ValueError(f"positions must be (T={T},), one whole number per token, got shape {p.shape}")
    if not np.issubdtype(p.dtype, np.integer):
        raise TypeError(f"positions must hold whole numbers (an int array), got dtype {p.dtype}")
    return p.astype(np.int64)


def rope_tables(positions: Any, d_k: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every angle for positions (T,) ints: two (T, d_k) float64 tables, half-split layout.

    Feature i and feature i + d_k/2 form pair i, so both halves repeat the same d_k/2 angles.
    Computed in float64 whatever x's dtype: position * theta reaches thousands of radians, and
    float32 would lose the angle's fractional part that the rotation depends on.
    """
    theta = rope_frequencies(d_k, base)  # (d_k/2,)
    p = check_positions(positions, len(positions)).astype(np.float64)  # (T,)
    angles = p[:, None] * theta[None, :]  # (T, 1) * (1, d_k/2) -> (T, d_k/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, d_k): pair i's angle in both halves
    return np.cos(angles), np.sin(angles)


def rotate_half(x: Any) -> Any:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis: a quarter turn of every pair."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (..., d_k/2) each
    if _is_torch(x):
        return torch.cat([-x2, x1], dim=-1)  # (..., d_k)
    return np.concatenate([-x2, x1], axis=-1)  # (..., d_k)


def _rotate(x: Any, cos: np.ndarray, sin: np.ndarray) -> Any:
    """x * cos + rotate_half(x) * sin with (T, d_k) tables cast to x's dtype (and device)."""
    if _is_torch(x):
        cos = torch.as_tensor(cos, dtype=x.dtype, device=x.device)
        sin = torch.as_tensor(sin, dtype=x.dtype, device=x.device)
    else:
        cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    # pair i: (a, b) -> (a cos - b sin, b cos + a sin), a rotation by the pair's angle
    return x * cos + rotate_half(x) * sin  # (..., T, d_k) * (T, d_k) -> (..., T, d_k)


def rope(x: Any, positions: Any = None, base: float = 10000.0) -> Any:
    """Rotate every feature pair of x (..., T, d_k) by position * theta_i; numpy or torch, dtype kept.

    positions: (T,) whole numbers, default 0..T-1 (give S - T + arange(T) to a chunk that follows
    S - T cached tokens). Half-split pairs (i, i + d_k/2), as GPT-NeoX and Hugging Face Llama.
    """
    require_float("x", x)
    if len(shape_of(x)) < 2:
        raise ValueError(f"x must be (..., T, d_k), at least 2-D, got {shape_of(x)}")
    T, d_k = shape_of(x)[-2:]
    if d_k % 2:
        raise ValueError(f"RoPE turns features in pairs, so d_k must be even, got d_k={d_k} "
                         f"(x of shape {shape_of(x)})")
    cos, sin = rope_tables(check_positions(positions, T), d_k, base)  # 2 x (T, d_k), float64
    return _rotate(x, cos, sin)  # (..., T, d_k)


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


# ---- ALiBi: a linear penalty on distance, one slope per head ---------------------------------------
def _geometric(p: int) -> np.ndarray:
    """(p,) slopes for p heads (p a power of two): 2^(-8/p), 2^(-16/p), ..., 2^(-8)."""
    return 2.0 ** (-8.0 * np.arange(1, p + 1) / p)


def alibi_slopes(n_heads: int) -> np.ndarray:
    """(h,) float64 ALiBi slopes: geometric for a power of two; otherwise the paper's rule.

    For h not a power of two, take the 2^floor(log2 h) slopes, then every other slope of the
    next power of two's sequence until there are h (Press et al., 2022, and their code).
    """
    n = require_int("n_heads", n_heads)
    p = 2 ** int(math.floor(math.log2(n)))  # the largest power of two <= n
    extra = _geometric(2 * p)[0::2][: n - p]  # (n - p,): slopes in between p's, the steep ones first
    return np.concatenate([_geometric(p), extra])  # (h,)


def alibi_bias(n_heads: int, T: int, S: int | None = None, offset: int = 0) -> np.ndarray:
    """(h, T, S) float64: -slope_head * |distance|, 0 where query t + offset and key s coincide.

    Query t sits at position t + offset (offset = S - T for a chunk after a cache). Keys behind
    the query get -slope * (t + offset - s); keys AHEAD get -slope * (s - t - offset) as well (a
    symmetric penalty): a causal mask removes them anyway, and without one this is the natural
    bidirectional choice. Add it to the scores after scaling, like SDPA's float attn_mask.
    """
    slopes = alibi_slopes(n_heads)  # (h,)
    T = require_int("T", T)
    S = T if S is None else require_int("S", S)
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer):
        raise TypeError(f"offset must be an int, got {type(offset).__name__} {offset!r}")
    distance = np.abs(np.arange(T)[:, None] + offset - np.arange(S)[None, :])  # (T, S)
    # slope * -distance (not -(slope * distance)): the diagonal stays +0.0, not -0.0
    return slopes[:, None, None] * -distance[None, :, :]  # (h, 1, 1) * (1, T, S) -> (h, T, S)


def torch_alibi_bias(n_heads: int, T: int, S: int | None = None, offset: int = 0,
                     dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """alibi_bias as a torch tensor (h, T, S) of `dtype` on `device` (computed in float64 first)."""
    return torch.as_tensor(alibi_bias(n_heads, T, S, offset), dtype=dtype, device=device)


# ---- grouped-query attention: fewer key/value heads ------------------------------------------------
def check_kv_heads(n_heads: int, n_kv_heads: int) -> int:
    """Check n_kv_heads divides n_heads; return the group size g = n_heads // n_kv_heads."""
    n_heads = require_int("n_heads", n_heads)
    n_kv_heads = require_int("n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        valid = ", ".join(str(d) for d in range(1, n_heads + 1) if n_heads % d == 0)
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads} (each key/value "
                         f"head serves n_heads / n_kv_heads query heads); n_kv_heads could be one "
                         f"of {valid}")
    return n_heads // n_kv_heads


def repeat_kv(x: Any, n_rep: int) -> Any:
    """(B, h_kv, S, d_k) -> (B, h_kv * n_rep, S, d_k), each head n_rep times in a row (numpy or torch).

    Head j of the result is key/value head j // n_rep: query heads 0..g-1 share kv head 0, and
    so on. The same order as torch's repeat_interleave(n_rep, dim=1) and SDPA's enable_gqa.
    """
    if n_rep == 1:
        return x
    if _is_torch(x):
        return x.repeat_interleave(n_rep, dim=1)  # (B, h_kv, S, d_k) -> (B, h, S, d_k)
    return np.repeat(x, n_rep, axis=1)  # (B, h_kv, S, d_k) -> (B, h, S, d_k)


def gqa_param_count(d_model: int, n_heads: int, n_kv_heads: int) -> int:
    """Weights and biases of one GQA block: 2 (d_model + 1)(d_model + h_kv d_k).

    Wq and Wo stay (d_model, d_model) with biases; Wk and Wv shrink to (d_model, h_kv d_k).
    With h_kv = h this is MultiHeadAttention's 4 d_model^2 + 4 d_model.
    """
    d_k = require_heads(d_model, n_heads)
    check_kv_heads(n_heads, n_kv_heads)
    return 2 * (d_model + 1) * (d_model + n_kv_heads * d_k)


class GroupedQueryAttention:
    """Grouped-query attention in numpy: h query heads share h_kv key/value heads (MQA: h_kv = 1).

    Wq, Wo: (d_model, d_model); Wk, Wv: (d_model, h_kv * d_k); biases zero. Drawn like
    MultiHeadAttention (same seed, same order), so h_kv = h gives exactly its weights.
    Shapes: x (B, T, d_model) -> (B, T, d_model); weights (B, h, T, S) kept on `.attn`.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, seed: int = 0,
                 dtype=np.float64):
        self.d_k = require_heads(d_model, n_heads)
        self.group = check_kv_heads(n_heads, n_kv_heads)  # g query heads per kv head
        self.d_model, self.n_heads, self.n_kv_heads = int(d_model), int(n_heads), int(n_kv_heads)
        self.dtype = np.dtype(dtype)
        if not np.issubdtype(self.dtype, np.floating):
            raise TypeError(f"dtype must be a floating-point type, got {self.dtype}")
        rng = np.random.default_rng(seed)
        std, d_kv = 1.0 / math.sqrt(d_model), n_kv_heads * self.d_k
        shapes = [(d_model, d_model), (d_model, d_kv), (d_model, d_kv), (d_model, d_model)]
        self.Wq, self.Wk, self.Wv, self.Wo = (rng.normal(0.0, std, s).astype(self.dtype) for s in shapes)
        self.bq, self.bo = np.zeros(d_model, self.dtype), np.zeros(d_model, self.dtype)
        self.bk, self.bv = np.zeros(d_kv, self.dtype), np.zeros(d_kv, self.dtype)
        self.attn: np.ndarray | None = None

    def forward(self, x, context=None, causal=False, mask=None, rope=False, alibi=False) -> np.ndarray:
        """Attend from x (B, T, d_model) to context (default x) -> (B, T, d_model); see `attend`."""
        return attend(self, x, context, causal, mask, rope=rope, alibi=alibi)

    __call__ = forward
    parameters = numpy_mha.MultiHeadAttention.parameters  # [Wq, bq, Wk, bk, Wv, bv, Wo, bo]
    num_parameters = numpy_mha.MultiHeadAttention.num_parameters
    allowed = numpy_mha.MultiHeadAttention.allowed  # same causal + mask logic (h = query heads)
    _check_inputs = numpy_mha.MultiHeadAttention._check_inputs  # same input errors

    def kv_cache(self, B: int, max_len: int) -> KVCache:
        """A KV cache that fits this module: (B, h_kv, max_len, d_k), h / h_kv times smaller than MHA's."""
        return KVCache(B, self.n_kv_heads, max_len, self.d_k, self.dtype)

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


def _kv_heads(module) -> int:
    """h_kv of a module: its n_kv_heads, or n_heads for plain multi-head attention."""
    return getattr(module, "n_kv_heads", module.n_heads)


# ---- the seven steps with positions (numpy) --------------------------------------------------------
def attend(module, x: np.ndarray, context: np.ndarray | None = None, causal: bool = False,
           mask: np.ndarray | None = None, rope: bool = False, alibi: bool = False) -> np.ndarray:
    """The seven steps of `module` (MultiHeadAttention or GroupedQueryAttention) with positions added.

    rope=True rotates q (positions 0..T-1) and k (0..S-1) just before the scores; alibi=True adds
    alibi_bias(h, T, S) to the scaled scores before the mask. The weights (B, h, T, S) are kept
    on module.attn. x (B, T, d_model), context (B, S, d_model; default x) -> (B, T, d_model).
    """
    B, T, S = module._check_inputs(x, context)
    allowed = module.allowed(B, T, S, causal, mask)  # None, or True where query t may see key s
    ctx = x if context is None else context
    h, h_kv = module.n_heads, _kv_heads(module)
    q = steps.linear(x, module.Wq, module.bq)  # 1) (B, T, d_model)
    k = steps.linear(ctx, module.Wk, module.bk)  #    (B, S, h_kv * d_k)
    v = steps.linear(ctx, module.Wv, module.bv)  #    (B, S, h_kv * d_k)
    q = steps.split_heads(q, h)  # 2) (B, h, T, d_k)
    k, v = steps.split_heads(k, h_kv), steps.split_heads(v, h_kv)  # (B, h_kv, S, d_k)
    if rope:  # positions enter here: q and k turn, v does not (it carries content, not position)
        q, k = _rope(q), _rope(k)  # (B, h, T, d_k), (B, h_kv, S, d_k)
    k, v = repeat_kv(k, h // h_kv), repeat_kv(v, h // h_kv)  # (B, h, S, d_k): share kv heads
    scores = steps.scaled_scores(q, k)  # 3) (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    if alibi:  # a fixed penalty per distance, added after scaling (as SDPA adds attn_mask)
        scores = scores + alibi_bias(h, T, S).astype(scores.dtype)  # (B,h,T,S) + (h,T,S)
    if allowed is not None:
        scores = steps.apply_mask(scores, allowed)  # 4) -inf where masked, after the bias
    module.attn = steps.softmax(scores)  # 5) (B, h, T, S)
    heads = steps.weighted_sum(module.attn, v)  # 6) (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
    merged = steps.merge_heads(heads)  # 7) (B, h, T, d_k) -> (B, T, d_model) ...
    return steps.linear(merged, module.Wo, module.bo)  # ... then the output projection


# ---- the torch twins -------------------------------------------------------------------------------
class TorchGroupedQueryAttention(nn.Module):
    """Grouped-query attention on SDPA, the twin of GroupedQueryAttention (same seed, same weights).

    k_proj, v_proj: Linear(d_model, h_kv * d_k). `use_enable_gqa=True` hands SDPA the h_kv heads
    with enable_gqa=True; False repeats them first (repeat_kv), the explicit way.
    """

    fused_qkv = False  # separate q_proj, k_proj, v_proj, so torch_mha.project_qkv works as is

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device=None, use_enable_gqa: bool = True):
        super().__init__()
        self.d_k = require_heads(d_model, n_heads)
        self.group = check_kv_heads(n_heads, n_kv_heads)
        self.d_model, self.n_heads, self.n_kv_heads = int(d_model), int(n_heads), int(n_kv_heads)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        self.dtype, self.use_enable_gqa = dtype, use_enable_gqa
        kw, d_kv = {"dtype": dtype, "device": device}, n_kv_heads * self.d_k
        self.q_proj, self.out_proj = nn.Linear(d_model, d_model, **kw), nn.Linear(d_model, d_model, **kw)
        self.k_proj, self.v_proj = nn.Linear(d_model, d_kv, **kw), nn.Linear(d_model, d_kv, **kw)
        self.load_numpy_(GroupedQueryAttention(d_model, n_heads, n_kv_heads, seed=seed))

    def forward(self, x, context=None, causal=False, mask=None, rope=False, alibi=False) -> torch.Tensor:
        """Attend from x (B, T, d_model) to context (default x) -> (B, T, d_model); see `torch_attend`."""
        return torch_attend(self, x, context, causal, mask, rope=rope, alibi=alibi)

    _check_inputs = torch_mha.MultiHeadAttention._check_inputs  # same input errors as torch MHA

    @torch.no_grad()
    def load_numpy_(self, np_module: GroupedQueryAttention) -> TorchGroupedQueryAttention:
        """Copy a numpy GQA's weights: numpy W is (in, out), nn.Linear's weight (out, in), so transpose."""
        for lin, W, b in ((self.q_proj, np_module.Wq, np_module.bq), (self.k_proj, np_module.Wk, np_module.bk),
                          (self.v_proj, np_module.Wv, np_module.bv), (self.out_proj, np_module.Wo, np_module.bo)):
            if tuple(lin.weight.shape) != W.T.shape:
                raise ValueError(f"weights (out, in) = {tuple(lin.weight.shape)} expected, got {W.T.shape}")
            lin.weight.copy_(torch.as_tensor(np.ascontiguousarray(W.T)))  # (in, out) -> (out, in)
            lin.bias.copy_(torch.as_tensor(b))
        return self

    @classmethod
    def from_numpy(cls, np_module: GroupedQueryAttention, dtype: torch.dtype | None = None,
                   **kwargs) -> TorchGroupedQueryAttention:
        """A torch GQA with the numpy module's weights; dtype defaults to numpy's."""
        if dtype is None:
            dtype = torch.float64 if np_module.dtype == np.float64 else torch.float32
        m = cls(np_module.d_model, np_module.n_heads, np_module.n_kv_heads, dtype=dtype, **kwargs)
        return m.load_numpy_(np_module)

    def kv_cache(self, B: int, max_len: int) -> TorchKVCache:
        """A torch KV cache that fits this module: (B, h_kv, max_len, d_k) on its device."""
        return TorchKVCache(B, self.n_kv_heads, max_len, self.d_k, self.dtype, self.out_proj.weight.device)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"d_k={self.d_k}, dtype={self.dtype}, use_enable_gqa={self.use_enable_gqa}")


def _torch_qkv(module, x: torch.Tensor, ctx: torch.Tensor,
               rope: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1-2 (and RoPE) on a torch module: q (B, h, T, d_k), k and v (B, h_kv, S, d_k)."""
    q, k, v = torch_mha.project_qkv(module, x, ctx)  # 1) (B, T, d_model), 2 x (B, S, h_kv * d_k)
    q = torch_mha.split_heads(q, module.n_heads)  # 2) (B, h, T, d_k)
    k, v = (torch_mha.split_heads(a, _kv_heads(module)) for a in (k, v))  # (B, h_kv, S, d_k)
    if rope:
        q, k = _rope(q), _rope(k)  # q at 0..T-1, k at 0..S-1
    return q, k, v


def torch_attend(module, x: torch.Tensor, context: torch.Tensor | None = None, causal: bool = False,
                 mask=None, rope: bool = False, alibi: bool = False) -> torch.Tensor:
    """Twin of `attend` on a torch MultiHeadAttention or TorchGroupedQueryAttention, through SDPA.

    ALiBi goes in as a float attn_mask: the bias, with -inf where `causal`/`mask` forbid a key.
    Fewer kv heads: enable_gqa=True (or repeat_kv when module.use_enable_gqa is False).
    """
    B, T, S = module._check_inputs(x, context)
    h, h_kv = module.n_heads, _kv_heads(module)
    q, k, v = _torch_qkv(module, x, x if context is None else context, rope)
    gqa = h_kv < h
    if gqa and not getattr(module, "use_enable_gqa", True):
        k, v, gqa = repeat_kv(k, h // h_kv), repeat_kv(v, h // h_kv), False  # (B, h, S, d_k)
    allowed = torch_mha.allowed_mask(B, h, T, S, causal, mask, x.device)  # None or (.., T, S)
    attn_mask = allowed
    if alibi:
        attn_mask = torch_alibi_bias(h, T, S, dtype=q.dtype, device=x.device)  # (h, T, S)
        if allowed is not None:  # one float mask: the bias where allowed, -inf elsewhere
            attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))  # (B|1, h, T, S)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=gqa)  # 3-6)
    merged = torch_mha.merge_heads(heads)  # 7) (B, h, T, d_k) -> (B, T, d_model) ...
    return module.out_proj(merged)  # ... then the output projection


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
    if not _is_torch(lengths):
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
    """Self-attention of a torch module with steps 3-6 in FlexAttention: x (B, T, d_model) -> (B, T, d_model).

    RoPE stays outside FlexAttention: it changes q and k themselves, not one score at a time.
    On CPU call it under torch.no_grad(): the module's weights require grad, and FlexAttention
    has no CPU backward in torch 2.13 (it raises NotImplementedError).
    """
    module._check_inputs(x, None)
    if lengths is not None and (not _is_torch(lengths) or lengths.shape != (x.shape[0],)):
        raise ValueError(f"lengths must be a torch tensor (B={x.shape[0]},), got {lengths!r}")
    q, k, v = _torch_qkv(module, x, x, rope)  # 1-2) (B, h, T, d_k), (B, h_kv, T, d_k)
    heads = flex_attend(q, k, v, causal, window, lengths, alibi)  # 3-6) (B, h, T, d_k)
    return module.out_proj(torch_mha.merge_heads(heads))  # 7) (B, T, d_model)

