"""Self-check for the Try-it of 04_scaled_scores.ipynb: scores of inputs with variance 4."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mha_course.i18n import _
from mha_course.tryit import (
    _factor_table,
    as_number,
    first_match,
    judge_parts,
    not_tried,
    not_yet,
    right,
    self_check,
)


def _close(got: float, want: float) -> bool:
    """Equal within 5 %: a value read off a measurement counts (a 256 x 256 sample of scores
    spreads by about 2 %), a different formula does not (the slips are factors of 2 apart)."""
    return math.isclose(got, want, rel_tol=0.05)


def _variance_mistakes(sigma2: float, d_k: int) -> list[tuple[float, str]]:
    """Typical wrong variances of q.k / sqrt(d_k), each with the mistake it makes."""
    root = math.sqrt(d_k)
    return [
        (sigma2, _("{sigma2:g} is the variance of one entry of q (or k), sigma^2; each term of "
                   "q.k is a product q_i k_i of two such entries: what does a product of two "
                   "independent mean-0 numbers do to their variances?").format(sigma2=sigma2)),
        (1.0, _("1 is the variance for unit-variance inputs: the scale 1/sqrt(d_k) was chosen for "
                "those, and inputs of variance 4 make every product larger")),
        (float(d_k), _("{d_k} = d_k is Var(q.k) for unit-variance inputs, unscaled: it leaves out "
                       "the division by sqrt(d_k) (dividing the scores by sqrt(d_k) divides their "
                       "variance by d_k), and the inputs' variance too").format(d_k=d_k)),
        (sigma2 * d_k, _("{v:g} = sigma^2 d_k forgets two things: each product q_i k_i has two "
                         "factors of variance sigma^2, not one, and dividing by sqrt(d_k) "
                         "divides the variance by d_k").format(v=sigma2 * d_k)),
        (sigma2**2 * d_k, _("{v:g} is the variance of q.k before the scale: dividing the scores "
                            "by sqrt(d_k) divides their variance by d_k").format(v=sigma2**2 * d_k)),
        (sigma2**2 * root, _("{v:g} divides the variance by sqrt(d_k): dividing a score by c "
                             "divides its variance by c squared").format(v=sigma2**2 * root)),
        (math.sqrt(sigma2), _("{v:g} is sigma, a standard deviation: the question asks for a "
                              "variance, and each product has two factors").format(
            v=math.sqrt(sigma2))),
        (2 * sigma2, _("{v:g} adds the two variances, sigma^2 + sigma^2: a product q_i k_i of "
                       "independent mean-0 numbers does not add its factors' variances").format(
            v=2 * sigma2)),
        (sigma2 * root, _("{v:g} still holds a factor sqrt(d_k): the d_k of summing d_k products "
                          "and the d_k of dividing the scores by sqrt(d_k) cancel exactly (and "
                          "each product has two factors of variance sigma^2)").format(
            v=sigma2 * root)),
        (sigma2**2 / root, _("{v:g} divides the variance by sqrt(d_k) once more than needed: the "
                             "sum of d_k products multiplies the variance of one product by d_k, "
                             "which the scale then divides away").format(v=sigma2**2 / root)),
    ]


def _divisor_mistakes(sigma2: float, d_k: int) -> list[tuple[float, str]]:
    """Typical wrong divisors for q.k, each with the mistake it makes."""
    root = math.sqrt(d_k)
    want = sigma2 * root
    return [
        (root, _("{v:g} = sqrt(d_k) is the old divisor, right for unit-variance inputs; with "
                 "variance-4 inputs it leaves the variance of the first question, not 1").format(
            v=root)),
        (math.sqrt(sigma2) * root, _("{v:g} = sigma sqrt(d_k) allows for one entry's standard "
                                     "deviation, but each term of q.k is a product of two "
                                     "entries: what is the standard deviation of that "
                                     "product?").format(v=math.sqrt(sigma2) * root)),
        (sigma2**2 * root, _("{v:g} divides q.k by a variance times sqrt(d_k): dividing by c "
                             "divides the variance by c squared, so the divisor is a standard "
                             "deviation, not a variance").format(v=sigma2**2 * root)),
        (sigma2**2 * d_k, _("{v:g} is the variance of q.k itself: dividing a score by c divides "
                            "its variance by c squared, so this overshoots far below 1").format(
            v=sigma2**2 * d_k)),
        (sigma2 * d_k, _("{v:g} = sigma^2 d_k divides the variance by d_k squared: dividing a "
                         "score by c divides its variance by c squared, so the d_k in the "
                         "divisor is one power too many").format(v=sigma2 * d_k)),
        (float(d_k), _("{d_k} = d_k: divides the variance by d_k squared (the scale uses a "
                       "square root), and the inputs' variance is missing").format(d_k=d_k)),
        (sigma2, _("{sigma2:g} = sigma^2 alone: the sum of d_k products in q.k is left out (if "
                   "you meant a divisor for the scaled scores q.k / sqrt(d_k), the question asks "
                   "what divides q.k itself)").format(sigma2=sigma2)),
        (1 / want, _("that is a factor to multiply q.k by, not a divisor: write the number that "
                     "q.k is divided by")),
        (1.0, _("dividing by 1 changes nothing: q.k keeps its variance, far above 1")),
    ]


def _named(got: float, mistakes: list[tuple[float, str]]) -> str | None:
    """Every listed slip whose value got is (within 5 %), named; None if none fits."""
    return first_match(np.asarray(got), mistakes, atol=0.05 * abs(got))


def _judge_variance(my_variance: Any, sigma2: float, d_k: int) -> str:
    """Right about Var(q.k / sqrt(d_k)), or NotYet naming the slip."""
    if my_variance is None:
        return not_tried(_("write my_variance"))
    got, want = as_number(my_variance, "my_variance"), sigma2**2
    if _close(got, want):
        return right(_("the variance is right"))
    why = _named(got, _variance_mistakes(sigma2, d_k))
    if why is not None:
        not_yet(why)
    factors = {"sigma^2": sigma2, "d_k": d_k, "sqrt(d_k)": math.sqrt(d_k)}
    fits = list(dict.fromkeys(words for value, words in _factor_table(factors)
                              if math.isclose(got / want, value, rel_tol=1e-9, abs_tol=1e-12)))
    if fits:  # the named factors, not the ratio itself
        named = _("; or ").join(fits) + (_(" (two slips give this value)") if len(fits) > 1
                                         else "")
        not_yet(_("{got:g} is off by whole factors ({fits}): work out Var(q_i k_i) first, then "
                  "what the sum of d_k of them and the division by sqrt(d_k) do to it").format(
            got=got, fits=named))
    if got > want:
        not_yet(_("{got:g} is too large and matches none of the usual slips; work out Var(q_i "
                  "k_i) first, then what the sum of d_k of them and the division by sqrt(d_k) do "
                  "to it").format(got=got))
    not_yet(_("{got:g} is too small and matches none of the usual slips; work out Var(q_i k_i) "
              "first, then what the sum of d_k of them and the division by sqrt(d_k) do to "
              "it").format(got=got))


def _judge_divisor(my_divisor: Any, sigma2: float, d_k: int) -> str:
    """Right about the divisor that brings Var(q.k / divisor) back to 1, or NotYet."""
    if my_divisor is None:
        return not_tried(_("write my_divisor"))
    got, want = as_number(my_divisor, "my_divisor"), sigma2 * math.sqrt(d_k)
    if got <= 0:
        not_yet(_("my_divisor must be a positive number, got {got:g}").format(got=got))
    if _close(got, want):
        return right(_("the divisor is right"))
    why = _named(got, _divisor_mistakes(sigma2, d_k))
    if why is not None:
        not_yet(why)
    left = sigma2**2 * d_k / got**2  # the variance of q.k / my_divisor
    if left > 1:
        not_yet(_("dividing q.k by {got:g} leaves a variance above 1: the divisor is too small; "
                  "divide by the standard deviation of q.k").format(got=got))
    not_yet(_("dividing q.k by {got:g} leaves a variance below 1: the divisor is too large; "
              "divide by the standard deviation of q.k").format(got=got))


def _measured_variance(sigma2: float, d_k: int, seed: int = 0) -> float:
    """Var(q.k / sqrt(d_k)) for q, k of variance sigma2, measured on 32,768 pairs of rows."""
    rng = np.random.default_rng(seed)
    q = rng.normal(0.0, math.sqrt(sigma2), size=(32768, d_k))  # (rows, d_k)
    k = rng.normal(0.0, math.sqrt(sigma2), size=(32768, d_k))  # (rows, d_k)
    return float(((q * k).sum(-1) / math.sqrt(d_k)).var())  # (rows,) -> one number


@self_check
def check_variance_and_divisor(my_variance: Any, my_divisor: Any, sigma2: float = 4.0,
                               d_k: int = 64) -> str:
    """Say right, or which mistake the variance of q.k/sqrt(d_k) and the divisor make."""
    if my_variance is None and my_divisor is None:
        return not_tried(_("write my_variance and my_divisor (two numbers), then run this cell"))
    if my_divisor is None:
        _judge_variance(my_variance, sigma2, d_k)
        return not_tried(_("the variance is right; now write my_divisor"))
    if my_variance is None:
        _judge_divisor(my_divisor, sigma2, d_k)
        return not_tried(_("the divisor is right; now write my_variance"))
    var, div = sigma2**2, sigma2 * math.sqrt(d_k)
    pair = [as_number(a, n) for a, n in ((my_variance, "my_variance"), (my_divisor, "my_divisor"))]
    if var != div and math.isclose(pair[0], div, rel_tol=0.05) and \
            math.isclose(pair[1], var, rel_tol=0.05):
        not_yet(_("the two answers are swapped: each is right for the other question "
                  "(my_variance is the variance of q.k / sqrt(d_k); my_divisor is what q.k is "
                  "divided by)"))
    judge_parts(my_variance=lambda: _judge_variance(my_variance, sigma2, d_k),
                my_divisor=lambda: _judge_divisor(my_divisor, sigma2, d_k))  # NotYet unless both
    return right(_("Var(q_i k_i) = {sigma2:g} * {sigma2:g} = {var:g}, so q.k / sqrt(d_k) has "
                   "variance {var:g} (measured here: {measured:.2f}); dividing q.k by sigma^2 "
                   "sqrt(d_k) = {div:g} brings it back to 1").format(
        sigma2=sigma2, var=var, measured=_measured_variance(sigma2, d_k), div=div))
