"""Contract cases for mha.tryit.flash_attention (12_flash_attention.ipynb)."""

import numpy as np

from mha.tryit import flash_attention as tryit
from tests.self_checks import Case

CASES = [
    Case(tryit.check_tile_counts,
         right=lambda: ((28, 8),),  # 8 x 8 grid: 7 + 6 + ... + 1 = 28 above the diagonal, 8 on it
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
                "example above": lambda: ((6, 4),),
                "skipped (first) count": lambda: ((27, 8),),
                "counts are not right": lambda: ((20, 10),),
                "between 0 and the 64": lambda: ((60, 8),)},
         garbage=[lambda: ("28, 8",), lambda: (28,), lambda: ((28, 8, 28),), lambda: ((28.5, 8),),
                  lambda: ([[28], 8],), lambda: ({"skipped": 28, "partial": 8},),
                  lambda: ((True, 8),), lambda: ((float("nan"), 8),), lambda: (np.array([28]),)]),
]
