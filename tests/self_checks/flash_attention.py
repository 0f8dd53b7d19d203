"""Contract cases for mha_course.tryit.flash_attention (12_flash_attention.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import flash_attention as tryit
from tests.self_checks import Case

CASES = [
    Case(tryit.check_tile_counts,
         right=lambda: ((28, 8),),  # 8 x 8 grid: 7 + 6 + ... + 1 = 28 above the diagonal, 8 on it
         right_forms=[lambda: ([28, 8],), lambda: ((28.0, 8.0),), lambda: (np.array([28, 8]),),
                      lambda: (torch.tensor([28, 8]),), lambda: ((np.int64(28), np.int64(8)),),
                      lambda: (np.array([[28, 8]]),),
                      lambda: ({"skipped": 28, "partial": 8},),  # issue 27: a dict was refused
                      lambda: ({"partial": 8, "skipped": 28},),
                      lambda: ({"SKIPPED": 28, "PARTIAL": 8, "FULL": 28},),  # the lesson's counts
                      lambda: ({"never computed": 28, "partly masked": 8},)],
         wrong={"diagonal tiles counted as skipped too": lambda: ((36, 8),),
                "skipped instead of partly masked": lambda: ((36, 0),),
                "cuts through": lambda: ((28, 0),),
                "swapped": lambda: ((8, 28),),
                "half the grid": lambda: ((32, 8),),
                "off by one in the skipped count": lambda: ((21, 8),),
                "off by one in the diagonal": lambda: ((28, 7),),
                "FULL tiles": lambda: ((28, 28),),
                "every computed tile": lambda: ((28, 36),),
                "scores, not tiles": lambda: ((2016, 64),),
                "fractions": lambda: ((0.4375, 0.125),),
                "percentages": lambda: ((43.75, 12.5),),
                "4 x 4 grid": lambda: ((6, 4),),  # the lesson's 16-token example
                "between 0 and the 64": lambda: ((60, 8),),
                # not in the old table: each used to get one fixed hint
                "1 of 2 parts right": lambda: ((27, 8),),  # skipped off by one, partial right
                "partial count is off by 2": lambda: ((20, 10),),
                "example in the question": lambda: ((10, 3),),
                "skipped count is between 1/4 and 1/2 times": lambda: ((11, 3),),
                "below the diagonal counted as skipped too": lambda: ((56, 8),),
                "tiles next to the diagonal": lambda: ((28, 15),),
                "7 x 7 grid": lambda: ((21, 7),),  # 64 / 8 read as 7 blocks
                "16 x 16 grid": lambda: ((120, 16),),  # blocks of 4
                "a third kind is left out": lambda: ((32, 32),),
                "two partly masked tiles in every row": lambda: ((28, 16),),
                "exactly 2 times": lambda: ((56, 3),),
                "factor n = 8 (blocks a side) too small": lambda: ((28, 1),),
                "nothing skipped": lambda: ((0, 8),),
                "without the causal mask": lambda: ((0, 0),),
                "first query block's row only": lambda: ((7, 8),),
                "skipped count is not 0": lambda: ((0, 5),),
                "between 1/32 and 1/16 times": lambda: ((1, 8),),  # not 'exactly 1/28': that gives 28 away
                "allowed ones, diagonal": lambda: ((2080, 64),),
                "three numbers": lambda: ((28, 8, 28),),
                "one key names each count": lambda: ({"a": 28, "b": 8},)},
         garbage=[lambda: ("28, 8",), lambda: (28,), lambda: ((28.5, 8),),
                  lambda: ([[28], 8],), lambda: ({"skipped": "28", "partial": 8},),
                  lambda: ((True, 8),), lambda: ((float("nan"), 8),), lambda: (np.array([28]),),
                  lambda: ({28, 8},), lambda: (np.zeros((8, 8)),), lambda: ((-28, 8),)],
         secret=["28 of the", "(28, 8)", "28 and 8"]),
]
