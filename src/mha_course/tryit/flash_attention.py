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
from mha_course.i18n import _
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

_SKIPPED_KEYS = ("skip", "never")  # dict keys naming each count: "skipped", "n_skip", "never"
_PARTIAL_KEYS = ("partial", "part", "masked", "cut", "diag")


def _want() -> str:
    """What the answer must be."""
    return _("a pair (skipped, partial) of two whole numbers, e.g. (10, 3)")


def _from_dict(answer: dict) -> tuple[Any, Any]:
    """(skipped, partial) from a dict whose keys say which count is which, or NotYet."""
    def pick(words: tuple[str, ...], what: str) -> Any:
        keys = [k for k in answer if isinstance(k, str) and any(w in k.lower() for w in words)
                and "full" not in k.lower()]
        if len(keys) != 1:
            not_yet(_("a dict works if one key names each count, e.g. {{'skipped': ..., "
                      "'partial': ...}}; found {n} key(s) for the {what} tiles among "
                      "{keys}").format(n=len(keys), what=what, keys=sorted(map(str, answer))))
        return answer[keys[0]]
    return pick(_SKIPPED_KEYS, _("skipped")), pick(_PARTIAL_KEYS, _("partly masked"))


def _pair(answer: Any) -> tuple[float, float]:
    """The answer as two numbers (skipped, partial), or NotYet saying what arrived instead."""
    if isinstance(answer, dict):
        first, second = _from_dict(answer)
        return as_number(first, "skipped"), as_number(second, "partial")
    if isinstance(answer, str | bytes | set):
        not_yet(_("answer must be {want}, got {kind} {answer!r:.40}").format(
            want=_want(), kind=type(answer).__name__, answer=answer))
    if isinstance(answer, list | tuple) and len(answer) == 2:
        return as_number(answer[0], "skipped"), as_number(answer[1], "partial")
    value = read_array(answer, _("answer must be {want}").format(want=_want()))
    if value.ndim == 0:
        shown = as_number(answer, "answer")  # a number, or NotYet for anything else
        not_yet(_("answer must be {want}, got one number {shown:g}: give both counts, the skipped "
                  "tiles first").format(want=_want(), shown=shown))
    if value.dtype == object or value.dtype.kind not in "biuf":
        not_yet(_("answer must be {want}, got {kind} of dtype {dtype}").format(
            want=_want(), kind=type(answer).__name__, dtype=value.dtype))
    if value.size == 3:
        not_yet(_("answer must be {want}, got three numbers: the question asks for two, the "
                  "skipped and the partly masked tiles (not the full ones)").format(want=_want()))
    if value.size == 1:
        not_yet(_("answer must be {want}, got 1 value (shape {shape})").format(
            want=_want(), shape=value.shape))
    if value.size != 2:
        not_yet(_("answer must be {want}, got {n} values (shape {shape})").format(
            want=_want(), n=value.size, shape=value.shape))
    flat = value.reshape(2)  # (1, 2), (2, 1) and (2,) are all one pair
    return as_number(flat[0], "skipped"), as_number(flat[1], "partial")


def _mistakes(n: int, T: int, block: int) -> list[tuple[tuple[float, float], str]]:
    """The typical wrong (skipped, partial) pairs for an n x n grid of tiles, each with its message."""
    above, on, tiles = n * (n - 1) // 2, n, n * n
    grid = _("an {n} x {n} grid of tiles ({T} / {block} = {n} blocks a side)").format(
        n=n, T=T, block=block)
    found = [
        ((above + on, on), _("the diagonal tiles counted as skipped too: a tile on the block "
                             "diagonal holds pairs on and below the diagonal, so it is computed "
                             "(partly masked), never skipped")),
        ((above + on, 0), _("the diagonal tiles counted as skipped instead of partly masked: each "
                            "holds some allowed pairs (a query may see its own key), so it must "
                            "be computed")),
        ((above, 0), _("no partly masked tiles? The staircase of the causal mask cuts through "
                       "every tile on the block diagonal: those are computed with some scores set "
                       "to -inf")),
        ((on, above), _("the two counts are swapped: the answer is (skipped, partial), skipped "
                        "first")),
        ((tiles / 2, on), _("half the grid is skipped only in the limit of tiny tiles; the tiles "
                            "on the diagonal are not skipped, so fewer than half are")),
        ((tiles / 2, 0), _("half the grid is skipped only in the limit of tiny tiles, and the "
                           "diagonal tiles are partly masked, not skipped")),
        (((n - 1) * (n - 2) // 2, on), _("off by one in the skipped count: that is the triangle "
                                         "above the diagonal of a {m} x {m} grid; this is "
                                         "{grid}").format(m=n - 1, grid=grid)),
        ((above, on - 1), _("off by one in the diagonal: it has one tile for every query block, "
                            "from the first to the last, in {grid}").format(grid=grid)),
        ((above, above), _("the second number counts the FULL tiles (wholly below the diagonal): "
                           "the question asks for the partly masked ones")),
        ((above, above + on), _("the second number counts every computed tile (partial and "
                                "full): the question asks for the partly masked ones only")),
        ((above + above, on), _("the tiles below the diagonal counted as skipped too: those are "
                                "the FULL ones, computed without any mask; only the tiles above "
                                "the diagonal are skipped")),
        ((above, 2 * on - 1), _("the tiles next to the diagonal counted as partly masked: with "
                                "square blocks aligned to the diagonal the staircase cuts only "
                                "the diagonal tiles; the one just below is wholly visible "
                                "(FULL)")),
        ((above, 2 * on), _("two partly masked tiles in every row of query blocks: with square "
                            "blocks aligned to the diagonal the staircase cuts one tile per row, "
                            "the one on the diagonal; the tile beside it is wholly visible or "
                            "wholly skipped")),
        ((tiles - above, on), _("the first number counts the computed tiles (partly masked and "
                                "full), not the skipped ones")),
        ((on, above + on), _("the two counts swapped, and the diagonal tiles counted into the "
                             "skipped ones: skipped comes first, and a diagonal tile is "
                             "computed")),
        ((10, 3), _("that is the example in the question, (10, 3), which only shows the form: "
                    "count the tiles of this grid")),
        ((0, on), _("nothing skipped? A tile whose keys all come after all its queries holds only "
                    "forbidden pairs, so the loop never computes it (the `break`)")),
        ((0, 0), _("that is attention without the causal mask: every tile computed in full; with "
                   "it, the tiles above the diagonal are skipped and those on it cut")),
        ((n - 1, on), _("that counts the skipped tiles of the first query block's row only: every "
                        "row of the grid has its own, one fewer each row down")),
        ((T * (T - 1) // 2, T), _("those count scores, not tiles: the question asks how many of "
                                  "the {tiles} tiles of {block} x {block} are skipped or "
                                  "cut").format(tiles=tiles, block=block)),
        ((T * (T + 1) // 2, T), _("those count scores, not tiles (the allowed ones, diagonal "
                                  "included): the question asks about the {tiles} tiles of "
                                  "{block} x {block}").format(tiles=tiles, block=block)),
        ((above / tiles, on / tiles), _("those are fractions of the grid: the answer is counts of "
                                        "tiles out of {tiles}").format(tiles=tiles)),
        ((100 * above / tiles, 100 * on / tiles), _("those are percentages: the answer is counts "
                                                    "of tiles out of {tiles}").format(tiles=tiles)),
    ]
    for k in (2, 3, 4, 5, 6, 7, 9, 10, 12, 16, 32):  # the counts of another grid's n
        if k != n:
            found.append(((k * (k - 1) // 2, k), _("those are the counts of a {k} x {k} grid of "
                                                   "tiles; here it is {grid}").format(k=k,
                                                                                     grid=grid)))
    return found


