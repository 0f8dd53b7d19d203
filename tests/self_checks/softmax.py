"""Contract cases for mha.tryit.softmax (06_softmax.ipynb)."""

from mha.tryit import softmax as tryit
from tests.self_checks import Case

# By hand: the mean of [2000, 0, 0, 0] is 500, so exp(2000 - 500) = exp(1500), and float64's exp
# overflows above ln(1.798e308) = 709.78. The max shift gives exp(0) = 1 and exp(-2000) = 0.
RIGHT = [2000.0, 0.0, 0.0, 0.0]

CASES = [
    Case(tryit.check_mean_overflow,
         right=lambda: (RIGHT,),
         wrong={"only without any shift": lambda: ([1000.0, 999.0, 998.0],),  # mean 999: top 1
                "no overflow": lambda: ([100.0, 0.0],),  # top 50
                "overflows in float32": lambda: ([300.0, 0.0, 0.0],),  # top 200 > 88.72
                "all your logits are equal": lambda: ([800.0, 800.0, 800.0],),
                "inf or -inf": lambda: ([float("inf"), 0.0],),
                "holds NaN": lambda: ([float("nan"), 0.0, 2000.0],)},
         garbage=[lambda: ("2000, 0, 0, 0",), lambda: (2000.0,), lambda: ([[2000.0, 0.0], [0.0, 0.0]],),
                  lambda: ([[1.0, 2.0], [3.0]],), lambda: ([True, False],), lambda: (["a", "b"],),
                  lambda: ([5.0],)]),
]
