"""Self-checks for the Try-it of 11_sdpa_backends.ipynb: a score matrix's GiB, dropout's kernel.

The size is judged within 1%: the usual slips by their value (every slip that gives the same
value is named), any other number by how it relates to the right one (a ratio made of the
heads, the bytes per number, bits, GB for GiB). The kernel is read in the names
people write for it (SDPBackend members, the profiler's op names, "math path", ...).
"""

from __future__ import annotations

import ast
import difflib
import math
import re
from typing import Any

from mha_course.i18n import _, use_language
from mha_course.tryit import (
    as_number,
    describe_number,
    first_match,
    last_assignment,
    not_tried,
    not_yet,
    right,
    self_check,
    slip_readings,
)

KERNELS = ("flash", "efficient", "cudnn", "math")
"""SDPA's kernels by the short names the lesson uses (mha.perf.bench.BACKENDS)."""

FACTORS = {"2 (4-byte float32 for 2-byte bfloat16, or two matrices)": 2.0,
           "h = 32 (the heads)": 32.0, "8 (bits in a byte)": 8.0,
           "2**30 / 10**9 (GB for GiB)": 2**30 / 1e9}
"""How a wrong size usually relates to the right one: describe_number names these ratios."""


def _size_mistakes(B: int, h: int, T: int, S: int, itemsize: int) -> list[tuple[float, str]]:
    """(GiB a usual slip gives, what the slip is) for a (B, h, T, S) matrix of itemsize bytes."""
    numbers = B * h * T * S  # entries of the matrix
    nbytes = numbers * itemsize
    k8 = B * h * 8000 * 8000 * itemsize  # "8K tokens" read as 8000
    return [
        (numbers * 4 / 2**30, _("that is 4 bytes per number (float32); bfloat16 takes 2")),
        (numbers * 8 / 2**30, _("that is 8 bytes per number (float64); bfloat16 takes 2")),
        (B * h * T * itemsize / 2**30, _("T is not squared: that is B * h * T numbers, one per "
                                         "query; the scores pair every query with every key")),
        (B * T * S * itemsize / 2**30, _("that leaves out the heads: every head has its own T x "
                                         "T scores")),
        (2 * nbytes / 2**30, _("that counts two matrices (the scores and the softmax weights the "
                               "math path writes beside them): the question asks for one")),
        (nbytes / 1e9, _("that is GB (10**9 bytes); a GiB is 2**30 bytes")),
        (nbytes, _("that is bytes: the answer is wanted in GiB (divide by 2**30)")),
        (nbytes / 2**10, _("that is KiB (2**10 bytes): the answer is wanted in GiB")),
        (nbytes / 2**20, _("that is MiB (2**20 bytes): the answer is wanted in GiB")),
        (nbytes / h / 2**30, _("that is one head: the matrix holds a (T, T) block for each of "
                               "the {h} heads").format(h=h)),
        (nbytes * 8 / 2**30, _("that counts bits: a byte is 8 bits, and a bfloat16 number takes "
                               "2 bytes")),
        (numbers / 2**30, _("that counts numbers, not bytes: each bfloat16 number takes 2 "
                            "bytes")),
        (nbytes / 2 / 2**30, _("that counts only the causal half (the lower triangle, with or "
                               "without its diagonal): the math path writes the whole T x T "
                               "matrix, masked entries included")),
        (numbers / 2 / 2**30, _("that counts numbers, not bytes, over only the causal half: each "
                                "bfloat16 number takes 2 bytes, and the math path writes the "
                                "whole T x T matrix")),
        (nbytes / 2**40, _("that is TiB (2**40 bytes): the answer is wanted in GiB")),
        (numbers * (itemsize + 1) / 2**30, _("that adds a one-byte mask per entry (what the math "
                                             "path's safe softmax builds beside the scores): the "
                                             "question asks for the score matrix alone")),
        (numbers * (itemsize + 4) / 2**30, _("that adds a float32 copy of every entry (softmax "
                                             "weights kept in float32): the question asks for "
                                             "one bfloat16 score matrix")),
        (k8 / 2**30, _("that takes T = 8000: 8192 tokens is 8 * 1024, not 8 * 1000")),
        (k8 / 1e9, _("that takes T = 8000 and GB (10**9 bytes): T is 8192 = 8 * 1024 and a GiB "
                     "is 2**30 bytes")),
    ]


