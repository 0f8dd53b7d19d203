"""Self-checks for the Try-it of 11_sdpa_backends.ipynb: a score matrix's GiB, dropout's kernel."""

from __future__ import annotations

from typing import Any

from . import as_number, not_tried, not_yet, right

KERNELS = ("flash", "efficient", "cudnn", "math")
"""SDPA's kernels by the short names the lesson uses (mha.bench.BACKENDS)."""


def check_score_gib(answer: Any, B: int = 1, h: int = 32, T: int = 8192, S: int = 8192,
                    itemsize: int = 2) -> str:
    """Say right, or which factor of B * h * T * S * itemsize / 2**30 the answer gets wrong."""
    if answer is None:
        return not_tried("write the size of one (B, h, T, T) score matrix in GiB as `gib` "
                         "(a number)")
    got = as_number(answer, "gib")
    numbers = B * h * T * S  # entries of the matrix
    want = numbers * itemsize / 2**30
    if abs(got - want) <= 0.01 * want:
        return right(f"{numbers:,} numbers of {itemsize} bytes = {numbers * itemsize:,} bytes "
                     f"= {want:g} GiB, for one layer's scores alone")
    mistakes = [
        (numbers * 4 / 2**30, "that is 4 bytes per number (float32); bfloat16 takes 2"),
        (numbers * itemsize / 1e9, "that is GB (10**9 bytes); a GiB is 2**30 bytes"),
        (numbers * itemsize, "that is bytes: the answer is wanted in GiB (divide by 2**30)"),
        (numbers * itemsize / 2**20, "that is MiB (2**20 bytes): the answer is wanted in GiB"),
        (numbers * itemsize / h / 2**30, f"that is one head: the matrix holds a (T, T) block "
                                         f"for each of the {h} heads"),
        (numbers * itemsize * 8 / 2**30, "that counts bits: a byte is 8 bits, and a bfloat16 "
                                         "number takes 2 bytes"),
        (numbers / 2**30, "that counts numbers, not bytes (or only half the matrix): each "
                          "bfloat16 number takes 2 bytes, and the math path writes the whole "
                          "T x T matrix, masked entries included"),
    ]
    for wrong, why in mistakes:
        if abs(got - wrong) <= 0.01 * wrong:
            not_yet(why)
    not_yet(f"{got:g} GiB is {got / want:.3g} times the size: count B * h * T * T numbers, the "
            f"bytes of one bfloat16 number, and 2**30 bytes to a GiB")


def _kernel_name(answer: Any, name: str) -> str:
    """The answer as a lower-case kernel name, or NotYet saying what arrived instead."""
    if not isinstance(answer, str):
        not_yet(f'{name} must be text, "flash" or "math", got {type(answer).__name__} {answer!r}')
    return answer.strip().lower()


def check_dropout_kernel(answer: Any, measured: Any = None) -> str:
    """Say right, or what is wrong with the kernel named for a CPU SDPA call with dropout_p=0.1.

    `measured` is the kernel the notebook saw run (bench.kernel_that_runs), or None for "math",
    what the CPU flash kernel's refusal of dropout leaves in torch 2.13.
    """
    if answer is None:
        return not_tried('write the kernel\'s name as `kernel`: "flash" or "math"')
    got = _kernel_name(answer, "kernel")
    want = "math" if measured is None else _kernel_name(measured, "measured")
    if got == want:
        return right(f"a default CPU call with dropout_p=0.1 runs {want}"
                     + (": the CPU flash kernel refuses dropout, so SDPA hands the call to "
                        "the math path, which applies dropout to the weights it materialises"
                        if want == "math" else ""))
    if got in ("efficient", "memory-efficient", "mem_efficient", "cudnn"):
        not_yet(f"{got} is a CUDA kernel: SDPA never picks it for CPU tensors (see the "
                f"'on CPU' rows of the refusal table)")
    if got in ("sdpa", "default", "auto", "scaled_dot_product_attention"):
        not_yet(f"{got!r} names the dispatcher, not a kernel: which kernel does it pick here?")
    if got == "flash":
        not_yet("the CPU flash kernel refuses dropout_p > 0 (the 'dropout 0.1' row of the "
                "refusal table): a default call does not run a kernel that refuses its input")
    if got == "math" and want == "flash":
        not_yet("this PyTorch's CPU flash kernel accepts dropout: the measured default call "
                "ran flash")
    not_yet(f"{answer!r} is not one of SDPA's kernels here: answer \"flash\" or \"math\"")
