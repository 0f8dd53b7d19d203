"""Contract cases for mha.tryit.split_heads (03_split_heads.ipynb)."""

from mha.tryit import split_heads as tryit
from tests.self_checks import Case


def right_rule(B, T, d_model, h):
    """Worked out by hand: the skipped transpose swaps h and T, a no-op if either is 1."""
    return T == 1 or h == 1


CASES = [
    Case(tryit.check_harmless_rule,
         right=lambda: (right_rule,),
         wrong={"always harmless": lambda: (lambda B, T, d_model, h: True,),
                "always matters": lambda: (lambda B, T, d_model, h: False,),
                "shapes with one head": lambda: (lambda B, T, d_model, h: h == 1,),
                "shapes with one token": lambda: (lambda B, T, d_model, h: T == 1,),
                "and instead of or": lambda: (lambda B, T, d_model, h: T == 1 and h == 1,),
                "depends on B": lambda: (lambda B, T, d_model, h: B == 1,),
                "depends on d_k": lambda: (lambda B, T, d_model, h: d_model // h == 1,),
                "equal length": lambda: (lambda B, T, d_model, h: T == h,),
                "what do the shapes": lambda: (lambda B, T, d_model, h: T * h < 4,)},
         garbage=[lambda: ("T == 1 or h == 1",), lambda: (True,),
                  lambda: (lambda B, T, d_model, h: None,),
                  lambda: (lambda B, T, d_model, h: 1 if T == 1 else 0,),
                  lambda: (lambda B, T: T == 1,),
                  lambda: (lambda B, T, d_model, h: 1 / (T - 1) > 0,)]),
]
