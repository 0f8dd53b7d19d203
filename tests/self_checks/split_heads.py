"""Contract cases for mha_course.tryit.split_heads (03_split_heads.ipynb)."""

import numpy as np

from mha import steps
from mha_course import planted
from mha_course.tryit import split_heads as tryit
from tests.self_checks import Case


def right_rule(B, T, d_model, h):
    """Worked out by hand: the skipped transpose swaps h and T, a no-op if either is 1."""
    return T == 1 or h == 1


def measuring_rule(B, T, d_model, h):
    """Not a rule: runs the package's round trip on each shape (the guard must catch it)."""
    x = np.random.default_rng(0).normal(size=(B, T, d_model))  # (B, T, d_model)
    return bool(np.array_equal(planted.merge_no_transpose(steps.split_heads(x, h)), x))


CASES = [
    Case(tryit.check_harmless_rule,
         right=lambda: (right_rule,),
         right_forms=[lambda: (lambda B, T, d_model, h: min(T, h) == 1,),
                      lambda: (lambda B, T, d_model, h: np.logical_or(T == 1, h == 1),),
                      lambda: (lambda B, T, d_model, h: int(T == 1 or h == 1),),
                      lambda: (lambda B, T, d_model, h: T * h == max(T, h),)],
         wrong={"always harmless": lambda: (lambda B, T, d_model, h: True,),
                "parameters are in another order": lambda: (lambda B, h, T, d: h == 1 or T == 1,),
                "always matters": lambda: (lambda B, T, d_model, h: False,),
                "shapes with one head": lambda: (lambda B, T, d_model, h: h == 1,),
                "shapes with one token": lambda: (lambda B, T, d_model, h: T == 1,),
                "one token and one head at once": lambda: (lambda B, T, d_model, h: T == 1 and h == 1,),
                "depends on B": lambda: (lambda B, T, d_model, h: B == 1,),
                "depends on d_k": lambda: (lambda B, T, d_model, h: d_model // h == 1,),
                "equal length": lambda: (lambda B, T, d_model, h: T == h,),
                "what do the shapes": lambda: (lambda B, T, d_model, h: T * h < 4,),
                # the exercise's rule: a rule, not the package's round trip
                "not a run of the round trip": lambda: (measuring_rule,),
                # unlisted: told how the rule errs and what it depends on
                "when only B changes": lambda: (lambda B, T, d_model, h: T == 1 or h == 1 or B == 1,),
                "when only d_model changes": lambda: (lambda B, T, d_model, h: T == 1 or d_model == h,),
                "calls 3 shapes harmless": lambda: (lambda B, T, d_model, h: T == 1 or h == 1 or T == h,),
                "misses 5 shapes": lambda: (lambda B, T, d_model, h: T * h <= 2,)},
         garbage=[lambda: ("h == 1",), lambda: (True,),
                  lambda: (lambda B, T, d_model, h: None,),
                  lambda: (lambda B, T, d_model, h: "yes",),
                  lambda: (lambda B, T: T == 1,),
                  lambda: (lambda B, T, d_model, h: 1 / (T - 1) > 0,)],
         secret=["T == 1 or h == 1", "h == 1 or T == 1"]),
]
