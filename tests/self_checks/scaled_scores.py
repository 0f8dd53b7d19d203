"""Contract cases for mha.tryit.scaled_scores (04_scaled_scores.ipynb)."""

from mha.tryit import scaled_scores as tryit
from tests.self_checks import Case

# By hand, for sigma^2 = 4 and d_k = 64: Var(q_i k_i) = 4 * 4 = 16, Var(q.k) = 16 * 64 = 1024,
# Var(q.k / 8) = 1024 / 64 = 16, and q.k / 32 has variance 1024 / 32**2 = 1.
VARIANCE, DIVISOR = 16, 32

CASES = [
    Case(tryit.check_variance_and_divisor,
         right=lambda: (VARIANCE, DIVISOR),
         untried=lambda: (None, None),
         wrong={"variance of one entry": lambda: (4, DIVISOR),
                "leaves out the sqrt(d_k) scaling": lambda: (64, DIVISOR),
                "before the scale": lambda: (1024, DIVISOR),
                "forgets two things": lambda: (256, DIVISOR),
                "divides the variance by sqrt(d_k)": lambda: (128, DIVISOR),
                "is sigma, a standard deviation": lambda: (2, DIVISOR),
                "adds the two variances": lambda: (8, DIVISOR),
                "unit-variance inputs: the scale": lambda: (1, DIVISOR),
                "old divisor": lambda: (VARIANCE, 8),
                "uses the standard deviation of one entry once": lambda: (VARIANCE, 16),
                "divide by a standard deviation, not a variance": lambda: (VARIANCE, 128),
                "is Var(q.k) itself": lambda: (VARIANCE, 1024),
                "needs its square root": lambda: (VARIANCE, 256),
                "sigma^2 alone": lambda: (VARIANCE, 4),
                "leaves a variance above 1": lambda: (VARIANCE, 10),
                "below 1: the divisor is too large": lambda: (VARIANCE, 50),
                "matches none of the usual slips": lambda: (10, DIVISOR),
                "the variance: 4 is": lambda: (4, 16)},
         garbage=[lambda: ("16", DIVISOR), lambda: (VARIANCE, "32"), lambda: ([16, 32], None),
                  lambda: (float("nan"), DIVISOR), lambda: (True, DIVISOR),
                  lambda: (VARIANCE, 0), lambda: (VARIANCE, -32)]),
]
