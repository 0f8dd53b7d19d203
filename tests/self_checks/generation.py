"""Contract cases for mha_course.tryit.generation (17_generation.ipynb): my_positions(lengths, T)."""

import numpy as np
import torch

from mha.modules import compose
from mha_course.tryit import generation as tryit
from tests.self_checks import Case

LENGTHS, T = [2, 5, 3], 5
# lengths 2, 5, 3 left-padded to T = 5, written out by hand
RIGHT = np.array([[-1, -1, -1, 0, 1],
                  [0, 1, 2, 3, 4],
                  [-1, -1, 0, 1, 2]])


def by_hand(lengths, T):
    """The rule, written here with plain Python (no package code)."""
    return np.array([[-1] * (T - n) + list(range(n)) for n in lengths])


def slip(change):
    """A student's function: the right positions of any batch, then `change` applied to them."""
    return lambda lengths, T: change(by_hand(lengths, T), np.asarray(lengths), T)


def unmasked(lengths, T):
    """Column minus the first real column, pads not set to -1: ..., -3, -2, -1 (right: negative)."""
    return np.arange(T)[None, :] - (T - np.asarray(lengths))[:, None]


def cumsum_form(lengths, T):
    """Another right form: count the real tokens seen so far, minus one (pads stay at -1)."""
    real = np.arange(T)[None, :] >= (T - np.asarray(lengths))[:, None]
    return np.cumsum(real, axis=1) - 1


def call(fn):
    return lambda: (fn, LENGTHS, T)


CASES = [
    Case(tryit.check_padded_positions,
         right=call(by_hand),
         untried=lambda: (None, LENGTHS, T),
         right_forms=[call(lambda ls, T: by_hand(ls, T).astype(float)),  # floats holding whole numbers
                      call(lambda ls, T: by_hand(ls, T).tolist()),
                      call(lambda ls, T: torch.tensor(by_hand(ls, T))),
                      call(unmasked),  # pads at -3, -2, -1: any negative is a pad
                      call(cumsum_form),
                      lambda: (by_hand, np.array(LENGTHS), T),  # lengths as an array
                      lambda: (by_hand, (2, 5, 3), 5)],  # the defaults' tuple
         wrong={
             # the findings
             "used the package's own mha.modules.compose.padded_positions": call(
                 lambda ls, T: compose.padded_positions(np.asarray(ls), T)),
             "put your lines in a def": lambda: (RIGHT.copy(), LENGTHS, T),  # a value, not the rule
             "same array for lengths [1, 4]": call(lambda ls, T: RIGHT.copy()),  # typed for one batch
             "the lesson's batch was right": call(
                 lambda ls, T: RIGHT.copy() if len(ls) == 3 else by_hand(ls, T)[:, ::-1]),
             "return the positions alone": call(lambda ls, T: (by_hand(ls, T), by_hand(ls, T))),
             # the listed slips (A6's first five keep their wording)
             "pads are on the right": call(
                 lambda ls, T: np.array([list(range(n)) + [-1] * (T - n) for n in ls])),
             "pads are at position 0": call(slip(lambda p, ls, T: np.maximum(p, 0))),
             "not 1": call(slip(lambda p, ls, T: np.where(p >= 0, p + 1, -1))),
             "count from the first column": call(slip(lambda p, ls, T: np.where(p >= 0, np.arange(T), -1))),
             "every row is 0..T-1": call(lambda ls, T: np.tile(np.arange(T), (len(ls), 1))),
             "position 1": call(slip(lambda p, ls, T: np.where(p >= 0, p, 1))),
             "counted from 1 with pads at 0": call(slip(lambda p, ls, T: np.maximum(p + 1, 0))),
             "counted backwards": call(slip(lambda p, ls, T: np.where(p >= 0, ls[:, None] - 1 - p, -1))),
             "reverse order": call(lambda ls, T: by_hand(list(ls)[::-1], T)),
             "transposed": call(lambda ls, T: by_hand(ls, T).T),
             "marks it as a pad": call(slip(lambda p, ls, T: np.where(p >= 0, p - 1, -1))),
             "not > 0": call(lambda ls, T: np.where(unmasked(ls, T) > 0, unmasked(ls, T), -1)),
             "first real token got 1": call(lambda ls, T: unmasked(ls, T) + 1),
             "whole numbers": call(lambda ls, T: by_hand(ls, T) + 0.5),
             "raised ZeroDivisionError": call(lambda ls, T: 1 / 0),
             # our own, not in any table: named by the structure of the answer
             "negative position(s)": call(  # L pads instead of T - L
                 lambda ls, T: np.array([[-1] * n + list(range(T - n)) for n in ls])),
             "goes up by 2": call(slip(lambda p, ls, T: np.where(p >= 0, 2 * p, -1))),
             "same position 0": call(slip(lambda p, ls, T: np.where(p >= 0, 0, -1))),
             "nothing is marked as a pad": call(slip(lambda p, ls, T: np.where(p >= 0, p, 99))),
             "wrong columns": call(slip(lambda p, ls, T: np.roll(p, 1, axis=1))),
             "counts up from 1": call(slip(lambda p, ls, T: np.where(p >= 0, p + (ls == 5)[:, None], -1))),
             # and by relate, when no structure fits
             "first that differs": call(slip(lambda p, ls, T: np.where((p == 2) & (ls == 5)[:, None], 3, p))),
         },
         garbage=[lambda: ("seven", LENGTHS, T), lambda: ([[-1, 0], [0, 1, 2]], LENGTHS, T),
                  lambda: (RIGHT >= 0, LENGTHS, T), lambda: (np.zeros((3, 4), dtype=int), LENGTHS, T),
                  lambda: (3, LENGTHS, T), call(lambda ls, T: "positions")],
         secret=[str(RIGHT.tolist()), "[-1, -1, -1, 0, 1]", "t - (t - l)", "T - L"]),
]
