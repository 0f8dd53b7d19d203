"""Contract cases for mha_course.tryit.kv_cache (13_kv_cache.ipynb)."""

import numpy as np
import torch

from mha.inference import kv_cache
from mha.inference.kv_cache import KVCache
from mha_course.tryit import kv_cache as tryit
from tests.self_checks import Case

RIGHT = 4_194_304  # 2 * 1 * 8 * 1024 * 64 * 4, worked by hand
SECRET = ["4,194,304", "4194304", "4 MiB", "4.0 MiB"]


def placeholder(B, h, max_len, d_k, itemsize):  # as the lesson ships it
    return None


def formula(body):
    """A student's my_cache_bytes(B, h, max_len, d_k, itemsize) with `body` as its return value."""
    def my_cache_bytes(B, h, max_len, d_k, itemsize):
        return body(B, h, max_len, d_k, itemsize)
    return my_cache_bytes


DTYPES = {1: np.int8, 2: np.float16, 4: np.float32, 8: np.float64}

CASES = [
    Case(tryit.check_cache_bytes,
         right=lambda: (RIGHT,),
         right_forms=[lambda: (4194304.0,), lambda: (np.int64(RIGHT),), lambda: (torch.tensor(RIGHT),),
                      lambda: (4 * 2**20,), lambda: (formula(lambda B, h, n, d, i: 2 * B * h * n * d * i),)],
         wrong={  # one number that fits several slips names them all (issue 27: float16 was told "K alone")
                "counts max_len - 1 where max_len = 1024": lambda: (2 * 8 * 1023 * 64 * 4,),
                "K alone (or V alone): the cache holds both; or that is 2 bytes per number (float16 "
                "or bfloat16); the question is float32; or that halves the cache for the causal mask":
                    lambda: (2_097_152,),
                "numbers, not bytes": lambda: (1_048_576,),
                "MiB": lambda: (4,),
                "heads": lambda: (524_288,),
                "bits: the answer is wanted in bytes (8 bits each); or that uses d_model = h * d_k":
                    lambda: (33_554_432,),  # 4,194,304 * 8 = 2 * 8 * 1024 * 512 * 4
                "KiB: the answer is wanted in bytes; or that is the cache of one position":
                    lambda: (4_096,),  # 2 * 8 * 64 * 4, also the answer in KiB
                "leaves out d_k": lambda: (65_536,),  # 2 * 8 * 1024 * 4
                # not in the old table
                "caches the queries too": lambda: (6_291_456,),
                "32 layers": lambda: (134_217_728,),
                "MB (millions": lambda: (4.194304,),
                "off by 1": lambda: (4_194_305,),
                "no clean factor": lambda: (1000,),
                "two slips together: K alone (V forgotten), and bits": lambda: (16_777_216,),
                "exactly 3 times": lambda: (3 * 4_194_304,),
                "whole number": lambda: (4194304.5,),
                "close but not exact": lambda: (4_000_000,),  # 4 MiB read as 4 * 10**6
                "factor 2 for K and V twice": lambda: (8_388_608,),
                "GB (billions": lambda: (0.004194304,),
                "positive number of bytes": lambda: (-4_194_304,)},  # not 'the wrong sign': that shows it
         garbage=[lambda: ("four MiB",), lambda: ([4194304, 1],), lambda: (True,)],
         secret=SECRET),
    Case(tryit.check_cache_formula,
         right=lambda: (formula(lambda B, h, n, d, i: 2 * B * h * n * d * i),),
         right_forms=[lambda: (formula(lambda B, h, n, d, i: 2.0 * B * h * n * d * i),),
                      lambda: (formula(lambda B, h, n, d, i: np.prod([2, B, h, n, d, i])),),
                      lambda: (formula(lambda B, h, n, d, i: np.zeros((2, B, h, n, d),
                                                                      dtype=DTYPES[i]).nbytes),),
                      lambda: (lambda B, h, max_len, d_k, itemsize: 2 * B * h * max_len * d_k * itemsize,)],
         untried=lambda: (placeholder,),
         wrong={"itemsize doubles": lambda: (formula(lambda B, h, n, d, i: B * h * n * d * 8),),  # no V, float64
                "counts max_len - 1": lambda: (formula(lambda B, h, n, d, i: 2 * B * h * (n - 1) * d * i),),
                "K alone (or V alone): the cache holds both; or it halves the cache for the causal":
                    lambda: (formula(lambda B, h, n, d, i: B * h * n * d * i),),
                "B doubles": lambda: (formula(lambda B, h, n, d, i: 2 * h * n * d * i),),
                "counted twice (squared)": lambda: (formula(lambda B, h, n, d, i: 2 * B * h * h * n * d * i),),
                "counts bits": lambda: (formula(lambda B, h, n, d, i: 16 * B * h * n * d * i),),
                "gives MiB": lambda: (formula(lambda B, h, n, d, i: 2 * B * h * n * d * i / 2**20),),
                "caches the queries": lambda: (formula(lambda B, h, n, d, i: 3 * B * h * n * d * i),),
                "off by the same +1": lambda: (formula(lambda B, h, n, d, i: 2 * B * h * n * d * i + 1),),
                "same number whatever": lambda: (formula(lambda B, h, n, d, i: RIGHT),),
                "used the package's own": lambda: (formula(
                    lambda B, h, n, d, i: KVCache(B, h, n, d, DTYPES[i]).nbytes),),  # issue 27
                "decode_step_cost": lambda: (formula(
                    lambda B, h, n, d, i: kv_cache.decode_step_cost(B, h, n, d, i).bytes),),
                "five arguments": lambda: (lambda B, h, max_len, d_k: 2 * B * h * max_len * d_k * 4,),
                "raised ZeroDivisionError": lambda: (formula(lambda B, h, n, d, i: B / 0),),
                "no clean factor": lambda: (formula(lambda B, h, n, d, i: 3 * B * h * n * d * i / 7),),
                "gives 0 bytes at B = 3": lambda: (formula(lambda B, h, n, d, i: 2 * B * h * n * d * i // 2**20),),
                "max_len doubles": lambda: (formula(lambda B, h, n, d, i: 2 * B * h * 1024 * d * i),)},
         garbage=[lambda: (RIGHT,), lambda: ("2 * B * h * max_len * d_k * itemsize",),
                  lambda: (formula(lambda B, h, n, d, i: "four MiB"),)],
         secret=SECRET),
]
