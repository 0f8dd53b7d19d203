"""Contract cases for mha.tryit.attention_from_scratch (01_attention_from_scratch.ipynb)."""

import numpy as np

from mha.tryit import attention_from_scratch as tryit
from tests.self_checks import Case

T = 8


def _mask(keep) -> np.ndarray:
    """A (T, T) boolean mask filled by a loop: True where keep(t, s)."""
    m = np.zeros((T, T), dtype=bool)
    for t in range(T):
        for s in range(T):
            m[t, s] = keep(t, s)
    return m


RIGHT = _mask(lambda t, s: t - 2 <= s <= t)  # keys t-2, t-1, t
RIGHT_BY_HAND = np.array([[1, 0, 0, 0, 0, 0, 0, 0],
                          [1, 1, 0, 0, 0, 0, 0, 0],
                          [1, 1, 1, 0, 0, 0, 0, 0],
                          [0, 1, 1, 1, 0, 0, 0, 0],
                          [0, 0, 1, 1, 1, 0, 0, 0],
                          [0, 0, 0, 1, 1, 1, 0, 0],
                          [0, 0, 0, 0, 1, 1, 1, 0],
                          [0, 0, 0, 0, 0, 1, 1, 1]], dtype=bool)
assert np.array_equal(RIGHT, RIGHT_BY_HAND)

CASES = [
    Case(tryit.check_window_mask,
         right=lambda: (RIGHT_BY_HAND,),
         wrong={"plain causal mask": lambda: (_mask(lambda t, s: s <= t),),
                "window of 2": lambda: (_mask(lambda t, s: t - 1 <= s <= t),),
                "window of 4": lambda: (_mask(lambda t, s: t - 3 <= s <= t),),
                "transposed": lambda: (RIGHT_BY_HAND.T,),
                "upper triangle (np.triu)": lambda: (_mask(lambda t, s: s >= t),),
                "including the future": lambda: (_mask(lambda t, s: abs(s - t) <= 2),),
                "leaves out the query itself": lambda: (_mask(lambda t, s: t - 3 <= s < t),),
                "diagonal alone": lambda: (np.eye(T, dtype=bool),),
                "no mask at all": lambda: (np.ones((T, T), dtype=bool),),
                "holds floats": lambda: (RIGHT_BY_HAND.astype(float),),
                "holds ints": lambda: (RIGHT_BY_HAND.astype(int),),
                "additive float mask": lambda: (np.where(RIGHT_BY_HAND, 0.0, -np.inf),),
                "first wrong row": lambda: (RIGHT_BY_HAND[::-1],)},
         garbage=[lambda: ("seven",), lambda: ([[True, False], [True]],),
                  lambda: (np.ones((7, 7), dtype=bool),), lambda: (RIGHT_BY_HAND[None],),
                  lambda: (np.full((T, T), 0.5),), lambda: (len,)]),
]
