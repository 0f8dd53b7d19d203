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

from mha_course.tryit import first_match, not_tried, not_yet, read_array, right, self_check
from mha_course.viz import attention_maps

HEADS, D_MODEL = 4, 16  # the explorer's module in the lesson


def _count(answer: Any, name: str, per: str) -> int:
    """A whole number, or NotYet: 15, 15.0, np.int64(15), tensor(15), or one count per `per`
    that is the same everywhere ([15, 15, 15, 15]); anything else gets a message."""
    if isinstance(answer, bool | np.bool_ | str | bytes | dict | set):
        not_yet(f"{name} must be a whole number, got {type(answer).__name__} {answer!r:.40}")
    value = read_array(answer, f"{name} must be a whole number")
    if value.dtype == np.bool_ or not np.issubdtype(value.dtype, np.number):
        not_yet(f"{name} must be a whole number, got {type(answer).__name__} of dtype {value.dtype}")
    if value.size == 0:
        not_yet(f"{name} must be a whole number, got an empty {type(answer).__name__}")
    if value.size > 1 and not np.all(value == value.flat[0]):
        shown = ", ".join(f"{v:g}" for v in value.flat[:8])
        not_yet(f"{name} holds {value.size} different numbers ({shown}): the question asks for "
                f"one count, the same for every {per}")
    one = float(value.flat[0])
    if not np.isfinite(one):
        not_yet(f"{name} must be a finite whole number, got {one}")
    if one != int(one):
        not_yet(f"{name} must be a whole number (a count), got {one:g}")
    return int(one)


def _zero_mistakes(T: int) -> list[tuple[int, str]]:
    """Typical wrong counts of exact zeros per head at length T, each with its mistake."""
    below = T * (T + 1) // 2  # the staircase with its diagonal: the weights that may be non-zero
    upper = T * (T - 1) // 2
    listed = [
        (below, f"{below} is the number of weights that may be non-zero (the staircase, diagonal "
                f"included), or the zeros with the diagonal counted in: each query sees itself, "
                f"so the zeros are only the ones strictly above the diagonal"),
        (T * T, f"{T * T} is every weight of a head, T x T; only the ones the mask forbids are 0"),
        (T, f"{T} is T, one zero per row: the number of forbidden keys changes from row to row "
            f"(query 0 may see only key 0, the last query every key)"),
        (0, "0 is the count with the mask off: with the causal mask on, every key after the query "
            "gets weight exactly 0"),
        (T * (T - 1), f"{T * (T - 1)} counts both triangles: the mask forbids only the keys after "
                      f"the query, above the diagonal"),
        (HEADS * upper, f"{HEADS * upper} counts all {HEADS} heads: the question is per head"),
        *((k * upper, f"{k * upper} is the zeros of {k} heads: the question is per head")
          for k in range(2, HEADS)),
        (HEADS * below, f"{HEADS * below} counts the staircase (the weights that may be non-zero) "
                        f"in all {HEADS} heads: the question is the zeros of one head"),
        ((T - 1) * (T - 2) // 2, "off by one: the first key after the query, s = t + 1, is "
                                 "forbidden too"),
        (T - 1, f"{T - 1} counts the zeros of row 0 only (or one per row but the last): "
                f"count every row, each forbids the keys after its query"),
        (T * T // 2, f"{T * T // 2} is half of the T x T weights: the diagonal belongs to the "
                     f"allowed side (each query sees itself), so the forbidden ones are fewer "
                     f"than half"),
    ]
    other = [(k * (k - 1) // 2, f"{k * (k - 1) // 2} is the count for a sequence of {k} tokens "
                                f"(another cell's T?); this question's heads have T = {T}")
             for k in range(3, 17) if k != T]
    other += [(k * (k + 1) // 2, f"{k * (k + 1) // 2} counts the diagonal in, for a sequence of "
                                 f"{k} tokens (another cell's T?); this question's heads have "
                                 f"T = {T}, and each query sees itself")
              for k in range(3, 17) if k != T]
    return listed + [(v, why) for v, why in other if v != T * T]  # T x T said plainly


