"""Self-checks for the Try-its of 08_merge_and_output.ipynb: what the explorer shows under the mask.

check_favoured_keys   the explorer's Try it: with d_k = 1, how many keys one head's rows favour
check_zeros_per_head  the lesson's Try it (a): exact zeros per head under the causal mask
check_unchanged_row   the lesson's Try it (b): the row no temperature changes

Each check returns its verdict (a `Verdict`); the lesson prints both of (a) and (b), so a wrong
(a) never hides the verdict on (b).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mha_course.i18n import _
from mha_course.tryit import first_match, not_tried, not_yet, read_array, right, self_check
from mha_course.viz import attention_maps

HEADS, D_MODEL = 4, 16  # the explorer's module in the lesson


def _count(answer: Any, name: str, per: str) -> int:
    """A whole number, or NotYet: 15, 15.0, np.int64(15), tensor(15), or one count per `per`
    that is the same everywhere ([15, 15, 15, 15]); anything else gets a message."""
    if isinstance(answer, bool | np.bool_ | str | bytes | dict | set):
        not_yet(_("{name} must be a whole number, got {kind} {answer!r:.40}").format(
            name=name, kind=type(answer).__name__, answer=answer))
    value = read_array(answer, _("{name} must be a whole number").format(name=name))
    if value.dtype == np.bool_ or not np.issubdtype(value.dtype, np.number):
        not_yet(_("{name} must be a whole number, got {kind} of dtype {dtype}").format(
            name=name, kind=type(answer).__name__, dtype=value.dtype))
    if value.size == 0:
        not_yet(_("{name} must be a whole number, got an empty {kind}").format(
            name=name, kind=type(answer).__name__))
    if value.size > 1 and not np.all(value == value.flat[0]):
        shown = ", ".join(f"{v:g}" for v in value.flat[:8])
        not_yet(_("{name} holds {n} different numbers ({shown}): the question asks for one "
                  "count, the same for every {per}").format(name=name, n=value.size, shown=shown,
                                                            per=per))
    one = float(value.flat[0])
    if not np.isfinite(one):
        not_yet(_("{name} must be a finite whole number, got {value}").format(name=name,
                                                                               value=one))
    if one != int(one):
        not_yet(_("{name} must be a whole number (a count), got {value:g}").format(name=name,
                                                                                    value=one))
    return int(one)


def _zero_mistakes(T: int) -> list[tuple[int, str]]:
    """Typical wrong counts of exact zeros per head at length T, each with its mistake."""
    below = T * (T + 1) // 2  # the staircase with its diagonal: the weights that may be non-zero
    upper = T * (T - 1) // 2
    listed = [
        (below, _("{n} is the number of weights that may be non-zero (the staircase, diagonal "
                  "included), or the zeros with the diagonal counted in: each query sees itself, "
                  "so the zeros are only the ones strictly above the diagonal").format(n=below)),
        (T * T, _("{n} is every weight of a head, T x T; only the ones the mask forbids are "
                  "0").format(n=T * T)),
        (T, _("{T} is T, one zero per row: the number of forbidden keys changes from row to row "
              "(query 0 may see only key 0, the last query every key)").format(T=T)),
        (0, _("0 is the count with the mask off: with the causal mask on, every key after the "
              "query gets weight exactly 0")),
        (T * (T - 1), _("{n} counts both triangles: the mask forbids only the keys after the "
                        "query, above the diagonal").format(n=T * (T - 1))),
        (HEADS * upper, _("{n} counts all {heads} heads: the question is per head").format(
            n=HEADS * upper, heads=HEADS)),
        *((k * upper, _("{n} is the zeros of {k} heads: the question is per head").format(
            n=k * upper, k=k)) for k in range(2, HEADS)),
        (HEADS * below, _("{n} counts the staircase (the weights that may be non-zero) in all "
                          "{heads} heads: the question is the zeros of one head").format(
            n=HEADS * below, heads=HEADS)),
        ((T - 1) * (T - 2) // 2, _("off by one: the first key after the query, s = t + 1, is "
                                   "forbidden too")),
        (T - 1, _("{n} counts the zeros of row 0 only (or one per row but the last): count every "
                  "row, each forbids the keys after its query").format(n=T - 1)),
        (T * T // 2, _("{n} is half of the T x T weights: the diagonal belongs to the allowed "
                       "side (each query sees itself), so the forbidden ones are fewer than "
                       "half").format(n=T * T // 2)),
    ]
    other = [(k * (k - 1) // 2, _("{n} is the count for a sequence of {k} tokens (another "
                                  "cell's T?); this question's heads have T = {T}").format(
        n=k * (k - 1) // 2, k=k, T=T)) for k in range(3, 17) if k != T]
    other += [(k * (k + 1) // 2, _("{n} counts the diagonal in, for a sequence of {k} tokens "
                                   "(another cell's T?); this question's heads have T = {T}, and "
                                   "each query sees itself").format(n=k * (k + 1) // 2, k=k, T=T))
              for k in range(3, 17) if k != T]
    return listed + [(v, why) for v, why in other if v != T * T]  # T x T said plainly


@self_check
def check_zeros_per_head(answer: Any, T: int = 6) -> str:
    """Say right, or which count the answer is: the exact zeros of one head under the causal mask."""
    if answer is None:
        return not_tried(_("write how many weights of one head are exactly 0 as "
                           "`zeros_per_head` (an int)"))
    got = _count(answer, "zeros_per_head", _("head"))
    want = int((attention_maps(D_MODEL, HEADS, T, causal=True)[0] == 0).sum())  # head 0
    if got == want:
        return right(_("{want} of the {n} weights, every key s > t in every row: T(T - 1)/2, "
                       "the same in each head, whatever the scores").format(want=want, n=T * T))
    mistake = first_match(np.asarray(got), _zero_mistakes(T))
    if mistake is not None:
        not_yet(mistake)
    if not 0 <= got <= T * T:
        not_yet(_("a head has T x T = {n} weights, so the count lies between 0 and {n}, got "
                  "{got}").format(n=T * T, got=got))
    if got % HEADS == 0 and got > T * T // 2:
        not_yet(_("{got} is more than half of a head's {n} weights and a multiple of the {heads} "
                  "heads: did you count several heads? The question is one head").format(
            got=got, n=T * T, heads=HEADS))
    if got > want:
        not_yet(_("{got} is too many: count, row by row in one head, the keys the mask forbids "
                  "(s > t, strictly after the query), then add the rows up").format(got=got))
    not_yet(_("{got} is too few: count, row by row in one head, the keys the mask forbids (s > t, "
              "strictly after the query), then add the rows up").format(got=got))


@self_check
def check_unchanged_row(answer: Any, T: int = 6) -> str:
    """Say right, or why that row changes with the temperature: the one row with a single key."""
    if answer is None:
        return not_tried(_("write the index of the row that no temperature changes as "
                           "`unchanged_row` (an int)"))
    got = _count(answer, "unchanged_row", _("head"))
    cold = attention_maps(D_MODEL, HEADS, T, causal=True, temperature=0.1)  # (h, T, T)
    hot = attention_maps(D_MODEL, HEADS, T, causal=True, temperature=10.0)
    steady = [t for t in range(T) if np.array_equal(cold[:, t], hot[:, t])]  # [0]
    row = got + T if -T <= got < 0 else got  # a negative index counts from the end, as in numpy
    counted = _(" ({got} counts from the end, so it is row {row})").format(got=got, row=row) \
        if got < 0 else ""
    if row in steady:
        return right(_("row {row}{counted}: query 0 may attend only to key 0, so its weight is "
                       "exactly 1 at any temperature, in every head").format(row=row,
                                                                             counted=counted))
    if not 0 <= row < T:
        not_yet(_("there is no row {got}: the rows are 0..{last}, one per query").format(
            got=got, last=T - 1))
    if row == T - 1:
        not_yet(_("row {row}{counted} is the last row: it may see all {T} keys, so the "
                  "temperature reshapes it the most. Look for the row with the fewest keys "
                  "allowed").format(row=row, counted=counted, T=T))
    if row == 1 and got == 1:
        not_yet(_("rows are numbered from 0 here, like the arrays: row 1 sees keys 0 and 1, and "
                  "their weights move with the temperature"))
    not_yet(_("row {row}{counted} may see keys 0..{row}, {n} of them, so dividing the scores by "
              "the temperature moves its weights; look for a query with only one key it may "
              "attend to").format(row=row, counted=counted, n=row + 1))


@self_check
def check_favoured_keys(answer: Any, T: int = 6) -> str:
    """Say right, or what the count misses: with d_k = 1 a head's rows favour at most 2 keys."""
    if answer is None:
        return not_tried(_("write how many different keys, at most, the rows of one head favour "
                           "when d_k = 1, as `favoured_keys` (an int)"))
    got = _count(answer, "favoured_keys", _("head"))
    targets = attention_maps(D_MODEL, D_MODEL, T, causal=False).argmax(axis=-1)  # (h, T)
    want = max(len(set(row.tolist())) for row in targets)  # 2: the largest k or the smallest
    if got == want:
        return right(_("{want}: the score q_t k_s ranks the keys by k_s alone, upwards when "
                       "q_t > 0 and downwards when q_t < 0, so every row favours the key with "
                       "the largest k or the one with the smallest").format(want=want))
    mistakes = [
        (1, _("one key for every row would need every q_t to have the same sign: a query with "
              "q_t < 0 turns the ranking upside down and favours the smallest k_s")),
        (T, _("{T} = T, one key per row, would need each query to rank the keys its own way; "
              "with d_k = 1 the score q_t k_s depends on the query only through q_t, a single "
              "number").format(T=T)),
        (D_MODEL, _("{h} is h, the number of heads at d_k = 1: the question is about the rows "
                    "of one head").format(h=D_MODEL)),
        (D_MODEL * T, _("{n} counts the rows of all {h} heads: the question is how many "
                        "different keys one head's rows point at").format(n=D_MODEL * T,
                                                                          h=D_MODEL)),
        (T * T, _("{n} = T x T counts every (query, key) weight: the question is how many "
                  "different keys win a row").format(n=T * T)),
    ]
    mistake = first_match(np.asarray(got), mistakes)
    if mistake is not None:
        not_yet(mistake)
    if got <= 0:
        not_yet(_("every row favours some key, so the count is at least 1, got {got}").format(
            got=got))
    if got > T:
        not_yet(_("a head has only {T} keys, so its rows cannot favour {got} different "
                  "ones").format(T=T, got=got))
    not_yet(_("{got} keys: which key wins a row? The one with the largest q_t k_s; for a fixed "
              "q_t that is a straight line in k_s, so it peaks at one end of the keys' range, "
              "never in the middle. Which end, when q_t is positive, and when it is "
              "negative?").format(got=got))
