"""Contract cases for mha_course.tryit.attention_that_learns (10_attention_that_learns.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import attention_that_learns as tryit
from tests.self_checks import Case

RIGHT = [3, 4, 5, 6, 7, 0, 1, 2]  # y[t] = x[(t + 3) % 8], worked out by hand
LEARNED = RIGHT  # what a head that learned the rotation reads (the notebook measures it)


def measured():
    """`read` as the notebook makes it: the trained head's argmax keys, marked as measured."""
    return tryit.measured_keys(torch.tensor(LEARNED))


def from_measurement(derive):
    """(answer, read) where the answer is derived from the notebook's own measurement."""
    read = measured()
    return derive(read), read


ONE_HOT = np.eye(8, dtype=int)[RIGHT]  # the predicted map itself: row t has its 1 at the key
SOFT = 0.02 + 0.84 * ONE_HOT  # a map of weights: rows sum to 1, largest at the key

CASES = [
    Case(tryit.check_rotation_keys,
         right=lambda: (RIGHT, measured()),
         right_forms=[lambda: (np.array(RIGHT), measured()),
                      lambda: (tuple(RIGHT), measured()),
                      lambda: ([float(k) for k in RIGHT], measured()),
                      lambda: (torch.tensor(RIGHT), measured()),
                      lambda: ({t: k for t, k in enumerate(RIGHT)}, measured()),
                      lambda: (list(enumerate(RIGHT)), measured()),
                      lambda: (ONE_HOT, measured()),
                      lambda: (ONE_HOT.astype(bool), measured()),
                      lambda: ([[k] for k in RIGHT], measured()),
                      lambda: (RIGHT, None),
                      lambda: ("3, 4, 5, 6, 7, 0, 1, 2", measured()),
                      lambda: ("[3 4 5 6 7 0 1 2]", measured()),
                      lambda: ({str(t): k for t, k in enumerate(RIGHT)}, measured()),
                      lambda: ([str(k) for k in RIGHT], measured()),
                      lambda: (SOFT, measured()),  # a predicted map of weights
                      lambda: (RIGHT, np.array(LEARNED))],
         wrong={"other way": lambda: ([5, 6, 7, 0, 1, 2, 3, 4], measured()),
                "do not exist": lambda: ([3, 4, 5, 6, 7, 8, 9, 10], measured()),
                "negative keys": lambda: ([-3, -2, -1, 0, 1, 2, 3, 4], measured()),
                "diagonal": lambda: ([0, 1, 2, 3, 4, 5, 6, 7], measured()),
                "reversal": lambda: ([7, 6, 5, 4, 3, 2, 1, 0], measured()),
                "one place short": lambda: ([2, 3, 4, 5, 6, 7, 0, 1], measured()),
                "queries from 1": lambda: ([4, 5, 6, 7, 0, 1, 2, 3], measured()),
                "counted from 1": lambda: ([4, 5, 6, 7, 8, 1, 2, 3], measured()),
                "same key": lambda: ([3] * 8, measured()),
                "instead of wrapping": lambda: ([3, 4, 5, 6, 7, 7, 7, 7], measured()),
                "multiplies": lambda: ([0, 3, 6, 1, 4, 7, 2, 5], measured()),
                "wraps around at 7": lambda: ([3, 4, 5, 6, 0, 1, 2, 3], measured()),
                # the measurement handed back as the prediction, in the ways a notebook allows
                "is `read.tolist()`": lambda: from_measurement(lambda r: r.tolist()),
                "is `read` itself": lambda: from_measurement(lambda r: r),
                "items of `read`": lambda: from_measurement(lambda r: [r[t] for t in range(8)]),
                "shares its memory": lambda: from_measurement(lambda r: torch.from_numpy(r)),
                # invented, not in the table: each named through how it relates to the right map
                "rotates by 6": lambda: ([6, 7, 0, 1, 2, 3, 4, 5], measured()),
                "reversed along axis 0": lambda: ([2, 1, 0, 7, 6, 5, 4, 3], measured()),
                "all read key 7": lambda: ([3, 4, 5, 6, 7, 7, 1, 2], measured()),
                "6 of 8 entries are right": lambda: ([3, 4, 5, 6, 7, 1, 0, 2], measured()),
                "mirrored": lambda: (SOFT[:, ::-1], measured()),
                "goes down as t grows": lambda: ([3, 2, 1, 0, 7, 6, 5, 4], measured())},
         untried=lambda: (None, measured()),
         garbage=[lambda: ("three, four, ...", measured()), lambda: ([3, 4, 5], measured()),
                  lambda: ([[3, 4], [5]], measured()), lambda: ([3.5] * 8, measured()),
                  lambda: ([True] * 8, measured()), lambda: (RIGHT, "not measured"),
                  lambda: ({0: 3, 1: 4}, measured()), lambda: (np.ones((8, 8)), measured())],
         secret=["3, 4, 5, 6, 7, 0, 1, 2", "[3 4 5 6 7 0 1 2]", "(t + 3) % 8", "(t + 3) mod 8"]),
]
