"""Contract cases for mha_course.tryit.attention_across_devices (19_attention_across_devices.ipynb)."""

import numpy as np
import torch

from mha.parallel import ring as parallel
from mha_course.tryit import attention_across_devices as tryit
from tests.self_checks import Case

SIZES = (1, 8, 4096, 4, 64, 4)  # B, h, T, W, d_k, itemsize: the lesson's ring, float32


def by_hand(B, h, T, W, d_k, itemsize):
    """W - 1 sending steps, K and V each (B, h, T / W, d_k), itemsize bytes a number."""
    return (W - 1) * 2 * B * h * (T // W) * d_k * itemsize


def times(f):
    """A student's function: the right bytes, changed by f(bytes, B, h, T, W, d_k, itemsize)."""
    return lambda B, h, T, W, d_k, itemsize: f(by_hand(B, h, T, W, d_k, itemsize), B, h, T, W, d_k,
                                               itemsize)


def call(fn):
    return lambda: (fn, *SIZES)


CASES = [
    Case(tryit.check_ring_bytes,
         right=call(by_hand),
         untried=lambda: (None, *SIZES),
         right_forms=[call(lambda B, h, T, W, d_k, itemsize: (W - 1) * 2 * B * h * T / W * d_k * itemsize),
                      call(lambda *a: np.int64(by_hand(*a))),
                      call(lambda *a: torch.tensor(by_hand(*a))),
                      call(lambda *a: np.array(by_hand(*a)).tolist()),  # .tolist() of a 0-d array
                      call(lambda *a: np.array([by_hand(*a)])),  # a one-element array
                      call(lambda B, h, T, W, d_k, itemsize: 2 * (W - 1) / W * B * h * T * d_k * itemsize)],
         wrong={
             # the findings
             "causal mask": call(times(lambda n, *a: n // 2)),  # named, with K alone (the same always)
             "Ulysses formula": call(times(lambda n, B, h, T, W, d_k, i: 2 * n // W)),
             "summed over the W ranks": call(times(lambda n, B, h, T, W, d_k, i: W * n)),
             "does not use itemsize. That fits two slips that cancel at the lesson sizes: K alone": call(
                 # forgot V and counted float64: they cancel at float32, not at itemsize = 2
                 lambda B, h, T, W, d_k, itemsize: (W - 1) * B * h * (T // W) * d_k * 8),
             "it does not use h": call(lambda B, h, T, W, d_k, itemsize: by_hand(B, 8, T, W, d_k, itemsize)),
             "W steps counted (the last block is not sent on), and K alone": call(
                 lambda B, h, T, W, d_k, itemsize: W * B * h * (T // W) * d_k * itemsize),
             "used the package's own mha.parallel.ring.ring_bytes_per_step": call(
                 lambda B, h, T, W, d_k, itemsize: (W - 1) * parallel.ring_bytes_per_step(
                     B, h, T, W, d_k, itemsize) - (W - 1) * (T // W) * 8),
             "pass the function": lambda: (12_582_912.0, *SIZES),  # right, but a number hides slips
             # the listed slips, as functions
             "one step": call(times(lambda n, B, h, T, W, d_k, i: n // (W - 1))),
             "W steps": call(times(lambda n, B, h, T, W, d_k, i: n // (W - 1) * W)),
             "numbers, not bytes": call(times(lambda n, B, h, T, W, d_k, i: n // i)),
             "receives": call(times(lambda n, *a: 2 * n)),
             "queries stay put": call(times(lambda n, *a: 3 * n // 2)),
             "positions": call(times(lambda n, B, h, T, W, d_k, i: n + (W - 1) * (T // W) * 8)),
             "bits": call(times(lambda n, *a: 8 * n)),
             "MiB": call(times(lambda n, *a: n // 2**20)),
             "does not use W": call(lambda B, h, T, W, d_k, itemsize: 3 * 2 * B * h * (T // 4) * d_k * itemsize),
             "does not use B": call(lambda B, h, T, W, d_k, itemsize: by_hand(1, h, T, W, d_k, itemsize)),
             "raised ZeroDivisionError": call(lambda *a: 1 / 0),
             # our own, in no table: named by how the bytes follow the sizes
             "same factor at every size": call(times(lambda n, *a: 3 * n)),
             "how your formula uses W": call(times(lambda n, B, h, T, W, d_k, i: n // W)),
             "uses T and W and d_k": call(lambda B, h, T, W, d_k, itemsize:
                                          (W - 1) * 2 * B * h * (T // W) ** 2 * itemsize),
             "the same at every size": call(times(lambda n, *a: n + 1)),
             "not when only h changes": call(lambda B, h, T, W, d_k, itemsize: by_hand(B, 8, T, W, d_k, itemsize)
                                             + (h - 8)),
             # and a number alone, told its slips and to pass the function
             "tell which": lambda: (6_291_456, *SIZES),
         },
         garbage=[lambda: ("about 12 mebibytes", *SIZES), lambda: ([1000, 1], *SIZES),
                  lambda: (1000.5, *SIZES), call(lambda *a: "lots"), call(lambda *a: [1, 2])],
         secret=["12,582,912", "12582912", "12 MiB", "(w - 1) * 2", "2 * b * h"]),
]