@self_check
def check_score_gib(answer: Any, B: int = 1, h: int = 32, T: int = 8192, S: int = 8192,
                    itemsize: int = 2) -> str:
    """Say right, or which factor of B * h * T * S * itemsize / 2**30 the answer gets wrong."""
    if answer is None:
        return not_tried(_("write the size of one (B, h, T, T) score matrix in GiB as `gib` "
                           "(a number)"))
    got = as_number(answer, "gib")
    numbers = B * h * T * S  # entries of the matrix
    want = numbers * itemsize / 2**30
    if abs(got - want) <= 0.01 * want:
        return right(_("{numbers:,} numbers of {itemsize} bytes = {nbytes:,} bytes = {want:g} "
                       "GiB, for one layer's scores alone").format(
            numbers=numbers, itemsize=itemsize, nbytes=numbers * itemsize, want=want))
    table = [why for w, why in _size_mistakes(B, h, T, S, itemsize) if abs(got - w) <= 0.005 * w]
    singles = {words for _kind, _factor, words in _slips(h, itemsize, T)}
    pairs = [why for why in slip_readings(got, want, _slips(h, itemsize, T), rtol=0.005)
             if why not in singles] if table else []  # the singles are in the table
    named = first_match([1.0], [([1.0], why) for why in table + pairs]) if table else None
    extra = _("a little more than one score matrix ({more:.2g}% more): something small is added "
              "to it (Q, K and V? a mask?); the question asks for the (B, h, T, T) scores "
              "alone").format(more=100 * (got / want - 1)) if want < got < 1.1 * want else None
    if named and extra:
        not_yet(_("two readings fit this value: {this}; or {that}").format(this=named, that=extra))
    if named or extra:
        not_yet(named or extra)
    if got <= 0:
        not_yet(_("gib must be positive: a matrix takes room, got {got:g}").format(got=got))
    qkv_size = None
    for unit in (2**30, 1e9):  # a (T, d) matrix: the size of Q, K or V, not of the scores
        width = got * unit / (B * h * T * itemsize)
        if width in (16, 32, 64, 80, 96, 128, 256):
            qkv_size = (_("that is a (T, {width:g}) matrix per head, the size of Q, K or V for a "
                          "head width of {width:g}: the scores pair every query with every key, "
                          "T x T") if unit == 2**30 else
                        _("that is a (T, {width:g}) matrix per head, the size of Q, K or V for a "
                          "head width of {width:g}: the scores pair every query with every key, "
                          "T x T; and that is GB (10**9 bytes), not GiB")).format(width=width)
    if got > 500 * want:
        not_yet(_("{got:g} is far too big for GiB: that looks like a count in a small unit "
                  "(bytes, KiB, MiB) or of numbers; a GiB is 2**30 bytes").format(got=got))
    pairs = slip_readings(got, want, _slips(h, itemsize, T), rtol=0.01)
    if pairs:
        more = [qkv_size] if qkv_size else []
        not_yet(first_match([1.0], [([1.0], why) for why in more + pairs]))
    said = describe_number(got, want, "gib", None, rtol=0.01)
    with use_language("en"):  # which reading it is, whatever the language it is said in
        kind = describe_number(got, want, "gib", None, rtol=0.01)
    if qkv_size is not None:
        not_yet(_("two slips give this value: {this}; or {that}").format(this=qkv_size, that=said)
                if "factor" in kind else qkv_size)
    if "off by" in kind:  # a few GiB too many is a wrong factor here, not an off-by-one
        k = math.floor(math.log2(got / want))
        lo, hi = (f"{2**k}" if k >= 0 else f"1/{2**-k}"), (f"{2**(k + 1)}" if k >= -1 else f"1/{2**(-k - 1)}")
        said = _("gib is between {lo} and {hi} times the right value, a ratio none of the usual "
                 "slips gives").format(lo=lo, hi=hi)
    not_yet(_("{said}. Check each factor of your count in turn: the shape of the matrix, the "
              "bytes of one number, and the unit").format(said=said))


