"""FlashAttention in numpy: the online softmax, then steps 3-6 tiled, never forming (T, S).

FlashAttention (Dao et al. 2022) computes exact attention block by block: for each block of
queries it streams over blocks of keys and values, keeps a running row max `m`, a running
sum `ell` (the paper's l) of exp(score - m) and an unnormalised output `acc`, rescales both
when the max grows, and divides once at the end. FlashAttention-2 (Dao 2023) puts the query
blocks in the outer loop, as here, and keeps the row logsumexp L = m + log(ell) (`lse`;
the symbols m, ell, L are the lessons' from 12_flash_attention.ipynb on) for the
backward pass (`flash_attention_backward`: key blocks outside, P recomputed tile by tile from
the logsumexp). Memory is O(block_q * block_k) per step instead of O(T * S).

The state (m, ell, acc) is the whole story, so it has its own small API: `empty_state`, one
update per block of keys (`_update`, shared by both attention functions below) and one
final division (`_finish`). `choose_blocks` picks the tile sizes from the shapes when none are given: big
tiles for few trips round the Python loop, small enough for the tile's passes to stay in cache.

Flash decoding (`split_kv_attention`, Dao et al. 2023): with one new query there are no query
blocks to share out, so the keys are split into chunks instead, one state per chunk (on a GPU,
in parallel), each normalised to (out, lse), then merged by `numpy_attention.merge_partials`,
the one logsumexp merge (the form ring attention passes from device to device, too).

Beyond the lesson's causal square, the same loop serves the numpy module as the "flash" backend
of `numpy_attention.attention`: grouped-query heads (a key/value tile is loaded once for the g
query heads that read it, never repeated in memory; the backward sums dk, dv over them), an
additive bias (ALiBi) added tile by tile, and a `masking.MaskSpec` (positions: padding, windows,
documents) lowered to its tile schedule, so tiles left of a window's band are skipped like those
above the diagonal and FULL tiles get no mask work (`Tiles`, `_lowering`; `stats` counts them).

Passes over the scores (`ScoreStream` counts them): the stable softmax reads a row three times
(max, sum, normalise: `softmax_three_passes`); the online softmax finds max and sum in one pass
and normalises in a second (`softmax_two_passes`); only fused with the weighted sum, the output
rescaled instead of the weights, is it one pass (`attend_one_pass`, and the tiles below).

Precision: float16 inputs are computed in float32 (`numpy_attention.compute_dtype`, the core's own
rule): the scores, the running m and ell, the accumulator, lse and the backward's delta and
gradient sums, as FlashAttention's kernels and PyTorch's SDPA math path do. float16 keeps 11 bits
and ends at 65504 (q.k of entries of 100 at d_k = 64 is already inf), and a running sum over
thousands of keys would lose the small terms. The output is rounded to float16 once, at the end;
float32 and float64 inputs are computed in their own dtype. lse is returned in the working dtype.

Shape legend: B batch, h heads, T queries, S keys, d_k head width (d_v for values).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha.attention.masking import MaskSpec
from mha.attention.numpy_attention import compute_dtype, group, merge_partials
from mha.validate import (
    is_torch,
    mask_shape,
    require_bool,
    require_float,
    require_int,
    require_shape,
    shape_of,
)

SKIPPED, PARTIAL, FULL = 0, 1, 2
"""Tile kinds in `tile_schedule`: never computed, computed with some keys masked, all computed."""

KIND_NAMES = {SKIPPED: "SKIPPED", PARTIAL: "PARTIAL", FULL: "FULL"}
KIND_LETTERS = {SKIPPED: ".", PARTIAL: "P", FULL: "F"}
"""How `format_schedule` prints each kind: a dot for a tile never computed."""


class ScoreStream:
    """One row of scores handed out block by block, as a kernel reads them from slow memory.

    Iterating is one pass over the row; `reads` counts every score handed out, so `passes`
    (reads / row length) says how many times an algorithm went over the scores.
    """

    def __init__(self, row: np.ndarray, block: int):
        row = np.asarray(row)
        require_float("row", row)
        if row.ndim != 1:
            raise ValueError(f"row must be one row of scores, shape (S,), got shape {row.shape}")
        self.row, self.block, self.reads = row, require_int("block", block), 0

    def __iter__(self) -> Iterator[np.ndarray]:
        for j in range(0, self.row.size, self.block):
            x = self.row[j:j + self.block]  # (block,), the last one maybe shorter
            self.reads += x.size
            yield x

    @property
    def passes(self) -> float:
        """How many times the row was read, in whole rows (0 for an empty row)."""
        return self.reads / self.row.size if self.row.size else 0.0


def _require_stream(scores: ScoreStream) -> None:
    """Refuse anything but a ScoreStream: the pass counters live on it."""
    if not isinstance(scores, ScoreStream):
        raise TypeError(f"scores must be a ScoreStream (flash.ScoreStream(row, block)), "
                        f"got {type(scores).__name__}")


def softmax_three_passes(scores: ScoreStream) -> tuple[np.ndarray, float, float]:
    """The stable softmax as steps.softmax computes it: max, then sum, then normalise -> (w, m, ell)."""
    _require_stream(scores)
    m = max((float(x.max()) for x in scores), default=-np.inf)  # pass 1: the row max
    if m == -np.inf:
        return np.zeros_like(scores.row), m, 0.0  # nothing allowed: zeros, as steps.softmax
    ell = sum(float(np.exp(x - m).sum()) for x in scores)  # pass 2: the denominator
    w = np.concatenate([np.exp(x - m) / ell for x in scores])  # pass 3: the weights
    return w.astype(scores.row.dtype), m, ell


def softmax_two_passes(scores: ScoreStream) -> tuple[np.ndarray, float, float]:
    """The online softmax: running max m and sum ell in ONE pass, then a pass to normalise.

    Each block updates the running max and rescales the running sum by exp(m_old - m_new),
    so ell always equals sum(exp(seen - m)). The weights need the final ell, known only after
    the last block: that second pass stays. An all -inf row gives zeros, as steps.softmax.
    """
    _require_stream(scores)
    m, ell = -np.inf, 0.0
    for x in scores:  # pass 1: max and sum together
        m_new = max(m, float(x.max()))
        if m_new == -np.inf:
            continue  # nothing allowed so far: m and ell stay as they are
        ell = ell * math.exp(m - m_new) + float(np.exp(x - m_new).sum())  # rescale, then add
        m = m_new
    if ell == 0.0:
        return np.zeros_like(scores.row), m, ell
    w = np.concatenate([np.exp(x - m) / ell for x in scores])  # pass 2: the weights
    return w.astype(scores.row.dtype), m, ell


def attend_one_pass(scores: ScoreStream, v: np.ndarray) -> tuple[np.ndarray, float, float]:
    """softmax(scores) @ v (S,) @ (S, d_v) -> (d_v,) in ONE pass over the scores: (out, m, ell).

    The online softmax fused with the weighted sum: the unnormalised output acc = sum p v is
    rescaled by exp(m_old - m_new) with ell, and divided once at the end. The weights are never
    written, so no pass goes back over the scores (FlashAttention's inner loop, for one row).
    """
    _require_stream(scores)
    v = np.asarray(v)
    require_float("v", v)
    require_shape("v", v, (("S", scores.row.size), ("d_v", None)))
    dtype = np.result_type(scores.row, v)
    work = compute_dtype(dtype)  # float16: the running state in float32
    state, s0 = empty_state((), 1, v.shape[-1], work), 0
    for x in scores:  # the only pass: the tiled kernel's update, on one row
        vb, s0 = v[s0:s0 + x.size].astype(work, copy=False), s0 + x.size  # (bk, d_v): this block's values
        state = _update(state, x[None, :].astype(work), vb)  # (1, bk): _update works in place on a copy
    out, _ = _finish(state)  # (1, d_v): one division, on d_v numbers
    return out[0].astype(dtype, copy=False), float(state[0][0, 0]), float(state[1][0, 0])


def online_softmax(row: np.ndarray, block: int) -> tuple[np.ndarray, float, float]:
    """Softmax of one row read in blocks: (weights, row max m, sum ell), by `softmax_two_passes`."""
    return softmax_two_passes(ScoreStream(row, block))


def _allowed_block(t0: int, t1: int, s0: int, s1: int, causal: bool, offset: int,
                   mask: np.ndarray | None) -> np.ndarray | None:
    """Which scores of the tile (queries t0:t1, keys s0:s1) are allowed; None = all of them."""
    allowed = None
    if causal and s1 - 1 > t0 + offset:  # the diagonal cuts this tile (below it: all allowed)
        t = np.arange(t0, t1)[:, None]  # (bq, 1)
        s = np.arange(s0, s1)[None, :]  # (1, bk)
        allowed = s <= t + offset  # (bq, bk)
    if mask is not None:
        m = mask[..., t0:t1, s0:s1]  # (g|1, bq, bk)
        allowed = m if allowed is None else m & allowed
    return allowed


State = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Online-softmax state of a set of rows: (m, ell, acc), shapes (..., rows, 1), (..., rows, 1),
(..., rows, d_v): the row max, the sum of exp(score - m) and the unnormalised output sum p v."""

TILE_BUDGET_BYTES = 2 * 2**20
"""Working set `choose_blocks` aims at: a few MiB, so each pass over the tile stays in cache.
Read at every call, so it can be tuned for a machine (benchmarks/flash_blocks.py sweeps it)."""


def empty_state(lead: tuple[int, ...], rows: int, d_v: int, dtype: np.dtype) -> State:
    """The state before any key is seen: m = -inf, ell = 0, acc = 0."""
    if not isinstance(lead, tuple):
        raise TypeError(f"lead must be a tuple of ints (the leading axes), got {type(lead).__name__}")
    lead = tuple(require_int("lead", n, minimum=0) for n in lead)
    rows, d_v = require_int("rows", rows, minimum=0), require_int("d_v", d_v, minimum=0)
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise TypeError(f"dtype must be a floating-point dtype (the state holds -inf), got {np.dtype(dtype)}")
    m = np.full(lead + (rows, 1), -np.inf, dtype=dtype)  # (..., rows, 1)
    return m, np.zeros_like(m), np.zeros(lead + (rows, d_v), dtype=dtype)  # (..., rows, d_v)


def _update(state: State, scores: np.ndarray, v_block: np.ndarray) -> State:
    """Fold one block of scaled, masked scores (..., rows, bk) and its values into the state.

    Consumes `scores` (exp is taken in place) and `acc`. The new max rescales what was summed
    under the old one by exp(m_old - m_new); a row with nothing allowed yet keeps m = -inf.
    """
    m, ell, acc = state
    m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))  # (..., rows, 1)
    base = np.where(np.isfinite(m_new), m_new, 0.0)  # rows with nothing allowed yet: no -inf - -inf
    p = np.exp(np.subtract(scores, base, out=scores), out=scores)  # (..., rows, bk); masked -> 0
    alpha = np.exp(m - base)  # (..., rows, 1): rescales what was summed under the old max
    ell = alpha * ell + p.sum(axis=-1, keepdims=True)  # (..., rows, 1)
    acc *= alpha
    acc += p @ v_block  # (..., rows, bk) @ (..., bk, d_v) -> (..., rows, d_v)
    return m_new, ell, acc


