"""Contract cases for mha.tryit.sdpa_backends (11_sdpa_backends.ipynb)."""

from mha.tryit import sdpa_backends as tryit
from tests.self_checks import Case

GIB = 1 * 32 * 8192 * 8192 * 2 / 2**30  # B * h * T * T numbers, 2 bytes each (bfloat16): 4.0

CASES = [
    Case(tryit.check_score_gib,
         right=lambda: (GIB,),
         wrong={"float32": lambda: (8,),
                "GB (10**9 bytes)": lambda: (4.29,),
                "that is bytes": lambda: (2**32,),
                "MiB": lambda: (4096,),
                "one head": lambda: (0.125,),
                "bits": lambda: (32,),
                "numbers, not bytes": lambda: (2,),
                "times the size": lambda: (1.5,)},
         garbage=[lambda: ("4 GiB",), lambda: ([4, 4],), lambda: (float("inf"),),
                  lambda: (True,)]),
    Case(tryit.check_dropout_kernel,
         right=lambda: ("math", "math"),  # the CPU flash kernel refuses dropout_p > 0
         wrong={"refuses dropout": lambda: ("flash", "math"),
                "CUDA kernel": lambda: ("efficient", "math"),
                "dispatcher": lambda: ("default", "math"),
                "not one of SDPA's kernels": lambda: ("maths", "math"),
                "accepts dropout": lambda: ("math", "flash")},
         untried=lambda: (None, "math"),
         garbage=[lambda: (1, "math"), lambda: (["math"], "math"), lambda: ("math", 0)]),
]