def _slips(h: int, itemsize: int, T: int) -> list[tuple[str, float, str]]:
    """The single slips a size is made of, (kind, factor, words): two of them may come together."""
    return [("item", 4 / itemsize, _("4 bytes a number (float32)")),
            ("item", 8 / itemsize, _("8 bytes a number (float64)")),
            ("item", 1 / itemsize, _("numbers counted, not bytes")),
            ("item", 8, _("bits, not bytes")),
            ("heads", 1 / h, _("one head only")), ("heads", h, _("the heads counted twice")),
            ("unit", 2**30 / 1e9, _("GB (10**9 bytes), not GiB")),
            ("solo", 2**10, _("MiB, not GiB")),
            ("half", 1 / 2, _("only the causal half")), ("half", 2, _("two matrices")),
            ("solo", 1 / T, _("T not squared"))]


ALIASES = {
    "math": ("math", "maths", "math path", "math kernel", "math backend", "sdpbackend.math",
             "sdpa_math", "attention_math", "_scaled_dot_product_attention_math",
             "aten::_scaled_dot_product_attention_math", "the math path", "the math kernel"),
    "flash": ("flash", "flash_attention", "flashattention", "flash attention", "flash-attention",
              "sdpbackend.flash_attention", "flash kernel", "flash_attention_2", "flashattention-2",
              "flashattention2", "fa2", "_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_flash_attention", "the flash kernel"),
    "efficient": ("efficient", "efficient_attention", "efficient attention", "mem_efficient",
                  "mem-efficient", "memory-efficient", "memory efficient", "memory_efficient",
                  "sdpbackend.efficient_attention", "xformers", "cutlass",
                  "_scaled_dot_product_efficient_attention"),
    "cudnn": ("cudnn", "cudnn_attention", "sdpbackend.cudnn_attention", "cudnn attention",
              "_scaled_dot_product_cudnn_attention"),
}


def _other_names() -> dict[tuple[str, ...], str]:
    """Answers that name something other than a kernel, with what they name."""
    return {
        ("sdpa", "default", "auto", "scaled_dot_product_attention", "f.scaled_dot_product_attention",
         "sdp", "dispatcher"):
            _("{got!r} names the dispatcher, not a kernel: which kernel does it pick here?"),
        ("error", "none", "raises", "it raises", "fails", "it fails", "refused", "runtimeerror",
         "nothing", "no kernel", "sdpbackend.error"):
            _("a default call does not fail: SDPA tries its kernels in turn and runs the first "
              "that accepts the inputs; only a call forced onto one kernel (sdpa_kernel) raises "
              "when that kernel refuses. Which kernel accepts dropout on a CPU?"),
        ("overrideable", "sdpbackend.overrideable"):
            _("OVERRIDEABLE is a slot for kernels registered from outside PyTorch; none is on a "
              "plain CPU build. Which of the lesson's kernels runs?"),
        ("cpu", "cuda", "gpu"):
            _("{got!r} names a device, not a kernel: the call runs on the CPU; which kernel runs "
              "there?"),
        ("eager", "manual", "naive", "numpy", "ours", "reference"):
            _("{got!r} is a path outside SDPA (the PyTorch port lesson's use_sdpa=False): the "
              "question asks which of SDPA's own kernels runs"),
        ("flex", "flex_attention", "flexattention", "triton"):
            _("{got!r} is not one of SDPA's kernels: FlexAttention and Triton kernels are called "
              "separately, never picked by F.scaled_dot_product_attention"),
    }


def _kernel_name(answer: Any, name: str) -> tuple[str, str]:
    """(kernel, as written): the answer read as one of KERNELS, or as written if none fits."""
    if hasattr(answer, "name") and type(answer).__name__ == "SDPBackend":  # the enum itself
        answer = f"sdpbackend.{answer.name}"
    if isinstance(answer, bytes):
        answer = answer.decode(errors="replace")
    if not isinstance(answer, str):
        not_yet(_('{name} must be text, "flash" or "math", got {kind} {answer!r:.40}').format(
            name=name, kind=type(answer).__name__, answer=answer))
    text = re.sub(r"\s+", " ", answer.strip().strip("'\"").lower())
    text = text.removeprefix("torch.nn.attention.").removeprefix("torch.backends.cuda.")
    for kernel, names in ALIASES.items():
        if text in names:
            return kernel, text
    return text, text