def _finish(state: State) -> tuple[np.ndarray, np.ndarray]:
    """Normalise once: out = acc / ell (0 where ell = 0, like steps.softmax) and lse = m + log(ell)."""
    m, ell, acc = state
    out = np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)  # (..., rows, d_v)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(ell))[..., 0]  # (..., rows); -inf where ell = 0
    return out, lse


def choose_blocks(T: int, S: int, d_k: int, itemsize: int,
                  budget: int | None = None) -> tuple[int, int]:
    """(block_q, block_k) for flash_attention: the largest tiles whose working set fits `budget`.

    numpy pays a few microseconds per call whatever the size, so tiles should be big (few trips
    round the Python loops, large matmuls); but each step makes four passes (max, subtract, exp,
    sum) over the (bq, bk) score tile, and those should stay in cache. Working set of one step
    for one head: the score tile plus the q and acc tiles, itemsize * (bq bk + 2 bq d_k) bytes.
    Blocks double in turn, keys first (block_k is block_q or twice it), up to T and S; then they
    are evened out, so T = 1000 gives two blocks of 500 rather than 512 + 488.
    budget None: TILE_BUDGET_BYTES.
    """
    T, S, d_k = require_int("T", T), require_int("S", S), require_int("d_k", d_k)
    itemsize = require_int("itemsize", itemsize)
    budget = require_int("budget", TILE_BUDGET_BYTES if budget is None else budget)
    bq, bk = min(T, 16), min(S, 16)  # the floor: small enough for any budget worth having
    while True:
        grow_k = bk < S and (bk <= bq or bq >= T) and \
            _tile_bytes(bq, min(2 * bk, S), d_k, itemsize) <= budget
        grow_q = not grow_k and bq < T and _tile_bytes(min(2 * bq, T), bk, d_k, itemsize) <= budget
        if not (grow_k or grow_q):
            return _even(T, bq), _even(S, bk)
        bq, bk = (bq, min(2 * bk, S)) if grow_k else (min(2 * bq, T), bk)


