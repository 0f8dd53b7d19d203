"""Contract cases for mha_course.tryit.positions_and_variants (16_positions_and_variants.ipynb)."""

import numpy as np
import torch

from mha.modules import compose
from mha_course.tryit import positions_and_variants as tryit
from tests.self_checks import Case


def placeholder(n_cached, t_new):
    """The notebook's function as it ships: the body not written yet."""
    return None


def by_hand(n_cached, t_new):
    """The right answer, written from the question: token n_cached + i for query i."""
    return np.array([n_cached + i for i in range(t_new)])


def through_the_package(n_cached, t_new):
    """Right numbers, but from the package's own position helper: the exercise's rule forbids it."""
    return n_cached + compose.query_positions(None, 1, t_new, None, np.zeros(1))


def hard_coded(n_cached, t_new):
    """The example's numbers, typed in."""
    return np.array([5, 6, 7])


CASES = [
    Case(tryit.check_chunk_positions,
         right=lambda: (by_hand,),
         untried=lambda: (placeholder,),
         right_forms=[lambda: (lambda n, t: np.arange(n, n + t, dtype=np.float64),),  # whole floats
                      lambda: (lambda n, t: list(range(n, n + t)),),
                      lambda: (lambda n, t: range(n, n + t),),
                      lambda: (lambda n, t: tuple(float(n + i) for i in range(t)),),
                      lambda: (lambda n, t: torch.arange(n, n + t),),
                      lambda: (lambda n, t: torch.arange(n, n + t, dtype=torch.float32),),
                      lambda: (lambda n, t: np.arange(n + t)[n:],),
                      lambda: (lambda n, t: (n + i for i in range(t)),),  # a generator
                      lambda: (lambda n, t: np.arange(n, n + t)[None],)],  # one (1, t_new) row
         wrong={"rotated from 0": lambda: (lambda n, t: np.array([0, 1, 2]),),
                "one too early": lambda: (lambda n, t: np.array([4, 5, 6]),),
                "one too late": lambda: (lambda n, t: np.array([6, 7, 8]),),
                "reversed": lambda: (lambda n, t: np.array([7, 6, 5]),),
                "counted from 1": lambda: (lambda n, t: np.array([1, 2, 3]),),
                "S = n_cached": lambda: (lambda n, t: np.array([2, 3, 4]),),
                "starts after the chunk": lambda: (lambda n, t: np.arange(t) + n + t,),
                "not whole numbers": lambda: (lambda n, t: np.array([5.5, 6.5, 7.5]),),
                "all 8 positions": lambda: (lambda n, t: np.arange(8),),
                "want t_new = 3": lambda: (lambda n, t: np.array([5, 6]),),
                "same position": lambda: (lambda n, t: np.array([5, 5, 5]),),
                "numbers of this example": lambda: (hard_coded,),
                "package's own": lambda: (through_the_package,),
                # invented, not in the table: each named through its relation to the right answer
                "step by 2": lambda: (lambda n, t: n + 2 * np.arange(t),),
                "-2 away": lambda: (lambda n, t: n - 2 + np.arange(t),),
                "do not grow by one": lambda: (lambda n, t: np.array([5, 6, 9]),),
                "negative": lambda: (lambda n, t: np.arange(t) - t,),
                "no positions": lambda: (lambda n, t: np.arange(n, t),),
                "one per cached token": lambda: (lambda n, t: np.arange(t, n + t),),
                "chunk_positions(0, 3)": lambda: (lambda n, t: np.arange(n, n + t) if n
                                                  else np.arange(1, t + 1),)},
         garbage=[lambda: ("5, 6, 7",), lambda: (np.array([5, 6, 7]),),
                  lambda: (lambda n, t: "5, 6, 7",), lambda: (lambda n, t: [[5, 6], [7]],),
                  lambda: (lambda n, t: 1 / 0,), lambda: (lambda: np.array([5, 6, 7]),),
                  lambda: (lambda n, t: np.array([[5, 6, 7], [5, 6, 7]]),),
                  lambda: (lambda n, t: np.array([True, False, True]),)],
         secret=["n_cached + np.arange", "np.arange(n_cached", "n_cached + i", "arange(5, 8)"]),
]
