"""Contract cases for mha.tryit.padding_masks (14_padding_masks.ipynb)."""

import numpy as np

from mha.tryit import padding_masks as tryit
from tests.self_checks import Case

LENGTHS, T = [5, 3, 1], 5


def by_hand() -> np.ndarray:
    """The right mask, one entry at a time: query t < L_b may see key s <= t (so s < L_b too)."""
    m = np.zeros((3, 1, T, T), dtype=bool)
    for b, n in enumerate(LENGTHS):
        for t in range(n):
            for s in range(t + 1):
                m[b, 0, t, s] = True
    return m


def one_flipped() -> np.ndarray:
    """The right mask with one real key hidden: a mistake no message names."""
    m = by_hand()
    m[1, 0, 2, 1] = False
    return m


pos = np.arange(T)
real = pos[None, :] < np.array(LENGTHS)[:, None]  # (B, T)
le = pos[None, :] <= np.array(LENGTHS)[:, None]  # (B, T): the off-by-one comparison
tri = pos[None, :] <= pos[:, None]  # (T, S)
keys, rows = real[:, None, None, :], real[:, None, :, None]

CASES = [
    Case(tryit.check_decoder_mask,
         right=lambda: (by_hand(),),
         wrong={"query term is missing": lambda: (keys & tri,),
                "off by one:": lambda: (le[:, None, None, :] & le[:, None, :, None] & tri,),
                "off by one on the query term": lambda: (keys & le[:, None, :, None] & tri,),
                "(B, T, S)": lambda: (real[:, None, :] & real[:, :, None] & tri,),
                "causal triangle is missing": lambda: (keys & rows,),
                "upper one": lambda: (keys & rows & tri.T,),
                "inverted": lambda: (~by_hand(),),
                "True on padded keys": lambda: (~keys & tri,),
                "integers": lambda: (by_hand().astype(int),),
                "floats": lambda: (by_hand().astype(np.float32),),
                "no padding": lambda: (np.broadcast_to(tri, (3, 1, T, T)),),
                "(B, 1, 1, S)": lambda: (keys,),
                "first difference": lambda: (one_flipped(),)},
         garbage=[lambda: ("seven",), lambda: ([[True], [True, False]],),
                  lambda: (np.ones((2, 2), dtype=bool),), lambda: (np.full((3, 1, T, T), "x"),)]),
]
