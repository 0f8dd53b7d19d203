"""Self-checks for the Try-its of 08_merge_and_output.ipynb: what the explorer shows under the mask.

check_favoured_keys   the explorer's Try it: with d_k = 1, how many keys one head's rows favour
check_zeros_per_head  the lesson's Try it (a): exact zeros per head under the causal mask
check_unchanged_row   the lesson's Try it (b): the row no temperature changes
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..viz import attention_maps
from . import as_number, not_tried, not_yet, right

HEADS, D_MODEL = 4, 16  # the explorer's module in the lesson


def _zero_mistakes(T: int) -> dict[int, str]:
    """Typical wrong counts of exact zeros per head at length T, each with its mistake."""
    below = T * (T + 1) // 2  # the staircase with its diagonal: the weights that may be non-zero
    return {
        below: f"{below} is the number of weights that may be non-zero (the staircase, diagonal "
               f"included), or the zeros with the diagonal counted in: each query sees itself, "
               f"so the zeros are only the ones strictly above the diagonal",
        T * T: f"{T * T} is every weight of a head, T x T; only the ones the mask forbids are 0",
        T: f"{T} is T, one zero per row: the number of forbidden keys changes from row to row "
           f"(query 0 may see only key 0, the last query every key)",
        0: "0 is the count with the mask off: with the causal mask on, every key after the query "
           "gets weight exactly 0",
        T * (T - 1): f"{T * (T - 1)} counts both triangles: the mask forbids only the keys after "
                     f"the query, above the diagonal",
        HEADS * (T * (T - 1) // 2): f"{HEADS * (T * (T - 1) // 2)} counts all {HEADS} heads: the "
                                    f"question is per head",
        (T - 1) * (T - 2) // 2: "off by one: the first key after the query, s = t + 1, is "
                                "forbidden too",
    }


def check_zeros_per_head(answer: Any, T: int = 6) -> str:
    """Say right, or which count the answer is: the exact zeros of one head under the causal mask."""
    if answer is None:
        return not_tried("write how many weights of one head are exactly 0 as `zeros_per_head` "
                         "(an int)")
    got = as_number(answer, "zeros_per_head", integer=True)
    want = int((attention_maps(D_MODEL, HEADS, T, causal=True)[0] == 0).sum())  # head 0
    if got == want:
        return right(f"{want} of the {T * T} weights, every key s > t in every row: "
                     f"T(T - 1)/2, the same in each head, whatever the scores")
    mistakes = _zero_mistakes(T)
    if got in mistakes:
        not_yet(mistakes[got])
    if not 0 <= got <= T * T:
        not_yet(f"a head has T x T = {T * T} weights, so the count lies between 0 and {T * T}, "
                f"got {got}")
    not_yet(f"{got} of the {T * T} weights: count the keys the mask forbids (s > t) row by row, "
            f"in one head")


def check_unchanged_row(answer: Any, T: int = 6) -> str:
    """Say right, or why that row changes with the temperature: the one row with a single key."""
    if answer is None:
        return not_tried("write the index of the row that no temperature changes as "
                         "`unchanged_row` (an int)")
    got = as_number(answer, "unchanged_row", integer=True)
    cold = attention_maps(D_MODEL, HEADS, T, causal=True, temperature=0.1)  # (h, T, T)
    hot = attention_maps(D_MODEL, HEADS, T, causal=True, temperature=10.0)
    steady = [t for t in range(T) if np.array_equal(cold[:, t], hot[:, t])]  # [0]
    if got in steady:
        return right(f"row {got}: query 0 may attend only to key 0, so its weight is exactly 1 "
                     f"at any temperature, in every head")
    if got == -1 or got == T - 1:
        not_yet(f"row {got} is the last row: it may see all {T} keys, so the temperature reshapes "
                f"it the most. Look for the row with the fewest keys allowed")
    if got == 1:
        not_yet("rows are numbered from 0 here, like the arrays: row 1 sees keys 0 and 1, and "
                "their weights move with the temperature")
    if not 0 <= got < T:
        not_yet(f"there is no row {got}: the rows are 0..{T - 1}, one per query")
    not_yet(f"row {got} may see keys 0..{got}, {got + 1} of them, so dividing the scores by the "
            f"temperature moves its weights; look for a query with only one key it may attend to")


def check_favoured_keys(answer: Any, T: int = 6) -> str:
    """Say right, or what the count misses: with d_k = 1 a head's rows favour at most 2 keys."""
    if answer is None:
        return not_tried("write how many different keys, at most, the rows of one head favour "
                         "when d_k = 1, as `favoured_keys` (an int)")
    got = as_number(answer, "favoured_keys", integer=True)
    targets = attention_maps(D_MODEL, D_MODEL, T, causal=False).argmax(axis=-1)  # (h, T)
    want = max(len(set(row.tolist())) for row in targets)  # 2: the largest k or the smallest
    if got == want:
        return right(f"{want}: the score q_t k_s ranks the keys by k_s alone, upwards when "
                     f"q_t > 0 and downwards when q_t < 0, so every row favours the key with the "
                     f"largest k or the one with the smallest")
    if got == 1:
        not_yet("one key for every row would need every q_t to have the same sign: a query with "
                "q_t < 0 turns the ranking upside down and favours the smallest k_s")
    if got == T:
        not_yet(f"{T} = T, one key per row, would need each query to rank the keys its own way; "
                f"with d_k = 1 the score q_t k_s depends on the query only through q_t, a single "
                f"number")
    if got == D_MODEL:
        not_yet(f"{D_MODEL} is h, the number of heads at d_k = 1: the question is about the rows "
                f"of one head")
    if got <= 0:
        not_yet(f"every row favours some key, so the count is at least 1, got {got}")
    not_yet(f"{got} keys: write the score as q_t times k_s and ask which key wins a row when q_t "
            f"is positive, and which when it is negative")
