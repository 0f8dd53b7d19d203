"""Contract cases for mha_course.tryit.softmax (06_softmax.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import softmax as tryit
from tests.self_checks import Case

# By hand: the mean of [2000, 0, 0, 0] is 500, so exp(2000 - 500) = exp(1500), and float64's exp
# overflows above ln(1.798e308) = 709.78. The max shift gives exp(0) = 1 and exp(-2000) = 0.
RIGHT = [2000.0, 0.0, 0.0, 0.0]
# Ten logits 1416 and ten 0: the mean is 708, every exponent is 708 or -708, so each exp fits
# (708 < 709.78) but ten of them add up past the largest float64: only the sum overflows.
SUM_ONLY = [1416.0] * 10 + [0.0] * 10

CASES = [
    Case(tryit.check_mean_overflow,
         right=lambda: (RIGHT,),
         right_forms=[lambda: ((2000, 0, 0, 0),), lambda: (np.array([[2000, 0, 0, 0]]),),
                      lambda: (torch.tensor(RIGHT),), lambda: (np.array(RIGHT, np.float32),),
                      lambda: ([0.0, -1600.0],)],  # mean -800: the 0 is 800 above it
         wrong={"outlier lies BELOW": lambda: ([-2000.0, 0.0, 0.0, 0.0],),
                "only without any shift": lambda: ([1000.0, 999.0, 998.0],),  # mean 999: top 1
                "no overflow": lambda: ([10.0, 0.0],),  # top 5
                "overflows in float32": lambda: ([300.0, 0.0, 0.0],),  # top 200 > 88.72
                "all your logits are equal": lambda: ([800.0, 800.0, 800.0],),
                "inf or -inf": lambda: ([float("inf"), 0.0],),
                "holds NaN": lambda: ([float("nan"), 0.0, 2000.0],),
                # the false reason: 705 < 709.78, only the sum overflows
                "only their sum overflows": lambda: (SUM_ONLY,),
                # not in the old table: each gets a message that names it
                "overflows in float16": lambda: ([30.0, 0.0],),  # top 15 > 11.09
                "the mean, overflows": lambda: ([1e308, 1e308, 0.0],),
                "underflows to 0, which is harmless": lambda: ([-3000.0] + [0.0] * 49,)},  # top 60
         garbage=[lambda: ("2000, 0, 0, 0",), lambda: (2000.0,), lambda: ([[2000.0, 0.0], [0.0, 0.0]],),
                  lambda: ([[1.0, 2.0], [3.0]],), lambda: ([True, False],), lambda: (["a", "b"],),
                  lambda: ([5.0],), lambda: ({"z": [2000.0, 0.0]},)],
         secret=["[2000.0, 0.0, 0.0, 0.0]"]),
]
