"""Contract cases for mha_course.tryit.padding_masks (14_padding_masks.ipynb): my_decoder_mask(lengths, T)."""

import numpy as np
import torch

from mha import steps
from mha.attention import masks
from mha_course.tryit import padding_masks as tryit
from tests.self_checks import Case

LENGTHS, T = [5, 3, 1], 5


def by_hand(lengths, T):
    """The right mask, one entry at a time: query t < L_b may see key s <= t (so s < L_b too)."""
    m = np.zeros((len(lengths), 1, T, T), dtype=bool)
    for b, n in enumerate(lengths):
        for t in range(n):
            for s in range(t + 1):
                m[b, 0, t, s] = True
    return m


def stub(lengths, T):
    """The notebook's placeholder: the body not written yet."""
    return None


def pieces(lengths, T):
    """real (B, T), real with <= (B, T), the lower triangle (T, S), keys (B,1,1,S), rows (B,1,T,1)."""
    pos = np.arange(T)
    lens = np.asarray(lengths)[:, None]  # (B, 1)
    real, le = pos[None, :] < lens, pos[None, :] <= lens
    return real, le, pos[None, :] <= pos[:, None], real[:, None, None, :], real[:, None, :, None]


def built(make):
    """A student's function from an expression of the pieces."""
    return lambda lengths, T: make(*pieces(lengths, T))


def left_padded(lengths, T):
    """The right mask for a batch padded on the left: pads first, real tokens last."""
    pos = np.arange(T)
    real = pos[None, :] >= T - np.asarray(lengths)[:, None]  # (B, T)
    tri = pos[None, :] <= pos[:, None]  # (T, S)
    return real[:, None, None, :] & real[:, None, :, None] & tri


def one_flipped(lengths, T):
    """The right mask with one real key hidden: a mistake no table lists."""
    m = by_hand(lengths, T)
    m[1, 0, min(2, lengths[1] - 1), 0] = False
    return m


def the_future_too(lengths, T):
    """Each real query also sees the next key (the triangle one diagonal too high)."""
    real, _, _, keys, rows = pieces(lengths, T)
    return keys & rows & (np.arange(T)[None, :] <= np.arange(T)[:, None] + 1)


def no_diagonal(lengths, T):
    """s < t instead of s <= t: nobody sees itself."""
    real, _, _, keys, rows = pieces(lengths, T)
    return keys & rows & (np.arange(T)[None, :] < np.arange(T)[:, None])


try_lengths = np.array(LENGTHS)

CASES = [
    Case(tryit.check_decoder_mask,
         right=lambda: (by_hand,),
         untried=lambda: (stub,),
         right_forms=[lambda: (lambda lengths, T: torch.from_numpy(by_hand(lengths, T)),),
                      lambda: (lambda lengths, T: np.where(by_hand(lengths, T), 0.0, -np.inf),),
                      lambda: (lambda lengths, T: by_hand(lengths, T).tolist(),),
                      lambda: (built(lambda real, le, tri, keys, rows: rows & tri),),  # key term redundant
                      lambda: (lambda lengths, T: pieces(lengths, T)[3] & pieces(lengths, T)[4]
                               & steps.causal_mask(T),)],  # steps may give the triangle
         wrong={"query term is missing": lambda: (built(lambda real, le, tri, keys, rows: keys & tri),),
                "that is left padding": lambda: (left_padded,),
                "it is inverted, True where attention is blocked":  # and no causal triangle
                    lambda: (built(lambda real, le, tri, keys, rows: ~(keys & rows)),),
                "off by one:": lambda: (built(lambda real, le, tri, keys, rows:
                                              le[:, None, None, :] & le[:, None, :, None] & tri),),
                "off by one on the query term": lambda: (built(lambda real, le, tri, keys, rows:
                                                               keys & le[:, None, :, None] & tri),),
                "off by one the other way": lambda: (lambda lengths, T: by_hand([n - 1 for n in lengths], T),),
                "(B, T, S)": lambda: (built(lambda real, le, tri, keys, rows:
                                            real[:, None, :] & real[:, :, None] & tri),),
                "causal triangle is missing": lambda: (built(lambda real, le, tri, keys, rows: keys & rows),),
                "upper one": lambda: (built(lambda real, le, tri, keys, rows: keys & rows & tri.T),),
                "key_padding_mask": lambda: (lambda lengths, T: ~by_hand(lengths, T),),
                "mask == 0 gives": lambda: (lambda lengths, T: (~by_hand(lengths, T)).astype(np.int64),),
                "True on padded keys": lambda: (built(lambda real, le, tri, keys, rows: ~keys & tri),),
                "key term is inverted": lambda: (built(lambda real, le, tri, keys, rows: ~keys & rows & tri),),
                "one position too many": lambda: (lambda lengths, T: by_hand(lengths, T + 1),),
                "integers": lambda: (lambda lengths, T: by_hand(lengths, T).astype(int),),
                "floats": lambda: (lambda lengths, T: by_hand(lengths, T).astype(np.float32),),
                "0 and -inf swapped": lambda: (lambda lengths, T: np.where(by_hand(lengths, T), -np.inf, 0.0),),
                "finite fill": lambda: (lambda lengths, T: np.where(by_hand(lengths, T), 0.0, -1e9),),
                "no padding": lambda: (lambda lengths, T: np.broadcast_to(pieces(lengths, T)[2],
                                                                          (len(lengths), 1, T, T)),),
                "only the key term": lambda: (lambda lengths, T: np.broadcast_to(
                    pieces(lengths, T)[3], (len(lengths), 1, T, T)),),
                "(B, 1, 1, S)": lambda: (built(lambda real, le, tri, keys, rows: keys),),
                # the finding: the package's builder must not pass as the student's work
                "answer key": lambda: (lambda lengths, T: masks.padding_mask(lengths, T, causal=True),),
                "the package's own mha.attention.masks": lambda: (masks.padding_mask,),
                "wants the function": lambda: (by_hand(LENGTHS, T),),  # an array, not a function
                "same mask": lambda: (lambda lengths, T: by_hand(try_lengths, 5),),  # the notebook's batch
                "longest length": lambda: (lambda lengths, T: by_hand(lengths, int(max(lengths))),),
                "raised IndexError": lambda: (lambda lengths, T: by_hand(lengths, T)[:, :, :, T],),
                # unlisted wrong answers: named by relate and by the kinds of pair they get wrong
                "real queries miss real keys": lambda: (one_flipped,),
                "diagonal": lambda: (no_diagonal,),
                "see later keys": lambda: (the_future_too,)},
         garbage=[lambda: ("seven",), lambda: ([[True], [True, False]],),
                  lambda: (np.ones((2, 2), dtype=bool),), lambda: (np.full((3, 1, T, T), "x"),),
                  lambda: (lambda lengths, T: "seven",), lambda: (lambda lengths, T: np.ones((2, 2)),),
                  lambda: (lambda lengths, T: np.full((len(lengths), 1, T, T), 0.5),),
                  lambda: (lambda lengths: lengths,)],
         secret=["real[:, None", "[:, None, :, None]", "pos[None, :] <", "< lengths[:, None]"]),
]
