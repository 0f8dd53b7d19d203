"""Contract cases for mha_course.tryit.sdpa_backends (11_sdpa_backends.ipynb)."""

import numpy as np
import torch
from torch.nn.attention import SDPBackend

from mha_course.tryit import sdpa_backends as tryit
from tests.self_checks import Case

GIB = 1 * 32 * 8192 * 8192 * 2 / 2**30  # B * h * T * T numbers, 2 bytes each (bfloat16): 4.0

CASES = [
    Case(tryit.check_score_gib,
         right=lambda: (GIB,),
         right_forms=[lambda: (4,), lambda: (np.float32(4.0),), lambda: (torch.tensor(4.0),),
                      lambda: (np.array([4.0]),), lambda: (4.02,), lambda: (2**32 / 2**30,)],
         wrong={"the size of Q, K or V for a head width of 64": lambda: (1 * 32 * 8192 * 64 * 2 / 2**30,),
                "float32); bfloat16 takes 2; or that counts two matrices": lambda: (8,),
                "GB (10**9 bytes)": lambda: (4.29,),
                "that is bytes": lambda: (2**32,),
                "MiB": lambda: (4096,),
                "KiB": lambda: (4 * 2**20,),
                "one head": lambda: (0.125,),
                "bits": lambda: (32,),
                "not bytes: each bfloat16 number takes 2 bytes; or that counts only the causal half":
                    lambda: (2,),
                "T = 8000": lambda: (3.81,),
                "must be positive": lambda: (-4,),
                # invented, not in the table: each named through the ratio to the right size
                "4 bytes a number (float32) together with GB (10**9 bytes), not GiB":
                    lambda: (8.59,),
                "the heads counted twice": lambda: (128,),
                "8 bytes a number (float64) together with one head only": lambda: (0.5,),
                "one head only together with only the causal half": lambda: (1 / 16,),
                "one-byte mask": lambda: (6,),
                "a float32 copy": lambda: (12,),
                "between 1 and 2 times": lambda: (4.5,),
                "between 1/2 and 1 times the right value, a ratio none": lambda: (3,),
                "far too big for GiB": lambda: (4e9,),
                "over only the causal half": lambda: (1.0,),
                "TiB": lambda: (4 / 1024,)},
         garbage=[lambda: ("4 GiB",), lambda: ([4, 4],), lambda: (float("inf"),),
                  lambda: (True,)],
         secret=["4294967296", "4,294,967,296", "2,147,483,648", "2147483648", "= 4 GiB",
                 "4.0 GiB"]),
    Case(tryit.check_dropout_kernel,
         right=lambda: ("math", "math"),  # the CPU flash kernel refuses dropout_p > 0
         right_forms=[lambda: ("Math", "math"), lambda: (" math ", "math"),
                      lambda: ("maths", "math"), lambda: ("math path", "math"),
                      lambda: (SDPBackend.MATH, "math"), lambda: ("SDPBackend.MATH", "math"),
                      lambda: ("aten::_scaled_dot_product_attention_math", "math"),
                      lambda: ("math", None), lambda: ("mathh", "math"),
                      lambda: ("flash", "flash"), lambda: ("math, since flash refuses dropout", "math"),
                      lambda: ("the math one", "math"),
                      lambda: (SDPBackend.FLASH_ATTENTION, "flash")],
         wrong={"refuses dropout": lambda: ("flash", "math"),
                "CUDA kernel": lambda: ("efficient", "math"),
                "dispatcher": lambda: ("default", "math"),
                "not one of SDPA's kernels": lambda: ("fast", "math"),
                "accepts dropout": lambda: ("math", "flash"),
                # invented, not in the table
                "does not fail": lambda: ("error", "math"),
                "more than one kernel": lambda: ("flash or math", "math"),
                "names a device": lambda: ("cpu", "math"),
                "outside SDPA": lambda: ("eager", "math"),
                "FlexAttention": lambda: ("flex_attention", "math"),
                "cudnn is a CUDA kernel": lambda: (SDPBackend.CUDNN_ATTENTION, "math")},
         untried=lambda: (None, "math"),
         garbage=[lambda: (1, "math"), lambda: (["math"], "math"), lambda: ("math", 0)]),
]