def _how(name: str) -> str:
    """How to count one kind of tile."""
    if name == "skipped":
        return _("the skipped tiles lie wholly right of the staircase, strictly above the block "
                 "diagonal: count them row by row of query blocks")
    return _("the partly masked tiles are those the staircase passes through: follow it across "
             "the grid, row by row of query blocks")


def _count_words(name: str) -> tuple[str, str]:
    """('your skipped count', 'the skipped count') in the learner's language."""
    if name == "skipped":
        return _("your skipped count"), _("the skipped count")
    return _("your partial count"), _("the partial count")


def _one_count(got: float, want: int, name: str, n: int) -> str:
    """A part's verdict: right, or how this count relates to the right one.

    A ratio of 2 or n, or an off-by-one, is said (describe_number); any other ratio only by the
    powers of 2 around it, which cannot give the count away; then how to count.
    """
    yours, count = _count_words(name)
    if got == want:
        return right(yours)
    if got == 0:
        not_yet(_("{count} is not 0; {how}").format(count=count, how=_how(name)))
    r = got / want
    if any(math.isclose(r, x) for x in (2, 1 / 2, n, 1 / n)) or abs(got - want) <= 2:
        said = describe_number(got, want, count,
                               {_("n = {n} (blocks a side)").format(n=n): n})
    else:  # any other ratio, even a whole one (1/28), would give a count this small away
        lo = 2.0 ** math.floor(math.log2(r))
        said = _("{count} is between {lo} and {hi} times the right one").format(
            count=count, lo=_frac(lo), hi=_frac(2 * lo))
    not_yet(_("{said}; {how}").format(said=said, how=_how(name)))


def _frac(x: float) -> str:
    """2 -> '2', 0.25 -> '1/4'."""
    return f"{x:g}" if x >= 1 else f"1/{1 / x:g}"


@self_check
def check_tile_counts(answer: Any, T: int = 64, block: int = 8) -> str:
    """Say right, or which miscount (skipped, partial) is for causal T = S with square blocks."""
    if answer is None:
        return not_tried(_("write `answer = (skipped, partial)`: the tiles never computed and the "
                           "tiles the causal mask cuts through, two whole numbers"))
    got = _pair(answer)
    kinds = flash.tile_schedule(T, T, block, block, causal=True)  # (n, n) tile kinds
    n, tiles = kinds.shape[0], kinds.size
    want = (int((kinds == flash.SKIPPED).sum()), int((kinds == flash.PARTIAL).sum()))
    if got == want:
        return right(_("{skipped} of the {tiles} tiles are never computed and {partial} are cut "
                       "by the diagonal; the other {full} are computed without a mask").format(
                           skipped=want[0], tiles=tiles, partial=want[1], full=tiles - sum(want)))
    said = first_match(np.array(got), _mistakes(n, T, block), atol=1e-9)
    if said:
        not_yet(said)
    if any(g != int(g) for g in got):
        not_yet(_("the counts must be whole numbers of tiles, got {a:g} and {b:g}").format(
            a=got[0], b=got[1]))
    if min(got) < 0 or sum(got) > tiles:
        not_yet(_("the two counts must be between 0 and the {tiles} tiles of the grid together, "
                  "got {a:g} + {b:g}").format(tiles=tiles, a=got[0], b=got[1]))
    if sum(got) == tiles:
        not_yet(_("your two counts add up to all {tiles} tiles: a third kind is left out, the "
                  "FULL tiles wholly below the staircase, computed without any mask").format(
                      tiles=tiles))
    return judge_parts(skipped=lambda: _one_count(got[0], want[0], "skipped", n),
                       partial=lambda: _one_count(got[1], want[1], "partial", n))
