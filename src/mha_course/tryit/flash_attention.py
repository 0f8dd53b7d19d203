"""Self-check for the Try-it of 12_flash_attention.ipynb: skipped and partly masked causal tiles.

check_tile_counts  (skipped, partial) for causal T = S = 64 in 8 x 8 blocks, as a pair, a list,
                   an array, a tensor or a dict {"skipped": ..., "partial": ...}

The verdict is returned (a `Verdict`): a pair that fits typical slips names every one it fits; any
other pair is judged count by count, each described by how it relates to the right one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mha.attention import flash
from mha_course.tryit import (
    as_number,
    describe_number,
    first_match,
    judge_parts,
    not_tried,
    not_yet,
    read_array,
    right,
    self_check,
)

WANT = "a pair (skipped, partial) of two whole numbers, e.g. (10, 3)"
_SKIPPED_KEYS = ("skip", "never")  # dict keys naming each count: "skipped", "n_skip", "never"
_PARTIAL_KEYS = ("partial", "part", "masked", "cut", "diag")


def _from_dict(answer: dict) -> tuple[Any, Any]:
    """(skipped, partial) from a dict whose keys say which count is which, or NotYet."""
    def pick(words: tuple[str, ...], what: str) -> Any:
        keys = [k for k in answer if isinstance(k, str) and any(w in k.lower() for w in words)
                and "full" not in k.lower()]
        if len(keys) != 1:
            not_yet(f"a dict works if one key names each count, e.g. {{'skipped': ..., 'partial': "
                    f"...}}; found {len(keys)} key(s) for the {what} tiles among "
                    f"{sorted(map(str, answer))}")
        return answer[keys[0]]
    return pick(_SKIPPED_KEYS, "skipped"), pick(_PARTIAL_KEYS, "partly masked")


def _pair(answer: Any) -> tuple[float, float]:
    """The answer as two numbers (skipped, partial), or NotYet saying what arrived instead."""
    if isinstance(answer, dict):
        first, second = _from_dict(answer)
        return as_number(first, "skipped"), as_number(second, "partial")
    if isinstance(answer, str | bytes | set):
        not_yet(f"answer must be {WANT}, got {type(answer).__name__} {answer!r:.40}")
    if isinstance(answer, list | tuple) and len(answer) == 2:
        return as_number(answer[0], "skipped"), as_number(answer[1], "partial")
    value = read_array(answer, f"answer must be {WANT}")
    if value.ndim == 0:
        shown = as_number(answer, "answer")  # a number, or NotYet for anything else
        not_yet(f"answer must be {WANT}, got one number {shown:g}: give both counts, the skipped "
                f"tiles first")
    if value.dtype == object or value.dtype.kind not in "biuf":
        not_yet(f"answer must be {WANT}, got {type(answer).__name__} of dtype {value.dtype}")
    if value.size == 3:
        not_yet(f"answer must be {WANT}, got three numbers: the question asks for two, the "
                f"skipped and the partly masked tiles (not the full ones)")
    if value.size != 2:
        not_yet(f"answer must be {WANT}, got {value.size} value{'s' if value.size != 1 else ''} "
                f"(shape {value.shape})")
    flat = value.reshape(2)  # (1, 2), (2, 1) and (2,) are all one pair
    return as_number(flat[0], "skipped"), as_number(flat[1], "partial")


def _mistakes(n: int, T: int, block: int) -> list[tuple[tuple[float, float], str]]:
    """The typical wrong (skipped, partial) pairs for an n x n grid of tiles, each with its message."""
    above, on, tiles = n * (n - 1) // 2, n, n * n
    grid = f"an {n} x {n} grid of tiles ({T} / {block} = {n} blocks a side)"
    found = [
        ((above + on, on), "the diagonal tiles counted as skipped too: a tile on the block diagonal "
                           "holds pairs on and below the diagonal, so it is computed (partly "
                           "masked), never skipped"),
        ((above + on, 0), "the diagonal tiles counted as skipped instead of partly masked: each "
                          "holds some allowed pairs (a query may see its own key), so it must be "
                          "computed"),
        ((above, 0), "no partly masked tiles? The staircase of the causal mask cuts through every "
                     "tile on the block diagonal: those are computed with some scores set to -inf"),
        ((on, above), "the two counts are swapped: the answer is (skipped, partial), skipped first"),
        ((tiles / 2, on), "half the grid is skipped only in the limit of tiny tiles; the tiles on "
                          "the diagonal are not skipped, so fewer than half are"),
        ((tiles / 2, 0), "half the grid is skipped only in the limit of tiny tiles, and the "
                         "diagonal tiles are partly masked, not skipped"),
        (((n - 1) * (n - 2) // 2, on), f"off by one in the skipped count: that is the triangle "
                                       f"above the diagonal of a {n - 1} x {n - 1} grid; this is "
                                       f"{grid}"),
        ((above, on - 1), f"off by one in the diagonal: it has one tile for every query block, "
                          f"from the first to the last, in {grid}"),
        ((above, above), "the second number counts the FULL tiles (wholly below the diagonal): "
                         "the question asks for the partly masked ones"),
        ((above, above + on), "the second number counts every computed tile (partial and full): "
                              "the question asks for the partly masked ones only"),
        ((above + above, on), "the tiles below the diagonal counted as skipped too: those are the "
                              "FULL ones, computed without any mask; only the tiles above the "
                              "diagonal are skipped"),
        ((above, 2 * on - 1), "the tiles next to the diagonal counted as partly masked: with square "
                              "blocks aligned to the diagonal the staircase cuts only the diagonal "
                              "tiles; the one just below is wholly visible (FULL)"),
        ((above, 2 * on), "two partly masked tiles in every row of query blocks: with square "
                          "blocks aligned to the diagonal the staircase cuts one tile per row, the "
                          "one on the diagonal; the tile beside it is wholly visible or wholly "
                          "skipped"),
        ((tiles - above, on), "the first number counts the computed tiles (partly masked and "
                              "full), not the skipped ones"),
        ((on, above + on), "the two counts swapped, and the diagonal tiles counted into the "
                           "skipped ones: skipped comes first, and a diagonal tile is computed"),
        ((10, 3), "that is the example in the question, (10, 3), which only shows the form: count "
                  "the tiles of this grid"),
        ((0, on), "nothing skipped? A tile whose keys all come after all its queries holds only "
                  "forbidden pairs, so the loop never computes it (the `break`)"),
        ((0, 0), "that is attention without the causal mask: every tile computed in full; with it, "
                 "the tiles above the diagonal are skipped and those on it cut"),
        ((n - 1, on), "that counts the skipped tiles of the first query block's row only: every "
                      "row of the grid has its own, one fewer each row down"),
        ((T * (T - 1) // 2, T), "those count scores, not tiles: the question asks how many of the "
                                f"{tiles} tiles of {block} x {block} are skipped or cut"),
        ((T * (T + 1) // 2, T), "those count scores, not tiles (the allowed ones, diagonal "
                                f"included): the question asks about the {tiles} tiles of "
                                f"{block} x {block}"),
        ((above / tiles, on / tiles), f"those are fractions of the grid: the answer is counts of "
                                      f"tiles out of {tiles}"),
        ((100 * above / tiles, 100 * on / tiles), f"those are percentages: the answer is counts of "
                                                  f"tiles out of {tiles}"),
    ]
    for k in (2, 3, 4, 5, 6, 7, 9, 10, 12, 16, 32):  # the counts of another grid's n
        if k != n:
            found.append(((k * (k - 1) // 2, k), f"those are the counts of a {k} x {k} grid of "
                                                 f"tiles; here it is {grid}"))
    return found


_HOW = {"skipped": "the skipped tiles lie wholly right of the staircase, strictly above the "
                   "block diagonal: count them row by row of query blocks",
        "partial": "the partly masked tiles are those the staircase passes through: follow it "
                   "across the grid, row by row of query blocks"}


def _one_count(got: float, want: int, name: str, n: int) -> str:
    """A part's verdict: right, or how this count relates to the right one.

    A ratio of 2 or n, or an off-by-one, is said (describe_number); any other ratio only by the
    powers of 2 around it, which cannot give the count away; then how to count.
    """
    if got == want:
        return right(f"your {name} count")
    if got == 0:
        not_yet(f"the {name} count is not 0; {_HOW[name]}")
    r = got / want
    if any(math.isclose(r, x) for x in (2, 1 / 2, n, 1 / n)) or abs(got - want) <= 2:
        said = describe_number(got, want, f"the {name} count", {f"n = {n} (blocks a side)": n})
    else:  # any other ratio, even a whole one (1/28), would give a count this small away
        lo = 2.0 ** math.floor(math.log2(r))
        said = f"the {name} count is between {_frac(lo)} and {_frac(2 * lo)} times the right one"
    not_yet(f"{said}; {_HOW[name]}")


def _frac(x: float) -> str:
    """2 -> '2', 0.25 -> '1/4'."""
    return f"{x:g}" if x >= 1 else f"1/{1 / x:g}"


@self_check
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
    said = first_match(np.array(got), _mistakes(n, T, block), atol=1e-9)
    if said:
        not_yet(said)
    if any(g != int(g) for g in got):
        not_yet(f"the counts must be whole numbers of tiles, got {got[0]:g} and {got[1]:g}")
    if min(got) < 0 or sum(got) > tiles:
        not_yet(f"the two counts must be between 0 and the {tiles} tiles of the grid together, got "
                f"{got[0]:g} + {got[1]:g}")
    if sum(got) == tiles:
        not_yet(f"your two counts add up to all {tiles} tiles: a third kind is left out, the FULL "
                f"tiles wholly below the staircase, computed without any mask")
    return judge_parts(skipped=lambda: _one_count(got[0], want[0], "skipped", n),
                       partial=lambda: _one_count(got[1], want[1], "partial", n))