def _tile_bytes(bq: int, bk: int, d_k: int, itemsize: int) -> int:
    """Working set of one step for one head: the (bq, bk) scores and the (bq, d_k) q and acc tiles."""
    return itemsize * (bq * bk + 2 * bq * d_k)


def _heads_per_step(h: int, bq: int, bk: int, d_k: int, itemsize: int,
                    budget: int | None = None) -> int:
    """How many heads share one step: all of them while their tiles together fit the budget.

    Small inputs then cost one trip round the loops for all heads, as the batched steps do;
    large ones go one head at a time, with the large per-head tiles numpy runs fastest on.
    """
    budget = TILE_BUDGET_BYTES if budget is None else budget
    return _even(h, max(1, min(h, budget // _tile_bytes(bq, bk, d_k, itemsize))))  # 8 -> 4 + 4


def _even(n: int, block: int) -> int:
    """The smallest block that covers n in as many blocks as `block` needs (ragged tail evened out)."""
    return -(-n // -(-n // block))


def flash_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
                    mask: np.ndarray | MaskSpec | None = None, block_q: int | None = None,
                    block_k: int | None = None, offset: int = 0, budget: int | None = None, *,
                    bias: np.ndarray | None = None,
                    stats: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Steps 3-6 tiled: q (B, h, T, d_k), k (B, h_kv, S, d_k), v (B, h_kv, S, d_v) -> (out, lse).

    out (B, h, T, d_v) equals steps 3-6 (softmax(q k^T / sqrt(d_k) + bias) v); lse (B, h, T) is
    each row's logsumexp of those scores (-inf for a fully masked row, whose output is 0).
    `causal` lets query t see keys s <= t + offset (offset=0 top-left, S-T bottom-right);
    `mask` is boolean, True = may attend, (T, S), (B, T, S) or (B|1, h|1, T, S), or a
    `masking.MaskSpec` (positions, window, padding, documents): then its tile schedule decides
    which tiles are computed (none left of a window's band), and only PARTIAL tiles get mask work.
    `bias` (ALiBi) broadcasts to (B, h, T, S) and is added tile by tile after scaling.
    h_kv divides h: query heads j*g .. j*g+g-1 share key/value head j, whose tiles are loaded once
    for all g of them (never repeated in memory). block_q, block_k: ints, or None for
    `choose_blocks`; `budget` (bytes, default TILE_BUDGET_BYTES) is the working set they (and the
    heads per step) are picked for. `stats`, a dict, counts tiles ("computed", "masked",
    "skipped") and, if it holds a "tiles" list, appends (b, i, j) per computed tile.
    float16 is computed in float32 (module docstring); out has the inputs' dtype, lse the working one.
    """
    B, h, h_kv, T, S, d_k = _check_qkv(q, k, v)
    causal, offset = require_bool("causal", causal), _require_offset(offset)
    dtype = q.dtype
    work = compute_dtype(dtype)
    block_q, block_k, cells = _plan(B, h, h_kv, T, S, d_k, work.itemsize, block_q, block_k, budget)
    lower = _lowering(mask, bias, causal, offset, B, h, h_kv, T, S, block_q, block_k)
    q, k, v = (a.astype(work, copy=False) for a in (q, k, v))  # float16 -> float32, once; else no copy
    g = h // h_kv  # query heads per key/value head
    out = np.zeros((B, h, T, v.shape[-1]), dtype=dtype)  # (B, h, T, d_v)
    lse = np.full((B, h, T), -np.inf, dtype=work)  # (B, h, T)
    for b, kv in cells:  # FA-2's grid is (batch, head, query block): each cell independent
        heads = slice(kv.start * g, kv.stop * g)  # the query heads that read these kv heads
        qg = q[b, heads].reshape(-1, g, T, d_k)  # (G, g, T, d_k): G kv heads, g queries each
        o, ls = _tiled(qg, k[b, kv, None], v[b, kv, None], lower(b, kv), block_q, block_k, stats)
        out[b, heads], lse[b, heads] = o.reshape(-1, T, o.shape[-1]), ls.reshape(-1, T)  # (G g, T, ..)
    return out, lse  # out rounded to the inputs' dtype once, by the assignment above


def _plan(B: int, h: int, h_kv: int, T: int, S: int, d: int, itemsize: int, block_q: int | None,
          block_k: int | None, budget: int | None) -> tuple[int, int, list]:
    """Tile sizes and the grid: (block_q, block_k, [(b, slice of key/value heads)]).

    Blocks left None are picked by `choose_blocks`; key/value heads go together while their
    tiles (each with its g = h / h_kv query heads) fit the budget (`_heads_per_step`).
    """
    auto_q, auto_k = choose_blocks(max(T, 1), max(S, 1), d, itemsize, budget)
    block_q = auto_q if block_q is None else require_int("block_q", block_q)
    block_k = auto_k if block_k is None else require_int("block_k", block_k)
    g = h // max(h_kv, 1)  # a kv head's g query heads score against one k tile: g * block_q rows
    n = _heads_per_step(max(h_kv, 1), g * block_q, block_k, d, itemsize, budget)  # kv heads per step
    cells = [(b, slice(j, min(j + n, h_kv))) for b in range(B) for j in range(0, h_kv, n)]
    return block_q, block_k, cells


@dataclass(frozen=True)
class Tiles:
    """What one cell of the grid may attend, lowered to tiles: which to compute, and their masks.

    kinds (n_q_blocks, n_k_blocks) of SKIPPED / PARTIAL / FULL; `allowed(t0, t1, s0, s1)` the
    boolean (G|1, g|1, bq, bk) mask of a PARTIAL tile; `bias(t0, t1, s0, s1)` the additive
    (G|1, g|1, bq|1, bk|1) bias of a tile, or None without one. `b` is the batch item (for stats).
    """

    b: int
    kinds: np.ndarray
    allowed: Callable[[int, int, int, int], np.ndarray]
    bias: Callable[[int, int, int, int], np.ndarray] | None = None


def _lowering(mask: Any, bias: Any, causal: bool, offset: int, B: int, h: int, h_kv: int, T: int,
              S: int, block_q: int, block_k: int) -> Callable[[int, slice], Tiles]:
    """(b, kv heads) -> that cell's Tiles, from the causal flag and offset, a mask or a MaskSpec."""
    g = h // h_kv
    bias4 = None if bias is None else _as4("bias", bias, B, h, T, S)
    if isinstance(mask, MaskSpec):
        if causal or offset:
            raise ValueError("a MaskSpec says itself what is causal (its positions): call with "
                             "causal=False and offset=0")
        if (mask.T, mask.S) != (T, S) or mask.B not in (1, B):
            raise ValueError(f"the MaskSpec describes (B={mask.B}, T={mask.T}, S={mask.S}), the "
                             f"inputs (B={B}, T={T}, S={S})")
        kinds = mask.tile_kinds(block_q, block_k)  # (B|1, nq, nk): from positions, no (T, S) array
        kinds = np.broadcast_to(kinds, (len(kinds), -(-T // block_q), -(-S // block_k)))  # (B|1, nq, nk)

        def spec_cell(b: int, kv: slice) -> Tiles:
            def allowed(t0, t1, s0, s1):
                block = mask.block(t0, t1, s0, s1)  # (B|1, h|1, bq, bk), None when all allowed
                return np.True_ if block is None else _cell(block, b, kv, g)  # (G|1, g|1, bq, bk)
            return Tiles(b, kinds[min(b, len(kinds) - 1)], allowed, _bias_tiles(bias4, b, kv, g))
        return spec_cell
    kinds = tile_schedule(T, S, block_q, block_k, causal, offset) if causal else \
        np.full((-(-T // block_q), -(-S // block_k)), FULL, dtype=np.int8)
    mask4 = None if mask is None else np.asarray(mask).reshape(mask_shape(mask, B, h, T, S))
    if mask4 is not None:
        kinds = np.where(kinds == FULL, PARTIAL, kinds)  # an arbitrary mask: every tile masked

    def array_cell(b: int, kv: slice) -> Tiles:
        m = None if mask4 is None else _cell(mask4, b, kv, g)  # (G|1, g|1, T, S)
        return Tiles(b, kinds, lambda t0, t1, s0, s1: _allowed_block(t0, t1, s0, s1, causal, offset, m),
                     _bias_tiles(bias4, b, kv, g))
    return array_cell


def _as4(name: str, a: np.ndarray, B: int, h: int, T: int, S: int) -> np.ndarray:
    """a (a bias), checked to broadcast to (B, h, T, S), as a 4-d (B|1, h|1, T|1, S|1) array."""
    a = np.asarray(a)
    try:
        if np.broadcast_shapes(a.shape, (B, h, T, S)) != (B, h, T, S):
            raise ValueError
    except ValueError:
        raise ValueError(f"{name} {a.shape} must broadcast to the scores (B, h, T, S) = "
                         f"{(B, h, T, S)}") from None
    return a.reshape((1,) * (4 - a.ndim) + a.shape)  # (B|1, h|1, T|1, S|1)


def _cell(a: np.ndarray | None, b: int, kv: slice, g: int) -> np.ndarray | None:
    """The (B|1, h|1, ., .) array's part for batch item b and kv heads kv: (G|1, g|1, ., .)."""
    if a is None:
        return None
    a = a[b if a.shape[0] > 1 else 0]  # (h|1, ., .)
    if a.shape[0] == 1:
        return a[None]  # (1, 1, ., .): the same for every head
    return a[kv.start * g:kv.stop * g].reshape(-1, g, *a.shape[1:])  # (G, g, ., .)


def _bias_tiles(bias4: np.ndarray | None, b: int, kv: slice, g: int) -> Callable | None:
    """(t0, t1, s0, s1) -> the bias tile (G|1, g|1, bq|1, bk|1) of this cell, or None."""
    cell = _cell(bias4, b, kv, g)  # (G|1, g|1, T|1, S|1)
    if cell is None:
        return None
    return lambda t0, t1, s0, s1: cell[..., t0:t1 if cell.shape[-2] > 1 else 1,
                                       s0:s1 if cell.shape[-1] > 1 else 1]


def _count(stats: dict | None, b: int, i: int, j: int, kind: int) -> None:
    """Count one tile in stats: "computed", "masked" (PARTIAL, given mask work) or "skipped"."""
    if stats is None:
        return
    key = "skipped" if kind == SKIPPED else "computed"
    stats[key] = stats.get(key, 0) + 1
    if kind == PARTIAL:
        stats["masked"] = stats.get("masked", 0) + 1
    if kind != SKIPPED and isinstance(stats.get("tiles"), list):
        stats["tiles"].append((b, i, j))


def _tiled(q: np.ndarray, k: np.ndarray, v: np.ndarray, tiles: Tiles, block_q: int, block_k: int,
           stats: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """flash_attention for one cell: q (G, g, T, d_k), k (G, 1, S, d_k), v (G, 1, S, d_v).

    G key/value heads of one batch item, each read by g query heads (g = 1 without GQA).
    q, k, v arrive in the working dtype; out (G, g, T, d_v) and lse (G, g, T) are returned in it.
    """
    (G, g, T, d_k), S, d_v = q.shape, k.shape[2], v.shape[-1]
    dtype = q.dtype
    out = np.empty((G, g, T, d_v), dtype=dtype)  # (G, g, T, d_v)
    lse = np.empty((G, g, T), dtype=dtype)  # (G, g, T)
    scale = np.asarray(1.0 / math.sqrt(d_k), dtype=q.dtype)  # keeps float32 as float32
    for i, t0 in enumerate(range(0, T, block_q)):  # outer loop: one block of queries (FA-2 order)
        t1 = min(t0 + block_q, T)
        rows = g * (t1 - t0)  # the g query heads of a kv head stacked as rows: one matmul per tile
        qi = (q[:, :, t0:t1] * scale).reshape(G, rows, d_k)  # (G, g, bq, d_k) -> (G, g bq, d_k)
        state = empty_state((G,), rows, d_v, dtype)  # m, ell, acc of this block of queries
        for j, s0 in enumerate(range(0, S, block_k)):  # inner loop: stream keys and values
            kind = tiles.kinds[i, j]
            _count(stats, tiles.b, i, j, kind)
            if kind == SKIPPED:
                continue  # no query of the block may see a key of this one: never computed
            s1 = min(s0 + block_k, S)
            scores = qi @ k[:, 0, s0:s1].swapaxes(-1, -2)  # (G, g bq, d_k) @ (G, d_k, bk) -> (G, g bq, bk)
            per_head = scores.reshape(G, g, t1 - t0, s1 - s0)  # a view: (G, g, bq, bk)
            if tiles.bias is not None:
                per_head += tiles.bias(t0, t1, s0, s1)  # ALiBi: added after scaling, before the mask
            if kind == PARTIAL:  # a FULL tile gets no mask work at all
                np.copyto(per_head, -np.inf, where=~tiles.allowed(t0, t1, s0, s1))  # (G|1, g|1, bq, bk)
            state = _update(state, scores, v[:, 0, s0:s1])  # one v tile (G, bk, d_v) for the g heads
        # one division at the end; a row with nothing allowed (ell = 0) stays 0, like steps.softmax
        o, ls = _finish(state)  # (G, g bq, d_v), (G, g bq)
        out[:, :, t0:t1], lse[:, :, t0:t1] = o.reshape(G, g, t1 - t0, d_v), ls.reshape(G, g, t1 - t0)
    return out, lse


def flash_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                             lse: np.ndarray, dout: np.ndarray, causal: bool = False,
                             mask: np.ndarray | MaskSpec | None = None, block_q: int | None = None,
                             block_k: int | None = None, offset: int = 0,
                             budget: int | None = None, *,
                             bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention-2's backward: the gradients of `flash_attention` from its out and lse alone.

    q (B, h, T, d_k), k (B, h_kv, S, d_k), v (B, h_kv, S, d_v), out and dout (B, h, T, d_v), lse
    (B, h, T) -> (dq, dk, dv) in the shapes of q, k, v. Nothing of size (T, S) is kept: each
    tile's P = exp(scores - lse) is recomputed, and delta = rowsum(dout * out) stands in for
    the sum over all keys of P * dP (15_backward_pass.ipynb). Loop order of FA-2's backward:
    key blocks outside (each owns its dk, dv, written once), query blocks inside (dq is added
    to from every key block; FA-2 uses atomic adds for it). Arguments as in `flash_attention`:
    with grouped-query heads a key/value head's dk, dv sum over the g query heads that read it;
    `bias` is a constant (no gradient is returned for it). float16 is computed in float32
    (delta, P, and the sums into dq, dk, dv); the gradients are rounded once, at the end.
    """
    B, h, h_kv, T, S, d_k = _check_qkv(q, k, v)
    d_v = shape_of(v)[-1]
    for name, a, want in (("out", out, (B, h, T, d_v)), ("dout", dout, (B, h, T, d_v)),
                          ("lse", lse, (B, h, T))):
        _require_array(name, a)
        require_float(name, a)
        if shape_of(a) != want:
            raise ValueError(f"{name} must have shape {want} (from q, k, v), got {shape_of(a)}")
    for name, a in (("out", out), ("dout", dout)):
        if a.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q, k, v ({q.dtype}), got {a.dtype}")
    causal, offset = require_bool("causal", causal), _require_offset(offset)
    dtype = q.dtype
    work = compute_dtype(dtype)
    block_q, block_k, cells = _plan(B, h, h_kv, T, S, max(d_k, d_v), work.itemsize, block_q,
                                    block_k, budget)
    lower = _lowering(mask, bias, causal, offset, B, h, h_kv, T, S, block_q, block_k)
    q, k, v, out, dout = (a.astype(work, copy=False) for a in (q, k, v, out, dout))  # float16 -> float32
    lse = lse.astype(work, copy=False)
    delta = (dout * out).sum(axis=-1)  # (B, h, T): FA-2's preprocessing step, one number a row
    g = h // h_kv
    dq = np.zeros((B, h_kv, g, T, d_k), dtype=work)  # query heads grouped by their kv head
    dk, dv = np.zeros_like(k), np.zeros_like(v)  # sums in the working dtype
    for b, kv in cells:
        heads = slice(kv.start * g, kv.stop * g)
        grouped = [a[b, heads].reshape(-1, g, *a.shape[2:]) for a in (q, lse, dout, delta)]  # (G, g, ..)
        _tiled_backward(grouped[0], k[b, kv, None], v[b, kv, None], *grouped[1:], lower(b, kv),
                        block_q, block_k, (dq[b, kv], dk[b, kv, None], dv[b, kv, None]))  # in place
    dq = dq.reshape(B, h, T, d_k)  # (B, h_kv, g, T, d_k) -> (B, h, T, d_k): head j*g + i
    return tuple(gr.astype(dtype, copy=False) for gr in (dq, dk, dv))  # rounded once


def _tiled_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, lse: np.ndarray,
                    dout: np.ndarray, delta: np.ndarray, tiles: Tiles, block_q: int, block_k: int,
                    grads: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """flash_attention_backward for one cell: q (G, g, T, d_k), k (G, 1, S, d_k), ...; fills grads.

    grads = (dq (G, g, T, d_k) zeroed, dk (G, 1, S, d_k), dv (G, 1, S, d_v)), views of the full
    arrays; a kv head's dk, dv sum over its g query heads. Everything is in the working dtype.
    """
    T, d_k = q.shape[2], q.shape[3]
    S = k.shape[2]
    dtype = q.dtype
    scale = np.asarray(1.0 / math.sqrt(d_k), dtype=dtype)
    base = np.where(np.isfinite(lse), lse, 0.0)[..., None]  # (G, g, T, 1): rows with no key get P = 0
    dq, dk, dv = grads  # dq is added to by every key block
    for j, s0 in enumerate(range(0, S, block_k)):  # outer loop: one block of keys, its dk and dv stay here
        s1 = min(s0 + block_k, S)
        kj, vj = k[:, :, s0:s1], v[:, :, s0:s1]  # (G, 1, bk, d_k), (G, 1, bk, d_v)
        dk_j, dv_j = np.zeros_like(kj, dtype=dtype), np.zeros_like(vj, dtype=dtype)
        for i, t0 in enumerate(range(0, T, block_q)):  # inner loop: stream the query blocks
            t1 = min(t0 + block_q, T)
            kind = tiles.kinds[i, j]
            if kind == SKIPPED:
                continue  # the forward's rule: no query here may see a key of the block, P = 0
                # (a GPU kernel starts its loop at the first block not skipped instead)
            scores = (q[:, :, t0:t1] * scale) @ kj.swapaxes(-1, -2)  # (G,g,bq,d_k) @ (G,1,d_k,bk) -> (G,g,bq,bk)
            if tiles.bias is not None:
                scores += tiles.bias(t0, t1, s0, s1)  # the forward's bias: a constant here
            if kind == PARTIAL:
                np.copyto(scores, -np.inf, where=~tiles.allowed(t0, t1, s0, s1))  # weight 0 forward
            p = np.exp(scores - base[:, :, t0:t1])  # (G, g, bq, bk): this tile's share of each whole row
            do_i = dout[:, :, t0:t1]  # (G, g, bq, d_v)
            dv_j += (p.swapaxes(-1, -2) @ do_i).sum(1, keepdims=True)  # (G,g,bk,bq) @ (G,g,bq,d_v), summed over g
            dp = do_i @ vj.swapaxes(-1, -2)  # (G,g,bq,d_v) @ (G,1,d_v,bk) -> (G,g,bq,bk)
            ds = p * (dp - delta[:, :, t0:t1, None]) * scale  # (G, g, bq, bk): d of the unscaled q k^T
            dq[:, :, t0:t1] += ds @ kj  # (G,g,bq,bk) @ (G,1,bk,d_k) -> (G,g,bq,d_k)
            dk_j += (ds.swapaxes(-1, -2) @ q[:, :, t0:t1]).sum(1, keepdims=True)  # (G,g,bk,bq) @ (G,g,bq,d_k), over g
        dk[:, :, s0:s1], dv[:, :, s0:s1] = dk_j, dv_j


def split_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       mask: np.ndarray | MaskSpec | None = None, n_splits: int = 4, *,
                       bias: np.ndarray | None = None,
                       stats: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Flash decoding: q (B, h, T, d_k), k (B, h_kv, S, d_k), v (B, h_kv, S, d_v) in key chunks -> (out, lse).

    With T = 1 (one new token) the query loop of flash_attention has nothing to split, so the keys
    are split instead: each chunk gets its own state (m, ell, acc) (on a GPU, in parallel) and
    hands over its normalised (out, lse); `merge_partials` combines them. `mask` (a boolean array
    or a MaskSpec, lowered to its dense (B|1, h|1, T, S) form: T is small here) and `bias` as in
    flash_attention; a chunk the mask rules out entirely (left of a window) is never computed.
    Grouped-query heads read their shared key/value head, unrepeated. n_splits > S leaves some
    chunks empty (lse = -inf), which the merge ignores. `stats` counts "chunks" computed and "skipped".
    """
    B, h, h_kv, T, S, d_k = _check_qkv(q, k, v)
    n_splits = require_int("n_splits", n_splits)
    g = h // h_kv
    if isinstance(mask, MaskSpec):
        mask = mask.dense()  # (B|1, h|1, T, S) or None when everything is allowed
    mask5 = None if mask is None else _grouped(np.asarray(mask).reshape(mask_shape(mask, B, h, T, S)), g)
    bias5 = None if bias is None else _grouped(_as4("bias", bias, B, h, T, S), g)
    out_dtype, dtype = q.dtype, compute_dtype(q.dtype)  # float16: computed in float32
    q, k, v = (a.astype(dtype, copy=False) for a in (q, k, v))
    qs = q.reshape(B, h_kv, g, T, d_k) * np.asarray(1.0 / math.sqrt(d_k), dtype=dtype)  # (B, h_kv, g, T, d_k)
    k, v = k[:, :, None], v[:, :, None]  # (B, h_kv, 1, S, d): one head for its g queries
    edges = [i * S // n_splits for i in range(n_splits + 1)]  # chunk sizes differ by at most 1
    parts = []
    for s0, s1 in zip(edges[:-1], edges[1:], strict=True):  # independent: one GPU block each
        state = empty_state((B, h_kv, g), T, v.shape[-1], dtype)
        allowed = None if mask5 is None else mask5[..., s0:s1]  # (B|1, h_kv|1, g|1, T, c)
        if s1 > s0 and (allowed is None or allowed.any()):
            scores = qs @ k[..., s0:s1, :].swapaxes(-1, -2)  # (B,h_kv,g,T,d_k) @ (B,h_kv,1,d_k,c) -> (..,T,c)
            if bias5 is not None:
                scores += bias5[..., slice(None) if bias5.shape[-1] == 1 else slice(s0, s1)]
            if allowed is not None:
                np.copyto(scores, -np.inf, where=~allowed)
            state = _update(state, scores, v[..., s0:s1, :])
            _tally(stats, "chunks")
        elif s1 > s0:
            _tally(stats, "skipped")  # every key of the chunk is ruled out: never read
        parts.append(_partial(state))  # each chunk hands over its normalised (out, lse)
    out, lse = functools.reduce(lambda a, b: merge_partials(*a, *b), parts)  # the combine step
    out, lse = out.reshape(B, h, T, -1), lse.reshape(B, h, T)  # (B, h, T, d_v), (B, h, T)
    return out.astype(out_dtype, copy=False), lse.astype(dtype)  # out rounded once; lse working dtype


def _grouped(a4: np.ndarray, g: int) -> np.ndarray:
    """(B|1, h|1, T|1, S|1) -> (B|1, h_kv|1, g|1, T|1, S|1): query heads grouped by their kv head."""
    Bm, hm = a4.shape[:2]
    return a4[:, :, None] if hm == 1 else a4.reshape(Bm, hm // g, g, *a4.shape[2:])


def _tally(stats: dict | None, key: str) -> None:
    """stats[key] += 1, if stats are kept."""
    if stats is not None:
        stats[key] = stats.get(key, 0) + 1


def _partial(state: State) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's normalised (out, lse), lse in float64: m + log(ell) must keep log(ell)'s digits.

    With scores of 1e5 (float16 inputs of a few hundred) float32 spaces numbers 0.008 apart
    there, so an lse rounded to float32 would mis-weigh the chunks by up to 0.8 %; the merge
    then runs in float64 (`merge_partials` computes in the wider of its inputs' dtypes).
    """
    out, _ = _finish(state)  # (..., rows, d_v)
    m, ell, _ = state
    with np.errstate(divide="ignore"):
        lse = m[..., 0].astype(np.float64) + np.log(ell[..., 0].astype(np.float64))  # (..., rows)
    return out, lse


def _check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[int, int, int, int, int, int]:
    """Check q (B, h, T, d_k), k (B, h_kv, S, d_k), v (B, h_kv, S, d_v); return (B, h, h_kv, T, S, d_k)."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        _require_array(name, a)
    require_float("q", q)
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, T, d_k = shape_of(q)
    require_float("k", k)
    require_shape("k", k, (("B", B), ("h_kv", None), ("S", None), ("d_k", d_k)))
    h_kv, S = shape_of(k)[1:3]
    group(h, h_kv)  # h_kv must divide h
    require_float("v", v)
    require_shape("v", v, (("B", B), ("h_kv", h_kv), ("S", S), ("d_v", None)))
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype (as torch's SDPA requires), got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}: convert with .astype(...)")
    return B, h, h_kv, T, S, d_k


def _require_array(name: str, a: object) -> None:
    """numpy arrays only: a torch tensor would be converted silently, one tile at a time."""
    if not isinstance(a, np.ndarray):
        hint = " (for tensors use mha.attention.triton_flash, or .numpy())" if is_torch(a) else ""
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}{hint}")


def _require_offset(offset: int) -> int:
    """offset as an int of any sign; bool and float refused, as steps.causal_mask refuses them."""
    return require_int("offset", offset, minimum=-sys.maxsize - 1)


def tile_schedule(T: int, S: int, block_q: int, block_k: int, causal: bool = True,
                  offset: int = 0) -> np.ndarray:
    """(n_query_blocks, n_key_blocks) array of SKIPPED / PARTIAL / FULL, for the causal mask.

    The causal case of `MaskSpec.tile_kinds`: query t at position t + offset, key s at s; a tile
    is SKIPPED when its first key comes after its last query, FULL when its last key comes no
    later than its first query, PARTIAL when the diagonal cuts through it.
    """
    T, S = require_int("T", T), require_int("S", S)
    block_q, block_k = require_int("block_q", block_q), require_int("block_k", block_k)
    causal, offset = require_bool("causal", causal), _require_offset(offset)
    if not causal:
        return np.full((-(-T // block_q), -(-S // block_k)), FULL, dtype=np.int8)
    spec = MaskSpec(offset + np.arange(T), np.arange(S), causal=True)  # the staircase, by positions
    return spec.tile_kinds(block_q, block_k)[0]  # (n_query_blocks, n_key_blocks)


def format_schedule(kinds: np.ndarray) -> str:
    """A tile schedule as a labelled grid (q0.. rows, k0.. columns) with a legend and counts."""
    kinds = np.asarray(kinds)
    if kinds.ndim != 2 or not set(np.unique(kinds).tolist()) <= set(KIND_NAMES):
        raise ValueError(f"kinds must be a 2-d array of SKIPPED / PARTIAL / FULL ({sorted(KIND_NAMES)}), "
                         f"got shape {kinds.shape} with values {np.unique(kinds).tolist()}")
    nq, nk = kinds.shape
    width = max(len(f"q{nq - 1}"), len(f"k{nk - 1}")) + 1
    lines = [" " * width + "".join(f"{f'k{j}':>{width}}" for j in range(nk))]
    lines += [f"{f'q{i}':<{width}}" + "".join(f"{KIND_LETTERS[int(c)]:>{width}}" for c in row)
              for i, row in enumerate(kinds)]
    lines.append("  ".join(f"{KIND_LETTERS[k]} {name}: {int((kinds == k).sum())}"
                           for k, name in KIND_NAMES.items()))
    return "\n".join(lines)
