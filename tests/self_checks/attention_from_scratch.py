"""Contract cases for mha_course.tryit.attention_from_scratch (01_attention_from_scratch.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import attention_from_scratch as tryit
from tests.self_checks import Case

T = 8


def _mask(keep) -> np.ndarray:
    """A (T, T) boolean mask filled by a loop: True where keep(t, s)."""
    m = np.zeros((T, T), dtype=bool)
    for t in range(T):
        for s in range(T):
            m[t, s] = keep(t, s)
    return m


def _slice_loop() -> np.ndarray:
    """m[t, t-2 : t+1] = True: for t < 2 the slice starts at a negative index and is empty."""
    m = np.zeros((T, T), dtype=bool)
    for t in range(T):
        m[t, t - 2:t + 1] = True
    return m


def _index_loop() -> np.ndarray:
    """m[t, t-2] = m[t, t-1] = m[t, t] = True: negative indices wrap round to the end."""
    m = np.zeros((T, T), dtype=bool)
    for t in range(T):
        m[t, t - 2] = m[t, t - 1] = m[t, t] = True
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
         right_forms=[lambda: (RIGHT_BY_HAND.astype(int),),  # 0/1 numbers
                      lambda: (RIGHT_BY_HAND.astype(np.float32),),
                      lambda: (np.where(RIGHT_BY_HAND, 0.0, -np.inf),),  # additive
                      lambda: (np.where(RIGHT_BY_HAND, 0.0, -1e9),),
                      lambda: (torch.tensor(RIGHT_BY_HAND),),
                      lambda: (RIGHT_BY_HAND.tolist(),),
                      lambda: (np.tri(T, dtype=bool) & ~np.tri(T, k=-3, dtype=bool),)],
         wrong={"plain causal mask": lambda: (_mask(lambda t, s: s <= t),),
                "it is inverted, True where attention is blocked": lambda: (~RIGHT.T,),  # and .T
                "window of 2": lambda: (_mask(lambda t, s: t - 1 <= s <= t),),
                "window of 4": lambda: (_mask(lambda t, s: t - 3 <= s <= t),),
                "transposed": lambda: (RIGHT_BY_HAND.T,),
                "upper triangle (np.triu)": lambda: (_mask(lambda t, s: s >= t),),
                "including the future": lambda: (_mask(lambda t, s: abs(s - t) <= 2),),
                "leaves out the query itself": lambda: (_mask(lambda t, s: t - 3 <= s < t),),
                "diagonal alone": lambda: (np.eye(T, dtype=bool),),
                "no mask at all": lambda: (np.ones((T, T), dtype=bool),),
                "the future alone": lambda: (_mask(lambda t, s: s > t),),
                # the issue: masks in another convention, inverted or with 0 and -inf swapped
                "is inverted": lambda: (~RIGHT_BY_HAND,),
                "inverted: 1 where attention is blocked": lambda: ((~RIGHT_BY_HAND).astype(int),),
                "0 and -inf swapped": lambda: (np.where(RIGHT_BY_HAND, -np.inf, 0.0),),
                # loops whose index t - 2 goes below 0
                "slice is empty": lambda: (_slice_loop(),),
                "wraps round to the end": lambda: (_index_loop(),),
                # unlisted, told by the rules and by relate
                "allows nothing": lambda: (np.zeros((T, T), dtype=bool),),
                "after the query": lambda: (_mask(lambda t, s: abs(s - t) <= 1),),
                "allows 3 entries that should be blocked": lambda: (RIGHT_BY_HAND | np.eye(T, k=-5,
                                                                                      dtype=bool),),
                "blocks 1 entry that should be allowed": lambda: (RIGHT_BY_HAND & ~_mask(
                    lambda t, s: (t, s) == (6, 4)),),
                "wrong shape (1, 8, 8)": lambda: (RIGHT_BY_HAND[None],),
                # the weights or the averaged sequence instead of the mask
                "holds attention weights": lambda: (RIGHT_BY_HAND / RIGHT_BY_HAND.sum(-1,
                                                                                      keepdims=True),),
                "one per token": lambda: (np.array([3, 2, 8 / 3, 2, 10 / 3, 5, 16 / 3, 17 / 3]),)},
         garbage=[lambda: ("seven",), lambda: ([[True, False], [True]],),
                  lambda: (np.ones((7, 7), dtype=bool),), lambda: (np.full((T, T), 0.5),),
                  lambda: (len,)],
         secret=["(s <= t) & (s >= t - 2)", "s >= t - 2", "np.triu(ones, k=-2)"]),
]
