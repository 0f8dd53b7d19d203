"""Contract cases for mha.tryit.attention_that_learns (10_attention_that_learns.ipynb)."""

from mha.tryit import attention_that_learns as tryit
from tests.self_checks import Case

RIGHT = [3, 4, 5, 6, 7, 0, 1, 2]  # y[t] = x[(t + 3) % 8], worked out by hand
LEARNED = RIGHT  # what a head that learned the rotation reads (the notebook measures it)

CASES = [
    Case(tryit.check_rotation_keys,
         right=lambda: (RIGHT, LEARNED),
         wrong={"other way": lambda: ([5, 6, 7, 0, 1, 2, 3, 4], LEARNED),
                "do not exist": lambda: ([3, 4, 5, 6, 7, 8, 9, 10], LEARNED),
                "negative keys": lambda: ([-3, -2, -1, 0, 1, 2, 3, 4], LEARNED),
                "diagonal": lambda: ([0, 1, 2, 3, 4, 5, 6, 7], LEARNED),
                "reversal": lambda: ([7, 6, 5, 4, 3, 2, 1, 0], LEARNED),
                "one place short": lambda: ([2, 3, 4, 5, 6, 7, 0, 1], LEARNED),
                "one place too far": lambda: ([4, 5, 6, 7, 0, 1, 2, 3], LEARNED),
                "counted from 1": lambda: ([4, 5, 6, 7, 8, 1, 2, 3], LEARNED),
                "same key": lambda: ([3] * 8, LEARNED),
                "first that goes wrong": lambda: ([3, 4, 5, 6, 7, 1, 0, 2], LEARNED)},
         untried=lambda: (None, LEARNED),
         garbage=[lambda: ("3, 4, 5, 6, 7, 0, 1, 2", LEARNED), lambda: ([3, 4, 5], LEARNED),
                  lambda: ([[3, 4], [5]], LEARNED), lambda: ([3.5] * 8, LEARNED),
                  lambda: ([True] * 8, LEARNED), lambda: (RIGHT, "not measured")]),
]
