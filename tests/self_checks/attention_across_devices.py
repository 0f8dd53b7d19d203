"""Contract cases for mha.tryit.attention_across_devices (18_attention_across_devices.ipynb)."""

from mha.tryit import attention_across_devices as tryit
from tests.self_checks import Case

CASES = [
    Case(tryit.check_ring_bytes,
         right=lambda: (12_582_912,),  # 3 steps * 2 (K, V) * 1 * 8 * 1024 * 64 * 4, by hand
         wrong={"one step": lambda: (4_194_304,),  # 2 * 8 * 1024 * 64 * 4
                "W steps": lambda: (16_777_216,),  # 4 * 4,194,304
                "K alone": lambda: (6_291_456,),  # 3 * 8 * 1024 * 64 * 4
                "numbers, not bytes": lambda: (3_145_728,),  # 3 * 2 * 8 * 1024 * 64
                "float64": lambda: (25_165_824,),  # 12,582,912 * 2
                "forgot /W": lambda: (50_331_648,),  # 3 * 2 * 8 * 4096 * 64 * 4
                "positions": lambda: (12_607_488,),  # + 3 * 1024 * 8
                "bits": lambda: (100_663_296,),  # 12,582,912 * 8
                "times the size": lambda: (1000,)},
         garbage=[lambda: ("12 MiB",), lambda: ([12_582_912, 1],), lambda: (12_582_912.5,)]),
]
