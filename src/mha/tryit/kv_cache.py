"""Self-check for the Try-it of 13_kv_cache.ipynb: the bytes of one layer's KV cache."""

from __future__ import annotations

from typing import Any

from . import as_number, not_tried, not_yet, right

CASE = dict(B=1, h=8, max_len=1024, d_k=64, itemsize=4)  # float32


def check_cache_bytes(answer: Any, B: int = 1, h: int = 8, max_len: int = 1024, d_k: int = 64,
                      itemsize: int = 4) -> str:
    """Say right, or which factor of 2 * B * h * max_len * d_k * itemsize the answer misses."""
    if answer is None:
        return not_tried("write the cache's size in bytes as `answer` (an int)")
    got = as_number(answer, "the cache's size", integer=True)
    numbers = B * h * max_len * d_k  # entries of K alone
    want = 2 * numbers * itemsize
    if got == want:
        return right(f"{want:,} bytes = {want / 2**20:g} MiB: K and V, each {numbers:,} numbers "
                     f"of {itemsize} bytes")
    mistakes: dict[int, str] = {}
    for value, why in (
        (numbers * itemsize, "that is K alone (or V alone): the cache holds both, a factor 2"),
        (2 * numbers, "that counts numbers, not bytes: each float32 number takes 4 bytes"),
        (2 * numbers * 8, "that is 8 bytes per number (float64); float32 takes 4"),
        (want * 8, "that is bits: the answer is wanted in bytes (8 bits each)"),
        (want // 2**20, "that is MiB: the answer is wanted in bytes"),
        (want // 2**10, "that is KiB: the answer is wanted in bytes"),
        (2 * B * h * d_k * itemsize, "that is the cache of one position: multiply by the "
                                     f"max_len = {max_len} positions it has room for"),
        (2 * B * max_len * d_k * itemsize, f"that leaves out the h = {h} heads: every head caches "
                                           "its own keys and values"),
        (2 * B * h * max_len * itemsize, "that leaves out d_k: each cached key and value is a "
                                         "vector of d_k numbers per head"),
    ):  # two mistakes that give the same number share it: both messages are shown
        mistakes[value] = f"{mistakes[value]}; or {why}" if value in mistakes else why
    if got in mistakes:
        not_yet(mistakes[got])
    not_yet(f"{got:,} is {got / want:.3g} times the size; count K and V, B * h * max_len * d_k "
            f"numbers each, and the bytes of one float32 number")
