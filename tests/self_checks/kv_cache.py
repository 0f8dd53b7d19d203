"""Contract cases for mha.tryit.kv_cache (13_kv_cache.ipynb)."""

from mha.tryit import kv_cache as tryit
from tests.self_checks import Case

CASES = [
    Case(tryit.check_cache_bytes,
         right=lambda: (4_194_304,),  # 2 * 1 * 8 * 1024 * 64 * 4, worked by hand
         wrong={"K alone": lambda: (2_097_152,),
                "numbers, not bytes": lambda: (1_048_576,),
                "8 bytes per number": lambda: (8_388_608,),
                "MiB": lambda: (4,),
                "heads": lambda: (524_288,),
                "bits": lambda: (33_554_432,),  # 4,194,304 * 8
                "one position": lambda: (4_096,),  # 2 * 8 * 64 * 4, also the answer in KiB
                "leaves out d_k": lambda: (65_536,),  # 2 * 8 * 1024 * 4
                "times the size": lambda: (1000,)},
         garbage=[lambda: ("4 MiB",), lambda: ([4194304, 1],), lambda: (4194304.5,)]),
]
