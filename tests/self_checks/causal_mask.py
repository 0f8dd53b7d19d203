"""Contract cases for mha.tryit.causal_mask (05_causal_mask.ipynb)."""

import numpy as np

from mha.tryit import causal_mask as tryit
from tests.self_checks import Case

T = 6


def band(lo: int, hi: int, n: int = T) -> np.ndarray:
    """(n, n) boolean, True where t + lo <= s <= t + hi: built with loops, not with the package."""
    return np.array([[lo <= s - t <= hi for s in range(n)] for t in range(n)])


WINDOW = band(-2, 0)  # keys t-2, t-1, t
STAIR = band(-T, 0)  # the plain causal mask

CASES = [
    Case(tryit.check_window,
         right=lambda: (WINDOW,),
         wrong={"plain causal mask": lambda: (STAIR,),
                "2 keys (t - 1 and t)": lambda: (band(-1, 0),),
                "4 keys (t - 3 .. t)": lambda: (band(-3, 0),),
                "the sign of k": lambda: (np.zeros((T, T), dtype=bool),),
                "transposed": lambda: (band(0, 2),),
                "matrix of ones keeps all future keys": lambda: (band(-2, T),),
                "np.tril where np.triu is needed": lambda: (band(-T, -2),),
                "diagonal is missing": lambda: (band(-2, -1),),
                "as int64 0/1": lambda: (WINDOW.astype(np.int64),),
                "which is in its future": lambda: (WINDOW | np.eye(T, k=1, dtype=bool),),
                "first row that differs": lambda: (band(-2, 0) & (np.arange(T)[:, None] != 4),)},
         garbage=[lambda: ("np.triu(mask, k=-2)",), lambda: ([[True, False], [True]],),
                  lambda: (np.ones((5, 5), dtype=bool),), lambda: (WINDOW.astype(float) * 0.5,),
                  lambda: (WINDOW[None],)]),
]
