"""Self-check for the Try-it of 16_positions_and_variants.ipynb: RoPE positions of a chunk after a cache.

The student writes `chunk_positions(n_cached, t_new)`: the positions at which the t_new new
queries must be rotated when n_cached tokens are already in the KV cache. The check calls it,
names the usual slips by the positions it returns, then checks the scores those positions give
against the rows of a full forward over all n_cached + t_new tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import posenc, steps
from . import not_tried, not_yet, read_array, right

CASE = dict(n_cached=5, t_new=3)  # the lesson's question: positions 5, 6, 7
OTHER_SIZES = ((2, 4), (0, 3), (9, 1))
"""(n_cached, t_new) the function must also get right: the numbers of the example are not the rule."""


def _call(fn: Callable, n_cached: int, t_new: int) -> Any:
    """fn(n_cached, t_new), or NotYet saying what it raised."""
    try:
        return fn(n_cached, t_new)
    except Exception as e:  # noqa: BLE001 - a student's function may raise anything
        not_yet(f"chunk_positions({n_cached}, {t_new}) raised {type(e).__name__}: {e}")


def _as_positions(out: Any, n_cached: int, t_new: int) -> np.ndarray:
    """The returned positions as a (t_new,) int array, or NotYet saying what arrived instead."""
    call = f"chunk_positions({n_cached}, {t_new})"
    p = read_array(out, f"{call} must return an int array of positions")
    if p.dtype == np.bool_ or not np.issubdtype(p.dtype, np.number):
        not_yet(f"{call} must return whole numbers (an int array of positions), got dtype {p.dtype}")
    if p.ndim != 1:
        not_yet(f"{call} must return a 1-D array, one position per new query (shape ({t_new},)), "
                f"got shape {p.shape}")
    if len(p) == n_cached + t_new and n_cached > 0:
        not_yet(f"{call} returned all {len(p)} positions of the sequence: return only the "
                f"t_new = {t_new} positions of the new queries; the cached keys were rotated once, "
                f"when they were stored, and are not rotated again")
    if len(p) != t_new:
        not_yet(f"{call} returned {len(p)} positions: want t_new = {t_new}, one per new query")
    if not np.issubdtype(p.dtype, np.integer):
        whole = bool(np.all(np.isfinite(p)) and np.array_equal(p, np.round(p)))
        not_yet(f"{call} returned floats ({p.dtype}): positions are whole numbers, return an int "
                f"array" + (" (np.arange with int arguments gives one)" if whole else
                            f"; {p.tolist()} are not even whole"))
    return p.astype(np.int64)


def _same(out: Any, want: np.ndarray) -> bool:
    """Whether a returned value is exactly the int positions `want` (any other kind: no)."""
    try:
        p = np.asarray(out.detach().cpu() if hasattr(out, "detach") else out)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        return False
    return p.shape == want.shape and np.issubdtype(p.dtype, np.integer) and np.array_equal(p, want)


def _mistakes(n_cached: int, t_new: int) -> list[tuple[np.ndarray, str]]:
    """(positions a usual slip gives, what the slip is), for this cache size and chunk."""
    i = np.arange(t_new)
    want = n_cached + i
    return [
        (i, "the chunk is rotated from 0, as if nothing were cached (0, 1, 2, ...): the new queries "
            "are tokens n_cached + i of the sequence, so rotating them from 0 makes every score see "
            "the wrong offset (check_relative calls this positions_ignored)"),
        (want - 1, "off by one, one too early: that counts from the last cached token, which is "
                   "already in the cache at position n_cached - 1; the first new query comes after it"),
        (want + 1, "off by one the other way, one too late: the cached tokens sit at 0 .. "
                   "n_cached - 1, so no position is skipped before the first new query"),
        (want[::-1], "the right positions, reversed: query i of the chunk is the i-th new token, "
                     "so the positions grow with i"),
        (i + 1, "counted from 1 within the chunk: positions count from 0, and from the start of "
                "the sequence, cached tokens included"),
        (n_cached - t_new + i, "that is S - t_new + i with S = n_cached: in the offset S - t_new, "
                               "S is the length AFTER the chunk is appended (n_cached + t_new)"),
    ]


def _rows_matched(positions: np.ndarray, n_cached: int, t_new: int) -> tuple[list[int | None], bool]:
    """For each new query, the row of the full forward's scores its own scores equal (None: no row)."""
    rng = np.random.default_rng(14)
    S = n_cached + t_new
    q = rng.normal(size=(1, 2, S, 16))  # (B, h, S, d_k): the queries of all S tokens
    k = rng.normal(size=(1, 2, S, 16))  # (B, h, S, d_k): n_cached cached keys + t_new new ones
    rot_k = posenc.rope(k, np.arange(S))  # (B, h, S, d_k): each key at its own position
    full = steps.scaled_scores(posenc.rope(q, np.arange(S)), rot_k)  # (B, h, S, S)
    chunk = steps.scaled_scores(posenc.rope(q[:, :, n_cached:], positions), rot_k)  # (B, h, t_new, S)
    rows = [next((r for r in range(S) if np.allclose(chunk[:, :, j], full[:, :, r], rtol=0, atol=1e-12)),
                 None) for j in range(t_new)]
    same = bool(np.allclose(chunk, full[:, :, n_cached:], rtol=0, atol=1e-12))
    return rows, same


