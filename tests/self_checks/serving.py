"""Contract cases for mha_course.tryit.serving (18_serving.ipynb): my_slot and my_blocks."""

import math

import numpy as np
import torch

from mha.inference import paged
from mha_course.tryit import serving as tryit
from tests.self_checks import Case

# The lesson's sequence: block table [6, 3, 4], blocks of 4; token 9 is the second token of its
# third block, physical block 4: worked by hand.
SLOT_SECRET = ["(4, 1)", "[4, 1]", "table[t // block_size]", "t % block_size"]
# The lesson's workload: a 10-token prompt (blocks of 4: 3 blocks, the last holding 2), forked into
# 3 requests that append 3, 6 and 1 tokens: 3 + 2 + 2 + 1 = 8 blocks, worked by hand.
BLOCKS_SECRET = ["8 blocks", "blocks = 8", "is 8 ", "3 + 2 + 2 + 1"]


def slot_rule(body):
    """A student's my_slot(t, table, block_size) returning body(t, table, block_size)."""
    def my_slot(t, table, block_size):
        return body(t, table, block_size)
    return my_slot


def blocks_rule(body):
    """A student's my_blocks(prefix_len, new_tokens, block_size) returning body(...)."""
    def my_blocks(prefix_len, new_tokens, block_size):
        return body(prefix_len, new_tokens, block_size)
    return my_blocks


def by_hand_slot(t, table, block_size):
    block, offset = divmod(t, block_size)
    return table[block], offset


def loop_slot(t, table, block_size):
    """Walk the blocks: another right form."""
    for block in table:
        if t < block_size:
            return block, t
        t -= block_size
    raise IndexError("past the end")


def by_hand_blocks(prefix_len, new_tokens, block_size):
    tail = prefix_len % block_size  # the prompt's tokens in its partly filled last block
    total = math.ceil(prefix_len / block_size)  # the parent's blocks, shared by every fork
    for n in new_tokens:
        total += math.ceil((tail + n) / block_size)  # the copy (if tail) and the blocks after it
    return total


def simulated_blocks(prefix_len, new_tokens, block_size):
    """Another right form: fill slots one token at a time, with copy-on-write."""
    parent = [block_size] * (prefix_len // block_size) + ([prefix_len % block_size]
                                                          if prefix_len % block_size else [])
    used = len(parent)
    for n in new_tokens:
        last = parent[-1] if parent and parent[-1] < block_size else None
        fill = last if last is not None else block_size
        if last is not None:
            used += 1  # the copy of the shared, partly filled block
        for _ in range(n):
            if fill == block_size:
                used += 1
                fill = 0
            fill += 1
    return used


def pool_blocks(prefix_len, new_tokens, block_size):
    """The package's pool doing the counting: right numbers, not the student's work."""
    pool = paged.BlockPool(1, 256, block_size, 1, 1)
    pool.add("parent")
    k = np.zeros((1, 1, prefix_len, 1))  # (B, h_kv, t_new, d_k)
    pool.batch(["parent"])[0].update(k, k, np.arange(prefix_len)[None])
    for i, n in enumerate(new_tokens):
        pool.fork("parent", i)
        k = np.zeros((1, 1, n, 1))
        pool.batch([i])[0].update(k, k, np.arange(prefix_len, prefix_len + n)[None])
    return pool.n_used


