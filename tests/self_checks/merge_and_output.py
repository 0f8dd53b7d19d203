"""Contract cases for mha_course.tryit.merge_and_output (08_merge_and_output.ipynb)."""

import numpy as np
import torch

from mha_course.tryit import merge_and_output as tryit
from tests.self_checks import Case

T = 6
# By hand at T = 6: row t forbids the keys t+1..5, so 5 + 4 + 3 + 2 + 1 + 0 = 15 of 36 are 0;
# row 0 has one allowed key (weight 1 at any temperature); a d_k = 1 head favours 2 keys.
ZEROS, ROW, KEYS = 15, 0, 2

CASES = [
    Case(tryit.check_zeros_per_head,
         right=lambda: (ZEROS,),
         right_forms=[lambda: (15.0,), lambda: (np.int64(15),), lambda: (torch.tensor(15),),
                      lambda: (np.array([15, 15, 15, 15]),),  # one count per head, all the same
                      lambda: (np.array([[15]]),)],
         wrong={"diagonal counted in": lambda: (21,),
                "count for a sequence of 8 tokens": lambda: (28,),
                "every weight of a head": lambda: (36,),
                "one zero per row": lambda: (6,),
                "with the mask off": lambda: (0,),
                "both triangles": lambda: (30,),
                "counts all 4 heads": lambda: (60,),
                "s = t + 1, is forbidden too": lambda: (10,),
                "is too few": lambda: (14,),
                # not in the old table
                "in all 4 heads: the question is the zeros of one head": lambda: (84,),
                "row 0 only": lambda: (5,),
                "is too many": lambda: (17,),
                "did you count several heads": lambda: (32,),
                "holds 4 different numbers": lambda: ([15, 15, 14, 15],)},
         garbage=[lambda: ("15",), lambda: (15.5,), lambda: ([15, 14],), lambda: (True,),
                  lambda: (-3,), lambda: (100,), lambda: ([],)],
         secret=["T(T - 1)/2", "15 of the"]),
    Case(tryit.check_unchanged_row,
         right=lambda: (ROW,),
         right_forms=[lambda: (0.0,), lambda: (np.array([0]),), lambda: (-T,),  # -6 is row 0
                      lambda: (torch.tensor(0),)],
         wrong={"is the last row": lambda: (T - 1,),
                "numbered from 0": lambda: (1,),
                "there is no row": lambda: (T,),
                "only one key it may attend to": lambda: (3,),
                # not in the old table
                "-1 counts from the end": lambda: (-1,),
                "keys 0..2, 3 of them": lambda: (2,),
                "there is no row -7": lambda: (-7,)},
         garbage=[lambda: ("row 0",), lambda: (0.5,), lambda: ([0, 5],), lambda: (False,)],
         secret=["query 0 may attend only"]),
    Case(tryit.check_favoured_keys,
         right=lambda: (KEYS,),
         right_forms=[lambda: (2.0,), lambda: (np.int64(2),), lambda: (torch.tensor(2),)],
         wrong={"same sign": lambda: (1,),
                "one key per row": lambda: (T,),
                "number of heads": lambda: (16,),
                "at least 1": lambda: (0,),
                "which key wins a row": lambda: (3,),
                # not in the old table
                "rows of all 16 heads": lambda: (96,),
                "cannot favour 7": lambda: (7,),
                "never in the middle": lambda: (4,)},
         garbage=[lambda: ("two",), lambda: (2.5,), lambda: ([2, 3],), lambda: (float("inf"),)],
         secret=["the largest k or the one with the smallest"]),
]
