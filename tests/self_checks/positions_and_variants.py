"""Contract cases for mha.tryit.positions_and_variants (16_positions_and_variants.ipynb)."""

import numpy as np

from mha.tryit import positions_and_variants as tryit
from tests.self_checks import Case


def placeholder(n_cached, t_new):
    """The notebook's function as it ships: the body not written yet."""
    return None


def by_hand(n_cached, t_new):
    """The right answer, written from the question: token n_cached + i for query i."""
    return np.array([n_cached + i for i in range(t_new)])


CASES = [
    Case(tryit.check_chunk_positions,
         right=lambda: (by_hand,),
         untried=lambda: (placeholder,),
         wrong={"rotated from 0": lambda: (lambda n, t: np.array([0, 1, 2]),),
                "one too early": lambda: (lambda n, t: np.array([4, 5, 6]),),
                "one too late": lambda: (lambda n, t: np.array([6, 7, 8]),),
                "reversed": lambda: (lambda n, t: np.array([7, 6, 5]),),
                "counted from 1": lambda: (lambda n, t: np.array([1, 2, 3]),),
                "S = n_cached": lambda: (lambda n, t: np.array([2, 3, 4]),),
                "returned floats": lambda: (lambda n, t: np.array([5.0, 6.0, 7.0]),),
                "all 8 positions": lambda: (lambda n, t: np.arange(8),),
                "want t_new = 3": lambda: (lambda n, t: np.array([5, 6]),),
                "same position": lambda: (lambda n, t: np.array([5, 5, 5]),),
                "numbers of this example": lambda: (lambda n, t: np.array([5, 6, 7]),),
                "none of the usual slips": lambda: (lambda n, t: np.array([5, 6, 9]),)},
         garbage=[lambda: ("5, 6, 7",), lambda: (np.array([5, 6, 7]),),
                  lambda: (lambda n, t: "5, 6, 7",), lambda: (lambda n, t: [[5, 6], [7]],),
                  lambda: (lambda n, t: 1 / 0,), lambda: (lambda: np.array([5, 6, 7]),),
                  lambda: (lambda n, t: np.array([[5, 6, 7]]),),
                  lambda: (lambda n, t: np.array([True, False, True]),)]),
]
