"""Self-check for the Try-it of 17_generation.ipynb: the positions of a left-padded batch.

Also the judge of A6's `left_padded_positions` (through `mha.checks.check_padded_positions` and
`mha.diagnose_generation`), so its first five messages keep their wording.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import compose
from . import not_tried, not_yet, read_array, right


def _as_positions(answer: Any, B: int, T: int) -> np.ndarray:
    """The answer as a (B, T) int array, or NotYet saying what arrived instead."""
    got = read_array(answer, f"positions must be a (B={B}, T={T}) int array")
    if got.shape != (B, T):
        swapped = " (that is (T, B): rows and columns transposed, one row per sentence)" \
            if got.shape == (T, B) and B != T else ""
        not_yet(f"positions must be (B={B}, T={T}), one per token, got shape {got.shape}{swapped}")
    if not np.issubdtype(got.dtype, np.integer):
        not_yet(f"positions must be whole numbers (an int array), got dtype {got.dtype}")
    return got


def _mistakes(lengths: np.ndarray, T: int, want: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """(positions a usual slip gives, what the slip is); the first five are A6's wording."""
    real = want >= 0
    cols = np.broadcast_to(np.arange(T), want.shape)  # (B, T): the column numbers
    start = (T - lengths)[:, None]  # (B, 1): the column where each sentence starts
    return [
        (compose.padded_positions(lengths, T, side="right"),
         "the pads are on the right: for generation they go on the LEFT, so every prompt ends in "
         "the last column and the next token is appended in the same place for all"),
        (np.maximum(want, 0), "the pads are at position 0: a pad then looks like each sentence's "
                              "first token and is attended to; mark pads with -1 (negative)"),
        (np.where(real, want + 1, -1), "off by one: a sentence's first real token is at position 0, "
                                       "not 1"),
        (np.where(real, cols, -1), "the positions count from the first column, not from where each "
                                   "sentence starts: a left-padded sentence of length L starts at "
                                   "column T - L, at position 0"),
        (cols, "every row is 0..T-1: that ignores the padding altogether"),
        (cols - start, "the pads count up to the sentence (..., -3, -2, -1): every pad must be exactly "
                       "-1, one marker for all pads, however far from the sentence"),
        (np.where(real, want, 1), "the pads are at position 1 (Hugging Face's generate fills pad "
                                  "positions with 1, because its attention mask hides them); here "
                                  "the position itself marks a pad, so a pad must be -1"),
        (np.maximum(want + 1, 0), "counted from 1 with pads at 0: a sentence's first real token is "
                                  "at position 0, and a pad is -1"),
        (np.where(real, lengths[:, None] - 1 - want, -1),
         "counted backwards: the last token got 0; a sentence counts 0, 1, 2, ... from its FIRST "
         "real token"),
        (compose.padded_positions(lengths[::-1].copy(), T),
         "the rows follow the lengths in reverse order: row b is sentence b, with lengths[b] real "
         "tokens"),
    ]


def check_padded_positions(answer: Any, lengths: Sequence[int] = (2, 5, 3), T: int = 5) -> str:
    """Left-padded positions (B, T): 0..L-1 on each sentence's real tokens, -1 on every pad."""
    if answer is None:
        return not_tried("replace None with your (B, T) array of positions")
    lengths = np.asarray(lengths)
    want = compose.padded_positions(lengths, T)  # (B, T)
    got = _as_positions(answer, len(lengths), T)
    if np.array_equal(got, want):
        return right("each sentence counts 0, 1, ... from its own first token, and every pad is -1")
    for wrong, why in _mistakes(lengths, T, want):
        if np.array_equal(got, wrong):
            not_yet(why)
    b, t = (int(i) for i in np.argwhere(got != want)[0])
    not_yet(f"sequence {b} (length {int(lengths[b])}) at column {t} has {int(got[b, t])}; no usual "
            f"mistake fits. Count each sentence from 0 at its first real token, and give every pad -1")