def ceil(a, b):
    return -(-a // b)


CASES = [
    Case(tryit.check_token_slot,
         right=lambda: (by_hand_slot,),
         untried=lambda: (slot_rule(lambda t, table, block_size: None),),
         right_forms=[lambda: (loop_slot,),
                      lambda: (slot_rule(lambda t, tb, bs: [tb[t // bs], t % bs]),),
                      lambda: (slot_rule(lambda t, tb, bs: np.array([tb[t // bs], t % bs])),),
                      lambda: (slot_rule(lambda t, tb, bs: torch.tensor([tb[t // bs], t % bs])),),
                      lambda: (slot_rule(lambda t, tb, bs: (float(tb[int(t / bs)]), float(t % bs))),),
                      lambda: (lambda t, table, block_size: by_hand_slot(t, table, block_size),),
                      lambda: (by_hand_slot, [6, 3, 4], 4)],  # the table as a list
         wrong={
             "that is the logical block": lambda: (slot_rule(lambda t, tb, bs: (t // bs, t % bs)),),
             "block and offset are swapped": lambda: (slot_rule(lambda t, tb, bs: (t % bs, tb[t // bs])),),
             "counts the tokens from 1": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[(t - 1) // bs], (t - 1) % bs)),),
             "offset counts from 1": lambda: (slot_rule(lambda t, tb, bs: (tb[t // bs], t % bs + 1)),),
             "one block early": lambda: (slot_rule(lambda t, tb, bs: (tb[t // bs - 1], t % bs)),),
             "worked out from the physical block": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[t // bs], t - tb[t // bs] * bs)),),
             "the offset is the token's position in the sequence": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[t // bs], t)),),
             "divides by the table's length": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[t // len(tb)], t % len(tb))),),
             "rounded up": lambda: (slot_rule(lambda t, tb, bs: (tb[math.ceil(t / bs)], t % bs)),),
             "an index past the end of the table": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[t // bs + 1], t % bs)),),
             "flat number": lambda: (slot_rule(lambda t, tb, bs: tb[t // bs] * bs + t % bs),),
             "answers as if every sequence had its table": lambda: (slot_rule(
                 lambda t, tb, bs: ((6, 3, 4)[t // 4], t % 4)),),
             "both the block and the offset are wrong": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[t // bs] + (t == 5), t % bs + (t == 5))),),
             "your blocks are right for every token": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[t // bs], (t % bs) ^ (t == 6))),),
             "right for the lesson's sequence but not": lambda: (slot_rule(
                 lambda t, tb, bs: (tb[t // bs], t % bs) if bs == 4 else (tb[0], t % bs)),),
             "raised ZeroDivisionError": lambda: (slot_rule(lambda t, tb, bs: t / 0),),
             "pass the function my_slot itself": lambda: ((4, 1),),
             "must take three arguments": lambda: (lambda t, table: (table[t // 4], t % 4),),
         },
         garbage=[lambda: ("block 4",), lambda: (slot_rule(lambda t, tb, bs: "block 4"),),
                  lambda: (slot_rule(lambda t, tb, bs: (1, 2, 3)),),
                  lambda: (slot_rule(lambda t, tb, bs: (1.5, 2)),),
                  lambda: (slot_rule(lambda t, tb, bs: [[1], [2, 3]]),)],
         secret=SLOT_SECRET),
    Case(tryit.check_blocks_needed,
         right=lambda: (by_hand_blocks,),
         untried=lambda: (blocks_rule(lambda p, n, b: None),),
         right_forms=[lambda: (simulated_blocks,),
                      lambda: (blocks_rule(lambda p, n, b: float(by_hand_blocks(p, n, b))),),
                      lambda: (blocks_rule(lambda p, n, b: np.int64(by_hand_blocks(p, n, b))),),
                      lambda: (blocks_rule(lambda p, n, b: torch.tensor(by_hand_blocks(p, n, b))),),
                      lambda: (blocks_rule(lambda p, n, b: int(np.ceil(p / b) + np.ceil(
                          (p % b + np.asarray(n)) / b).sum())),),
                      lambda: (by_hand_blocks, 10, [3, 6, 1], 4)],
         wrong={
             "gives every request its own copy of the prompt: a fork": lambda: (blocks_rule(
                 lambda p, n, b: ceil(p, b) + sum(ceil(p + x, b) for x in n)),),
             "own copy of the prompt and leaves out the parent": lambda: (blocks_rule(
                 lambda p, n, b: sum(ceil(p + x, b) for x in n)),),
             "counts the free slots of the shared, partly filled last block": lambda: (blocks_rule(
                 lambda p, n, b: ceil(p, b) + sum(ceil(max(0, x - (b - p % b) % b), b) for x in n)),),
             "copy as an empty block": lambda: (blocks_rule(
                 lambda p, n, b: ceil(p, b) + sum((p % b > 0) + ceil(x, b) for x in n)),),
             "leaves out the copy": lambda: (blocks_rule(
                 lambda p, n, b: ceil(p, b) + sum(ceil(x, b) for x in n)),),
             "rounded down": lambda: (blocks_rule(lambda p, n, b: p // b + sum((p % b + x) // b for x in n)),),
             "prompt's blocks counted as prefix_len // block_size + 1": lambda: (blocks_rule(
                 lambda p, n, b: p // b + 1 + sum(ceil(p % b + x, b) for x in n)),),
             "floor division + 1": lambda: (blocks_rule(
                 lambda p, n, b: ceil(p, b) + sum((p % b + x) // b + 1 for x in n)),),
             "leaves out the prompt's own blocks": lambda: (blocks_rule(
                 lambda p, n, b: sum(ceil(p % b + x, b) for x in n)),),
             "once per request": lambda: (blocks_rule(
                 lambda p, n, b: len(n) * ceil(p, b) + sum(ceil(p % b + x, b) for x in n)),),
             "drops the parent's partly filled last block": lambda: (blocks_rule(
                 lambda p, n, b: ceil(p, b) - (p % b > 0) + sum(ceil(p % b + x, b) for x in n)),),
             "tokens, not blocks": lambda: (blocks_rule(lambda p, n, b: p + sum(n)),),
             "same number for every workload": lambda: (blocks_rule(lambda p, n, b: 8),),
             "right for the lesson's workload, but not": lambda: (blocks_rule(
                 lambda p, n, b: by_hand_blocks(p, n, b) + (p == 8)),),
             "for the lesson's workload (prefix_len = 10": lambda: (blocks_rule(
                 lambda p, n, b: 3 * by_hand_blocks(p, n, b) + 1),),
             "raised ZeroDivisionError": lambda: (blocks_rule(lambda p, n, b: p / 0),),
             "used the package's own mha.inference.paged": lambda: (pool_blocks,),
             "pass the function my_blocks itself": lambda: (8,),
             "must take three arguments": lambda: (lambda p, n: p + sum(n),),
             "returns None: it must return a number for any workload": lambda: (blocks_rule(
                 lambda p, n, b: by_hand_blocks(p, n, b) if p == 10 else None),),
         },
         garbage=[lambda: ("eight",), lambda: (blocks_rule(lambda p, n, b: "eight"),),
                  lambda: (blocks_rule(lambda p, n, b: [3, 2, 2, 1]),),
                  lambda: (blocks_rule(lambda p, n, b: 7.5),),
                  lambda: (blocks_rule(lambda p, n, b: float("nan")),)],
         secret=BLOCKS_SECRET),
]
