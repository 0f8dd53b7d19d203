"""Contract cases for mha.tryit.generation (17_generation.ipynb)."""

import numpy as np

from mha.tryit import generation as tryit
from tests.self_checks import Case

# lengths 2, 5, 3 left-padded to T = 5, written out by hand
RIGHT = np.array([[-1, -1, -1, 0, 1],
                  [0, 1, 2, 3, 4],
                  [-1, -1, 0, 1, 2]])

CASES = [
    Case(tryit.check_padded_positions,
         right=lambda: (RIGHT.copy(),),
         wrong={"pads are on the right": lambda: (np.array([[0, 1, -1, -1, -1], [0, 1, 2, 3, 4],
                                                            [0, 1, 2, -1, -1]]),),
                "pads are at position 0": lambda: (np.array([[0, 0, 0, 0, 1], [0, 1, 2, 3, 4],
                                                             [0, 0, 0, 1, 2]]),),
                "off by one": lambda: (np.array([[-1, -1, -1, 1, 2], [1, 2, 3, 4, 5],
                                                 [-1, -1, 1, 2, 3]]),),
                "count from the first column": lambda: (np.array([[-1, -1, -1, 3, 4], [0, 1, 2, 3, 4],
                                                                  [-1, -1, 2, 3, 4]]),),
                "every row is 0..T-1": lambda: (np.array([[0, 1, 2, 3, 4]] * 3),),
                "exactly -1": lambda: (np.array([[-3, -2, -1, 0, 1], [0, 1, 2, 3, 4],
                                                 [-2, -1, 0, 1, 2]]),),
                "position 1": lambda: (np.array([[1, 1, 1, 0, 1], [0, 1, 2, 3, 4],
                                                 [1, 1, 0, 1, 2]]),),
                "counted from 1 with pads at 0": lambda: (np.array([[0, 0, 0, 1, 2], [1, 2, 3, 4, 5],
                                                                    [0, 0, 1, 2, 3]]),),
                "counted backwards": lambda: (np.array([[-1, -1, -1, 1, 0], [4, 3, 2, 1, 0],
                                                        [-1, -1, 2, 1, 0]]),),
                "reverse order": lambda: (np.array([[-1, -1, 0, 1, 2], [0, 1, 2, 3, 4],
                                                    [-1, -1, -1, 0, 1]]),),
                "transposed": lambda: (RIGHT.T.copy(),),
                "no usual mistake fits": lambda: (np.array([[-1, -1, -1, 0, 1], [0, 1, 2, 3, 4],
                                                            [-1, -1, 0, 1, 3]]),)},
         garbage=[lambda: ("seven",), lambda: ([[-1, 0], [0, 1, 2]],), lambda: (RIGHT.astype(float),),
                  lambda: (RIGHT >= 0,), lambda: (np.zeros((3, 4), dtype=int),), lambda: (3,)]),
]
