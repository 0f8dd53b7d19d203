"""FlashAttention in numpy: the online softmax, then steps 3-6 tiled, never forming (T, S).

FlashAttention (Dao et al. 2022) computes exact attention block by block: for each block of
queries it streams over blocks of keys and values, keeps a running row max `m`, a running
sum `ell` (the paper's l) of exp(score - m) and an unnormalised output `acc`, rescales both
when the max grows, and divides once at the end. FlashAttention-2 (Dao 2023) puts the query
blocks in the outer loop, as here, and keeps the row logsumexp m + log(ell) for the
backward pass. Memory is O(block_q * block_k) per step instead of O(T * S).

Shape legend: B batch, h heads, T queries, S keys, d_k head width.
"""

from __future__ import annotations

import math

import numpy as np

from .validate import mask_shape, require_float, require_int, require_shape

SKIPPED, PARTIAL, FULL = 0, 1, 2
"""Tile kinds in `tile_schedule`: never computed, computed with some keys masked, all computed."""


def online_softmax(row: np.ndarray, block: int) -> tuple[np.ndarray, float, float]:
    """Softmax of one row in one streaming pass over blocks: (weights, row max m, sum ell).

    Each block updates the running max and rescales the running sum by exp(m_old - m_new),
    so ell always equals sum(exp(row[:seen] - m)). An all -inf row gives zeros, as steps.softmax.
    """
    row = np.asarray(row)
    require_float("row", row)
    block = require_int("block", block)
    m, ell = -np.inf, 0.0
    for j in range(0, row.shape[-1], block):
        x = row[j:j + block]  # (block,)
        m_new = max(m, float(x.max()))
        if m_new == -np.inf:
            continue  # nothing allowed so far: m and ell stay as they are
        ell = ell * math.exp(m - m_new) + float(np.exp(x - m_new).sum())  # rescale, then add
        m = m_new
    if ell == 0.0:
        return np.zeros_like(row), m, ell
    return (np.exp(row - m) / ell).astype(row.dtype), m, ell


def _allowed_block(t0: int, t1: int, s0: int, s1: int, causal: bool, offset: int,
                   mask4: np.ndarray | None) -> np.ndarray | None:
    """Which scores of the tile (queries t0:t1, keys s0:s1) are allowed; None = all of them."""
    allowed = None
    if causal and s1 - 1 > t0 + offset:  # the diagonal cuts this tile (below it: all allowed)
        t = np.arange(t0, t1)[:, None]  # (bq, 1)
        s = np.arange(s0, s1)[None, :]  # (1, bk)
        allowed = s <= t + offset  # (bq, bk)
    if mask4 is not None:
        m = mask4[..., t0:t1, s0:s1]  # (B|1, h|1, bq, bk)
        allowed = m if allowed is None else m & allowed
    return allowed


def flash_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
                    mask: np.ndarray | None = None, block_q: int = 64, block_k: int = 64,
                    offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Steps 3-6 tiled: q (B, h, T, d_k), k (B, h, S, d_k), v (B, h, S, d_v) -> (out, lse).

    out (B, h, T, d_v) equals steps 3-6 (softmax(q k^T / sqrt(d_k)) v); lse (B, h, T) is each
    row's logsumexp of the scaled scores (-inf for a fully masked row, whose output is 0).
    `causal` lets query t see keys s <= t + offset (offset=0 top-left, S-T bottom-right);
    `mask` is boolean, True = may attend, (T, S), (B, T, S) or (B|1, h|1, T, S).
    """
    require_float("q", q)
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, T, d_k = q.shape
    require_shape("k", k, (("B", B), ("h", h), ("S", None), ("d_k", d_k)))
    S = k.shape[2]
    require_shape("v", v, (("B", B), ("h", h), ("S", S), ("d_v", None)))
    block_q, block_k = require_int("block_q", block_q), require_int("block_k", block_k)
    mask4 = None if mask is None else np.asarray(mask).reshape(mask_shape(mask, B, h, T, S))
    dtype = np.result_type(q, k, v)
    out = np.zeros((B, h, T, v.shape[-1]), dtype=dtype)  # (B, h, T, d_v)
    lse = np.full((B, h, T), -np.inf, dtype=dtype)  # (B, h, T)
    scale = 1.0 / math.sqrt(d_k)  # a Python float keeps float32 as float32
    for t0 in range(0, T, block_q):  # outer loop: one block of queries at a time (FA-2 order)
        t1 = min(t0 + block_q, T)
        qi = q[:, :, t0:t1] * np.asarray(scale, dtype=q.dtype)  # (B, h, bq, d_k)
        m = np.full((B, h, t1 - t0, 1), -np.inf, dtype=dtype)  # running row max
        ell = np.zeros((B, h, t1 - t0, 1), dtype=dtype)  # running sum of exp(score - m)
        acc = np.zeros((B, h, t1 - t0, v.shape[-1]), dtype=dtype)  # unnormalised output
        for s0 in range(0, S, block_k):  # inner loop: stream keys and values
            if causal and s0 > t1 - 1 + offset:
                break  # this tile and every one to its right lie wholly above the diagonal
            s1 = min(s0 + block_k, S)
            scores = qi @ k[:, :, s0:s1].swapaxes(-1, -2)  # (B,h,bq,d_k) @ (B,h,d_k,bk) -> (B,h,bq,bk)
            allowed = _allowed_block(t0, t1, s0, s1, causal, offset, mask4)
            if allowed is not None:
                scores = np.where(allowed, scores, np.array(-np.inf, dtype=dtype))  # (B,h,bq,bk)
            m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))  # (B, h, bq, 1)
            base = np.where(np.isfinite(m_new), m_new, 0.0)  # rows with nothing allowed yet
            p = np.exp(np.subtract(scores, base, out=scores), out=scores)  # (B,h,bq,bk), in place;
            # masked scores give exactly 0
            alpha = np.exp(m - base)  # (B, h, bq, 1): rescales what was summed under the old max
            ell = alpha * ell + p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += p @ v[:, :, s0:s1]  # (B,h,bq,bk) @ (B,h,bk,d_v) -> (B,h,bq,d_v)
            m = m_new
        # one division at the end; a row with nothing allowed (ell = 0) stays 0, like steps.softmax
        out[:, :, t0:t1] = np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)
        with np.errstate(divide="ignore"):
            lse[:, :, t0:t1] = (m + np.log(ell))[..., 0]  # (B, h, bq); -inf where ell = 0
    return out, lse


def tile_schedule(T: int, S: int, block_q: int, block_k: int, causal: bool = True,
                  offset: int = 0) -> np.ndarray:
    """(n_query_blocks, n_key_blocks) array of SKIPPED / PARTIAL / FULL, for the causal mask."""
    T, S = require_int("T", T), require_int("S", S)
    block_q, block_k = require_int("block_q", block_q), require_int("block_k", block_k)
    nq, nk = -(-T // block_q), -(-S // block_k)
    kinds = np.full((nq, nk), FULL, dtype=np.int8)
    if not causal:
        return kinds
    for i in range(nq):
        t0, t1 = i * block_q, min((i + 1) * block_q, T)
        for j in range(nk):
            s0, s1 = j * block_k, min((j + 1) * block_k, S)
            if s0 > t1 - 1 + offset:
                kinds[i, j] = SKIPPED  # every key is after every query of the block
            elif s1 - 1 > t0 + offset:
                kinds[i, j] = PARTIAL  # the diagonal cuts through the tile
    return kinds
