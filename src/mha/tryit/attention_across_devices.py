"""Self-check for the Try-it of 18_attention_across_devices.ipynb: the bytes a ring rank sends."""

from __future__ import annotations

from typing import Any

from . import as_number, not_tried, not_yet, right


def check_ring_bytes(answer: Any, B: int = 1, h: int = 8, T: int = 4096, W: int = 4, d_k: int = 64,
                     itemsize: int = 4) -> str:
    """Say right, or which factor of (W - 1) * 2 * B * h * (T / W) * d_k * itemsize the answer misses."""
    if answer is None:
        return not_tried("write the bytes of K and V one rank sends in a whole ring pass as "
                         "`answer` (an int)")
    got = as_number(answer, "the bytes sent", integer=True)
    block = B * h * (T // W) * d_k  # numbers in one rank's K block (B, h, T / W, d_k)
    step = 2 * block * itemsize  # K and V, float32
    want = (W - 1) * step
    if got == want:
        return right(f"{want:,} bytes: W - 1 = {W - 1} steps, each sending the K and V blocks "
                     f"(B, h, T / W, d_k) = {block:,} numbers apiece, {itemsize} bytes each")
    mistakes: dict[int, str] = {}
    for value, why in (
        (step, "that is one step: a rank passes blocks on at W - 1 steps (it keeps the last one)"),
        (W * step, "that counts W steps: after W - 1 sends every rank has seen every block, so "
                   "the last block is not sent on"),
        ((W - 1) * block * itemsize, "that is K alone (or V alone): each step sends both"),
        ((W - 1) * 2 * block, "that counts numbers, not bytes: each float32 number takes 4 bytes"),
        ((W - 1) * 2 * block * 8, "that is 8 bytes per number (float64); float32 takes 4"),
        ((W - 1) * W * step, "that forgot /W: a rank holds only its T / W tokens' keys and "
                             "values, not the whole sequence's"),
        (W * W * step, "that forgot /W and counts W steps"),
        (want + (W - 1) * (T // W) * 8, "that includes our implementation's int64 positions; "
                                        "the exercise counts K and V only"),
        (want * 8, "that is bits: the answer is wanted in bytes (8 bits each)"),
    ):  # two mistakes that give the same number share it: both messages are shown
        mistakes[value] = f"{mistakes[value]}; or {why}" if value in mistakes else why
    if got in mistakes:
        not_yet(mistakes[got])
    not_yet(f"{got:,} is {got / want:.3g} times the size; count the steps that send, the tensors "
            "each step sends, the numbers in one rank's block and the bytes of one float32")
