"""Contract cases for mha.tryit.merge_and_output (08_merge_and_output.ipynb)."""

from mha.tryit import merge_and_output as tryit
from tests.self_checks import Case

T = 6
# By hand at T = 6: row t forbids the keys t+1..5, so 5 + 4 + 3 + 2 + 1 + 0 = 15 of 36 are 0;
# row 0 has one allowed key (weight 1 at any temperature); a d_k = 1 head favours 2 keys.
ZEROS, ROW, KEYS = 15, 0, 2

CASES = [
    Case(tryit.check_zeros_per_head,
         right=lambda: (ZEROS,),
         wrong={"diagonal counted in": lambda: (21,),
                "every weight of a head": lambda: (36,),
                "one zero per row": lambda: (6,),
                "with the mask off": lambda: (0,),
                "both triangles": lambda: (30,),
                "counts all 4 heads": lambda: (60,),
                "s = t + 1, is forbidden too": lambda: (10,),
                "row by row": lambda: (14,)},
         garbage=[lambda: ("15",), lambda: (15.5,), lambda: ([15],), lambda: (True,),
                  lambda: (-3,), lambda: (100,)]),
    Case(tryit.check_unchanged_row,
         right=lambda: (ROW,),
         wrong={"is the last row": lambda: (T - 1,),
                "numbered from 0": lambda: (1,),
                "there is no row": lambda: (T,),
                "only one key it may attend to": lambda: (3,)},
         garbage=[lambda: ("row 0",), lambda: (0.5,), lambda: ([0],), lambda: (False,)]),
    Case(tryit.check_favoured_keys,
         right=lambda: (KEYS,),
         wrong={"same sign": lambda: (1,),
                "one key per row": lambda: (T,),
                "number of heads": lambda: (16,),
                "at least 1": lambda: (0,),
                "which key wins a row": lambda: (3,)},
         garbage=[lambda: ("two",), lambda: (2.5,), lambda: ([2, 2],), lambda: (float("inf"),)]),
]