def _named_both(text: str) -> bool:
    """Whether the text offers more than one kernel as its answer ("flash or math", "math/flash")."""
    words = set(re.findall(r"[a-z_]+", text))
    named = sum(any(n in words for n in (k, *ALIASES[k][:2])) for k in KERNELS)
    return named > 1 and _first_kernel(text) is None


def _first_kernel(text: str) -> str | None:
    """The kernel an answer with an explanation opens with ("math, since flash refuses it"),
    or None when it offers a choice ("flash or math") or opens otherwise."""
    if re.search(r"\b(or|and)\b|/|\|", text):
        return None
    first = re.match(r"[a-z_]+", text)
    return next((k for k in KERNELS if first and first.group() in (k, *ALIASES[k][:2])), None)


def _measured_in_notebook() -> bool:
    """In a notebook: whether the last `kernel = ...` the kernel ran measures instead of answers."""
    found = last_assignment("kernel")
    if found is None:
        return False
    names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(found[0])
             if isinstance(n, ast.Attribute | ast.Name)}
    return bool(names & {"kernel_that_runs", "scaled_dot_product_attention", "profile",
                         "sdpa_kernel", "KERNEL_OPS"})


@self_check
def check_dropout_kernel(answer: Any, measured: Any = None) -> str:
    """Say right, or what is wrong with the kernel named for a CPU SDPA call with dropout_p=0.1.

    `measured` is the kernel the notebook saw run (bench.kernel_that_runs), or None for "math",
    what the CPU flash kernel's refusal of dropout leaves in torch 2.13.
    """
    if answer is None:
        return not_tried(_('write the kernel\'s name as `kernel`: "flash" or "math"'))
    if _measured_in_notebook():
        not_yet(_("`kernel` is set from a run (kernel_that_runs or SDPA itself), not from the "
                  "tables: the exercise asks you to answer from the lesson first; the cell below "
                  "then measures it for you"))
    got, written = _kernel_name(answer, "kernel")
    want = "math" if measured is None else _kernel_name(measured, "measured")[0]
    if got not in KERNELS and not _named_both(got) and not re.search(r"\b(not|no|never)\b", got):
        close = difflib.get_close_matches(got, KERNELS, n=1, cutoff=0.75)
        words = [k for k in KERNELS if k in re.findall(r"[a-z]+", got)]
        if _first_kernel(got):
            got = _first_kernel(got)  # the kernel, then a reason
        elif close:
            got = close[0]  # a typo of one kernel's name ("flsh", "mathh"): read as that kernel
        elif len(words) == 1:
            got = words[0]  # "the math one", "math (the fallback)": the one kernel it names
    if got == want:
        if want == "math":
            said = _("a default CPU call with dropout_p=0.1 runs {want}: the CPU flash kernel "
                     "refuses dropout, so SDPA hands the call to the math path, which applies "
                     "dropout to the weights it materialises").format(want=want)
        else:
            said = _("a default CPU call with dropout_p=0.1 runs {want}").format(want=want)
        if written != want:
            said = _("{said} (read {answer!r:.40} as {want!r})").format(said=said, answer=answer,
                                                                        want=want)
        return right(said)
    if got in ("efficient", "cudnn"):
        not_yet(_("{got} is a CUDA kernel: SDPA never picks it for CPU tensors (see the 'on CPU' "
                  "rows of the refusal table)").format(got=got))
    if got == "flash":
        not_yet(_("the CPU flash kernel refuses dropout_p > 0 (the 'dropout 0.1' row of the "
                  "refusal table): a default call does not run a kernel that refuses its input"))
    if got == "math" and want == "flash":
        not_yet(_("this PyTorch's CPU flash kernel accepts dropout: the measured default call "
                  "ran flash"))
    if _named_both(got):
        not_yet(_("{answer!r:.40} names more than one kernel: one call runs one kernel, so name "
                  "the one that runs").format(answer=answer))
    for names, why in _other_names().items():
        if got in names:
            not_yet(why.format(got=got))
    not_yet(_("{answer!r:.40} is not one of SDPA's kernels here: answer \"flash\" or "
              "\"math\"").format(answer=answer))
