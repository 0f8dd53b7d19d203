"""Contract cases for mha_course.tryit.causal_mask (05_causal_mask.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import causal_mask as tryit
from tests.self_checks import Case

T = 6


def band(lo: int, hi: int, n: int = T) -> np.ndarray:
    """(n, n) boolean, True where t + lo <= s <= t + hi: built with loops, not with the package."""
    return np.array([[lo <= s - t <= hi for s in range(n)] for t in range(n)])


def _slice_loop() -> np.ndarray:
    """m[t, t-2 : t+1] = True: for t < 2 the slice starts at a negative index and is empty."""
    m = np.zeros((T, T), dtype=bool)
    for t in range(T):
        m[t, t - 2:t + 1] = True
    return m


WINDOW = band(-2, 0)  # keys t-2, t-1, t
STAIR = band(-T, 0)  # the plain causal mask
ONE = np.zeros((T, T), dtype=bool)
ONE[4, 2] = True  # one key of the window, query 4 seeing key 2

CASES = [
    Case(tryit.check_window,
         right=lambda: (WINDOW,),
         right_forms=[lambda: (WINDOW.astype(np.int64),),  # 0/1 numbers
                      lambda: (WINDOW.astype(float),),
                      lambda: (np.where(WINDOW, 0.0, -np.inf),),  # additive
                      lambda: (np.where(WINDOW, 0.0, -1e9).astype(np.float32),),
                      lambda: (torch.tensor(WINDOW),),
                      lambda: (WINDOW.tolist(),),
                      lambda: (STAIR & ~band(-T, -3),)],  # the staircase minus the old keys
         wrong={"plain causal mask": lambda: (STAIR,),
                "two slips: it is transposed": lambda: (band(-3, 0).T,),
                "2 keys (t - 1 and t)": lambda: (band(-1, 0),),
                "4 keys (t - 3 .. t)": lambda: (band(-3, 0),),
                "the sign of k": lambda: (np.zeros((T, T), dtype=bool),),
                "transposed": lambda: (band(0, 2),),
                "matrix of ones keeps all future keys": lambda: (band(-2, T),),
                "np.tril keeps a diagonal": lambda: (band(-T, -2),),
                "diagonal is missing": lambda: (band(-2, -1),),
                "reaches both ways": lambda: (band(-2, 2),),
                "causal mask inverted": lambda: (~STAIR,),
                "negative index": lambda: (_slice_loop(),),
                # the issue: masks in another convention, inverted or with 0 and -inf swapped
                "is inverted": lambda: (~WINDOW,),
                "inverted: 1 where attention is blocked": lambda: ((~WINDOW).astype(np.int64),),
                "0 and -inf swapped": lambda: (np.where(WINDOW, -np.inf, 0.0),),
                # unlisted, told by the rules and by relate
                "which is in its future": lambda: (WINDOW | np.eye(T, k=1, dtype=bool),),
                "may see no key at all": lambda: (band(-2, 0) & (np.arange(T)[:, None] != 4),),
                "may not see its own key": lambda: (band(-3, -1),),
                "blocks 1 entry that should be allowed": lambda: (WINDOW & ~ONE,),
                "allows 1 entry that should be blocked": lambda: (WINDOW | np.eye(T, k=-5,
                                                                               dtype=bool),),
                "wrong shape (1, 6, 6)": lambda: (WINDOW[None],),
                "diagonal alone": lambda: (band(0, 0),),
                "holds attention weights": lambda: (WINDOW / WINDOW.sum(-1, keepdims=True),)},
         garbage=[lambda: ("np.triu(steps.causal_mask(T))",), lambda: ([[True, False], [True]],),
                  lambda: (np.ones((5, 5), dtype=bool),), lambda: (WINDOW.astype(float) * 0.5,),
                  lambda: (len,)],
         secret=["k=-2", "k = -2", "triu(steps.causal_mask(T), k"]),
]