def check_chunk_positions(chunk_positions: Any, n_cached: int = 5, t_new: int = 3) -> str:
    """Say right, or which slip the positions chunk_positions(n_cached, t_new) returns make."""
    if chunk_positions is None:
        return not_tried("write the function chunk_positions(n_cached, t_new) and pass it (no brackets)")
    if not callable(chunk_positions):
        not_yet(f"pass the function itself, chunk_positions (no brackets), not a value: got "
                f"{type(chunk_positions).__name__} {chunk_positions!r:.60}")
    out = _call(chunk_positions, n_cached, t_new)
    if out is None:
        return not_tried(f"chunk_positions({n_cached}, {t_new}) returns None: write its body so "
                         f"that it returns the positions as an int array (and check its `return`)")
    got = _as_positions(out, n_cached, t_new)
    want = n_cached + np.arange(t_new)
    if not np.array_equal(got, want):
        for wrong, why in _mistakes(n_cached, t_new):
            if np.array_equal(got, wrong):
                not_yet(why)
        if len(set(got.tolist())) == 1 and t_new > 1:
            not_yet(f"every new query at the same position {int(got[0])}: each token has its own "
                    f"position, one more than the token before it")
        rows, _ = _rows_matched(got, n_cached, t_new)
        seen = ", ".join("no row" if r is None else f"row {r}" for r in rows)
        not_yet(f"positions {got.tolist()} are none of the usual slips: the new queries' scores "
                f"equal {seen} of the full forward's scores, and they should equal rows "
                f"{n_cached} .. {n_cached + t_new - 1}")
    for n, t in OTHER_SIZES:
        other = _call(chunk_positions, n, t)
        if not _same(other, n + np.arange(t)):
            shown = np.asarray(other).tolist() if isinstance(other, np.ndarray) else other
            not_yet(f"right for chunk_positions({n_cached}, {t_new}), but chunk_positions({n}, {t}) "
                    f"gives {shown!r:.60}: build the positions from n_cached and t_new, not from "
                    f"the numbers of this example")
    rows, same = _rows_matched(got, n_cached, t_new)
    if not same:  # cannot happen for the right positions; guards the check itself
        not_yet(f"the positions look right but their scores equal rows {rows} of the full forward")
    return right(f"query i of the chunk is token n_cached + i; at those positions the new queries' "
                 f"scores equal rows {n_cached} .. {n_cached + t_new - 1} of the full forward (within "
                 f"1e-12), and your function is right for other cache sizes too")
