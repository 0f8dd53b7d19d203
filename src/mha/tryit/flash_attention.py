"""Self-check for the Try-it of 12_flash_attention.ipynb: skipped and partly masked causal tiles."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import flash
from . import as_number, not_tried, not_yet, right


def _pair(answer: Any) -> tuple[float, float]:
    """The answer as two numbers (skipped, partial), or NotYet saying what arrived instead."""
    want = "a pair (skipped, partial) of two whole numbers, e.g. (10, 3)"
    if isinstance(answer, str | bytes | dict | set):
        not_yet(f"answer must be {want}, got {type(answer).__name__} {answer!r}")
    if not isinstance(answer, tuple | list | np.ndarray):
        shown = as_number(answer, "answer")  # a number, or NotYet for anything else
        not_yet(f"answer must be {want}, got one number {shown:g}: give both counts, the skipped "
                f"tiles first")
    if len(answer) != 2:
        not_yet(f"answer must be {want}, got {len(answer)} value{'s' if len(answer) != 1 else ''}")
    return as_number(answer[0], "skipped"), as_number(answer[1], "partial")


def _mistakes(n: int, T: int, block: int) -> dict[tuple[float, float], str]:
    """The typical wrong (skipped, partial) pairs for an n x n grid of tiles, each with its message."""
    above, on, tiles = n * (n - 1) // 2, n, n * n
    grid = f"an {n} x {n} grid of tiles ({T} / {block} = {n} blocks a side)"
    found = {
        (above + on, on): "the diagonal tiles counted as skipped too: a tile on the block diagonal "
                          "holds pairs on and below the diagonal, so it is computed (partly masked), "
                          "never skipped",
        (above + on, 0): "the diagonal tiles counted as skipped instead of partly masked: each holds "
                         "some allowed pairs (a query may see its own key), so it must be computed",
        (above, 0): "no partly masked tiles? The staircase of the causal mask cuts through every "
                    "tile on the block diagonal: those are computed with some scores set to -inf",
        (on, above): "the two counts are swapped: the answer is (skipped, partial), skipped first",
        (tiles / 2, on): "half the grid is skipped only in the limit of tiny tiles; the tiles on the "
                         "diagonal are not skipped, so fewer than half are",
        ((n - 1) * (n - 2) // 2, on): f"off by one in the skipped count: that is the triangle "
                                      f"above the diagonal of a {n - 1} x {n - 1} grid; this is {grid}",
        (above, on - 1): f"off by one in the diagonal: it has one tile for every query block, from "
                         f"the first to the last, in {grid}",
        (above, above): "the second number counts the FULL tiles (wholly below the diagonal): the "
                        "question asks for the partly masked ones",
        (above, above + on): "the second number counts every computed tile (partial and full): "
                             "the question asks for the partly masked ones only",
        (T * (T - 1) // 2, T): "those count scores, not tiles: the question asks how many of the "
                               f"{tiles} tiles of {block} x {block} are skipped or cut",
        (above / tiles, on / tiles): f"those are fractions of the grid: the answer is counts of "
                                     f"tiles out of {tiles}",
        (100 * above / tiles, 100 * on / tiles): f"those are percentages: the answer is counts of "
                                                 f"tiles out of {tiles}",
    }
    if (T, block) != (16, 4):
        found.setdefault((6, 4), f"that is the 16-token, 4 x 4-block example above; here T = {T} "
                                 f"with {block} x {block} blocks, {grid}")
    return found


def check_tile_counts(answer: Any, T: int = 64, block: int = 8) -> str:
    """Say right, or which miscount (skipped, partial) is for causal T = S with square blocks."""
    if answer is None:
        return not_tried("write `answer = (skipped, partial)`: the tiles never computed and the "
                         "tiles the causal mask cuts through, two whole numbers")
    got = _pair(answer)
    kinds = flash.tile_schedule(T, T, block, block, causal=True)  # (n, n) tile kinds
    n, tiles = kinds.shape[0], kinds.size
    want = (int((kinds == flash.SKIPPED).sum()), int((kinds == flash.PARTIAL).sum()))
    if got == want:
        return right(f"{want[0]} of the {tiles} tiles are never computed and {want[1]} are cut by "
                     f"the diagonal; the other {tiles - sum(want)} are computed without a mask")
    for wrong, why in _mistakes(n, T, block).items():
        if np.allclose(got, wrong, rtol=0.0, atol=1e-9):
            not_yet(why)
    if any(g != int(g) for g in got):
        not_yet(f"the counts must be whole numbers of tiles, got {got[0]:g} and {got[1]:g}")
    if min(got) < 0 or sum(got) > tiles:
        not_yet(f"the two counts must be between 0 and the {tiles} tiles of the grid together, got "
                f"{got[0]:g} + {got[1]:g}")
    off = [name for name, g, w in zip(("skipped (first)", "partial (second)"), got, want,
                                      strict=True) if g != w]
    counts = " and the ".join(off) + (" counts are" if len(off) == 2 else " count is")
    not_yet(f"the {counts} not right yet: sketch the {n} x {n} grid, shade "
            f"the tiles wholly right of the staircase (skipped) and those it cuts (partial)")
