"""Self-check for the Try-it of 04_scaled_scores.ipynb: scores of inputs with variance 4."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import as_number, not_tried, not_yet, right


def _close(got: float, want: float) -> bool:
    """Equal within 2 %: a value read off a measurement counts, a different formula does not."""
    return math.isclose(got, want, rel_tol=0.02)


def _variance_mistakes(sigma2: float, d_k: int) -> list[tuple[float, str]]:
    """Typical wrong variances of q.k / sqrt(d_k), each with the mistake it makes."""
    return [
        (sigma2, f"{sigma2:g} is the variance of one entry of q (or k); each product "
                 f"q_i k_i multiplies two of them, so its variance is sigma^2 times sigma^2"),
        (1.0, "1 is the variance for unit-variance inputs: the scale 1/sqrt(d_k) was chosen for "
              "those, and inputs of variance 4 make every product larger"),
        (float(d_k), f"{d_k} = d_k leaves out the sqrt(d_k) scaling (dividing the scores by "
                     f"sqrt(d_k) divides their variance by d_k), and the inputs' variance too: "
                     f"it is Var(q.k) for unit-variance inputs, unscaled"),
        (sigma2 * d_k, f"{sigma2 * d_k:g} = sigma^2 d_k forgets two things: the products "
                       f"square sigma^2, and dividing by sqrt(d_k) divides the variance by d_k"),
        (sigma2**2 * d_k, f"{sigma2**2 * d_k:g} = sigma^4 d_k is Var(q.k) before the scale: "
                          f"dividing the scores by sqrt(d_k) divides their variance by d_k"),
        (sigma2**2 * math.sqrt(d_k), f"{sigma2**2 * math.sqrt(d_k):g} divides the variance by "
                                     f"sqrt(d_k): dividing a score by c divides its variance by "
                                     f"c squared, here d_k"),
        (math.sqrt(sigma2), f"{math.sqrt(sigma2):g} is sigma, a standard deviation: the "
                            f"question asks for a variance, and the products multiply two "
                            f"variances"),
        (2 * sigma2, f"{2 * sigma2:g} adds the two variances (sigma^2 + sigma^2): for a product "
                     f"of independent mean-0 numbers the variances multiply"),
    ]


def _divisor_mistakes(sigma2: float, d_k: int) -> list[tuple[float, str]]:
    """Typical wrong divisors for q.k, each with the mistake it makes."""
    root = math.sqrt(d_k)
    return [
        (root, f"{root:g} = sqrt(d_k) is the old divisor, right for unit-variance inputs; with "
               f"variance-4 inputs it leaves the variance of the first question, not 1"),
        (math.sqrt(sigma2) * root, f"{math.sqrt(sigma2) * root:g} = sigma sqrt(d_k) uses the "
                                   f"standard deviation of one entry once; the product q_i k_i "
                                   f"has standard deviation sigma times sigma"),
        (sigma2**2 * root, f"{sigma2**2 * root:g} = sigma^4 sqrt(d_k) divides by a variance "
                           f"(times sqrt(d_k)): dividing a score by c divides its variance by c "
                           f"squared, so divide by a standard deviation, not a variance"),
        (sigma2**2 * d_k, f"{sigma2**2 * d_k:g} is Var(q.k) itself: dividing a score by c "
                          f"divides its variance by c squared, so this overshoots far below 1"),
        (sigma2 * d_k, f"{sigma2 * d_k:g} = sigma^2 d_k: the d_k needs its square root "
                       f"(dividing by c divides the variance by c squared)"),
        (float(d_k), f"{d_k} = d_k: divides the variance by d_k squared; the scale uses sqrt(d_k), "
                     f"and the inputs' variance is missing"),
        (sigma2, f"{sigma2:g} = sigma^2 alone: the sqrt(d_k) for the sum of d_k products is "
                 f"missing"),
    ]


def _judge(got: float, want: float, mistakes: list[tuple[float, str]], name: str,
           fallback: str) -> str | None:
    """None if got is right, else why it is not (a named mistake or the fallback)."""
    if _close(got, want):
        return None
    for wrong, why in mistakes:
        if _close(got, wrong) and not _close(wrong, want):
            return f"{name}: {why}"
    return f"{name}: {fallback}"


def _measured_variance(sigma2: float, d_k: int, seed: int = 0) -> float:
    """Var(q.k / sqrt(d_k)) for q, k of variance sigma2, measured on 32,768 pairs of rows."""
    rng = np.random.default_rng(seed)
    q = rng.normal(0.0, math.sqrt(sigma2), size=(32768, d_k))  # (rows, d_k)
    k = rng.normal(0.0, math.sqrt(sigma2), size=(32768, d_k))  # (rows, d_k)
    return float(((q * k).sum(-1) / math.sqrt(d_k)).var())  # (rows,) -> one number


def check_variance_and_divisor(my_variance: Any, my_divisor: Any, sigma2: float = 4.0,
                               d_k: int = 64) -> str:
    """Say right, or which mistake the variance of q.k/sqrt(d_k) and the divisor make."""
    if my_variance is None and my_divisor is None:
        return not_tried("write my_variance and my_divisor (two numbers), then run this cell")
    want_var, want_div = sigma2**2, sigma2 * math.sqrt(d_k)
    problems = []
    if my_variance is not None:
        got = as_number(my_variance, "my_variance")
        problems.append(_judge(got, want_var, _variance_mistakes(sigma2, d_k), "the variance",
                               f"{got:g} matches none of the usual slips; work out "
                               f"Var(q_i k_i) first, then what the sum of d_k of them and "
                               f"the division by sqrt(d_k) do to it"))
    if my_divisor is not None:
        got = as_number(my_divisor, "my_divisor")
        if got <= 0:
            not_yet(f"my_divisor must be a positive number, got {got:g}")
        left = want_var * d_k / got**2  # the variance of q.k / my_divisor
        side = "above 1: the divisor is too small" if left > 1 else "below 1: the divisor is too large"
        problems.append(_judge(got, want_div, _divisor_mistakes(sigma2, d_k), "the divisor",
                               f"dividing q.k by {got:g} leaves a variance {side}; divide by "
                               f"the standard deviation of q.k"))
    wrong = [p for p in problems if p is not None]
    if wrong:
        not_yet("; ".join(wrong))
    if my_divisor is None:
        return not_tried("the variance is right; now write my_divisor")
    if my_variance is None:
        return not_tried("the divisor is right; now write my_variance")
    return right(f"Var(q_i k_i) = {sigma2:g} * {sigma2:g} = {want_var:g}, so q.k / sqrt(d_k) "
                 f"has variance {want_var:g} (measured here: "
                 f"{_measured_variance(sigma2, d_k):.2f}); dividing q.k by sigma^2 sqrt(d_k) = "
                 f"{want_div:g} brings it back to 1")
