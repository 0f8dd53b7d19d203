"""Contract cases for mha_course.tryit.scaled_scores (04_scaled_scores.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import scaled_scores as tryit
from tests.self_checks import Case

# By hand, for sigma^2 = 4 and d_k = 64: Var(q_i k_i) = 4 * 4 = 16, Var(q.k) = 16 * 64 = 1024,
# Var(q.k / 8) = 1024 / 64 = 16, and q.k / 32 has variance 1024 / 32**2 = 1.
VARIANCE, DIVISOR = 16, 32

CASES = [
    Case(tryit.check_variance_and_divisor,
         right=lambda: (VARIANCE, DIVISOR),
         right_forms=[lambda: (16.0, 32.0), lambda: (np.float32(16), 4 * np.sqrt(64)),
                      lambda: (torch.tensor(16.0), torch.tensor(32.0)),
                      lambda: (15.9, DIVISOR), lambda: (16.5, 31.5)],  # read off a measurement
         untried=lambda: (None, None),
         wrong={"variance of one entry": lambda: (4, DIVISOR),
                "swapped": lambda: (DIVISOR, VARIANCE),
                "is Var(q.k) for unit-variance inputs, unscaled": lambda: (64, DIVISOR),
                "before the scale": lambda: (1024, DIVISOR),
                "forgets two things": lambda: (256, DIVISOR),
                "divides the variance by sqrt(d_k)": lambda: (128, DIVISOR),
                "adds the two variances": lambda: (8, DIVISOR),
                "unit-variance inputs: the scale": lambda: (1, DIVISOR),
                "still holds a factor sqrt(d_k)": lambda: (32, DIVISOR),
                "old divisor": lambda: (VARIANCE, 8),
                "allows for one entry's standard deviation": lambda: (VARIANCE, 16),
                "a standard deviation, not a variance": lambda: (VARIANCE, 128),
                "is the variance of q.k itself": lambda: (VARIANCE, 1024),
                "one power too many": lambda: (VARIANCE, 256),
                "sigma^2 alone": lambda: (VARIANCE, 4),
                "factor to multiply q.k by": lambda: (VARIANCE, 1 / 32),
                "dividing by 1 changes nothing": lambda: (VARIANCE, 1),
                "leaves a variance above 1": lambda: (VARIANCE, 10),
                "below 1: the divisor is too large": lambda: (VARIANCE, 50),
                "matches none of the usual slips": lambda: (10, DIVISOR),
                # one value, two slips: both named
                "is sigma, a standard deviation: the question asks for a variance, and each "
                "product has two factors; or 2 divides": lambda: (2, DIVISOR),
                # both parts judged
                "0 of 2 parts right": lambda: (4, 16),
                # unlisted, told by describe_number's named factors
                "a factor d_k too small": lambda: (0.25, DIVISOR),
                "sigma^2 and d_k both too big": lambda: (4096, DIVISOR),
                "sigma^2 and sqrt(d_k) both missing": lambda: (0.5, DIVISOR)},
         garbage=[lambda: ("16", DIVISOR), lambda: (VARIANCE, "32"), lambda: ([16, 32], None),
                  lambda: (float("nan"), DIVISOR), lambda: (True, DIVISOR),
                  lambda: (VARIANCE, 0), lambda: (VARIANCE, -32)],
         secret=["4 * 4", "sigma^2 sqrt(d_k)", "variance 16", "times sigma^2", "times the right",
                 "of the right value"]),
]