@self_check
def check_zeros_per_head(answer: Any, T: int = 6) -> str:
    """Say right, or which count the answer is: the exact zeros of one head under the causal mask."""
    if answer is None:
        return not_tried("write how many weights of one head are exactly 0 as `zeros_per_head` "
                         "(an int)")
    got = _count(answer, "zeros_per_head", "head")
    want = int((attention_maps(D_MODEL, HEADS, T, causal=True)[0] == 0).sum())  # head 0
    if got == want:
        return right(f"{want} of the {T * T} weights, every key s > t in every row: "
                     f"T(T - 1)/2, the same in each head, whatever the scores")
    mistake = first_match(np.asarray(got), _zero_mistakes(T))
    if mistake is not None:
        not_yet(mistake)
    if not 0 <= got <= T * T:
        not_yet(f"a head has T x T = {T * T} weights, so the count lies between 0 and {T * T}, "
                f"got {got}")
    if got % HEADS == 0 and got > T * T // 2:
        not_yet(f"{got} is more than half of a head's {T * T} weights and a multiple of the "
                f"{HEADS} heads: did you count several heads? The question is one head")
    side = "too many" if got > want else "too few"
    not_yet(f"{got} is {side}: count, row by row in one head, the keys the mask forbids (s > t, "
            f"strictly after the query), then add the rows up")


@self_check
def check_unchanged_row(answer: Any, T: int = 6) -> str:
    """Say right, or why that row changes with the temperature: the one row with a single key."""
    if answer is None:
        return not_tried("write the index of the row that no temperature changes as "
                         "`unchanged_row` (an int)")
    got = _count(answer, "unchanged_row", "head")
    cold = attention_maps(D_MODEL, HEADS, T, causal=True, temperature=0.1)  # (h, T, T)
    hot = attention_maps(D_MODEL, HEADS, T, causal=True, temperature=10.0)
    steady = [t for t in range(T) if np.array_equal(cold[:, t], hot[:, t])]  # [0]
    row = got + T if -T <= got < 0 else got  # a negative index counts from the end, as in numpy
    counted = f" ({got} counts from the end, so it is row {row})" if got < 0 else ""
    if row in steady:
        return right(f"row {row}{counted}: query 0 may attend only to key 0, so its weight is "
                     f"exactly 1 at any temperature, in every head")
    if not 0 <= row < T:
        not_yet(f"there is no row {got}: the rows are 0..{T - 1}, one per query")
    if row == T - 1:
        not_yet(f"row {row}{counted} is the last row: it may see all {T} keys, so the temperature "
                f"reshapes it the most. Look for the row with the fewest keys allowed")
    if row == 1 and got == 1:
        not_yet("rows are numbered from 0 here, like the arrays: row 1 sees keys 0 and 1, and "
                "their weights move with the temperature")
    not_yet(f"row {row}{counted} may see keys 0..{row}, {row + 1} of them, so dividing the scores "
            f"by the temperature moves its weights; look for a query with only one key it may "
            f"attend to")


@self_check
def check_favoured_keys(answer: Any, T: int = 6) -> str:
    """Say right, or what the count misses: with d_k = 1 a head's rows favour at most 2 keys."""
    if answer is None:
        return not_tried("write how many different keys, at most, the rows of one head favour "
                         "when d_k = 1, as `favoured_keys` (an int)")
    got = _count(answer, "favoured_keys", "head")
    targets = attention_maps(D_MODEL, D_MODEL, T, causal=False).argmax(axis=-1)  # (h, T)
    want = max(len(set(row.tolist())) for row in targets)  # 2: the largest k or the smallest
    if got == want:
        return right(f"{want}: the score q_t k_s ranks the keys by k_s alone, upwards when "
                     f"q_t > 0 and downwards when q_t < 0, so every row favours the key with the "
                     f"largest k or the one with the smallest")
    mistakes = [
        (1, "one key for every row would need every q_t to have the same sign: a query with "
            "q_t < 0 turns the ranking upside down and favours the smallest k_s"),
        (T, f"{T} = T, one key per row, would need each query to rank the keys its own way; "
            f"with d_k = 1 the score q_t k_s depends on the query only through q_t, a single "
            f"number"),
        (D_MODEL, f"{D_MODEL} is h, the number of heads at d_k = 1: the question is about the "
                  f"rows of one head"),
        (D_MODEL * T, f"{D_MODEL * T} counts the rows of all {D_MODEL} heads: the question is "
                      f"how many different keys one head's rows point at"),
        (T * T, f"{T * T} = T x T counts every (query, key) weight: the question is how many "
                f"different keys win a row"),
    ]
    mistake = first_match(np.asarray(got), mistakes)
    if mistake is not None:
        not_yet(mistake)
    if got <= 0:
        not_yet(f"every row favours some key, so the count is at least 1, got {got}")
    if got > T:
        not_yet(f"a head has only {T} keys, so its rows cannot favour {got} different ones")
    not_yet(f"{got} keys: which key wins a row? The one with the largest q_t k_s; for a fixed q_t "
            f"that is a straight line in k_s, so it peaks at one end of the keys' range, never in "
            f"the middle. Which end, when q_t is positive, and when it is negative?")
