"""Self-checks for the Try-it of 13_kv_cache.ipynb: the bytes of one layer's KV cache.

check_cache_bytes    the number of bytes for B = 1, h = 8, max_len = 1024, d_k = 64 in float32
                     (given a function instead, it is judged as check_cache_formula judges it)
check_cache_formula  a function my_cache_bytes(B, h, max_len, d_k, itemsize), run at several
                     sizes: two slips that cancel at one size (V forgotten and 8 bytes a number)
                     cannot pass, and the package's own KVCache(...).nbytes is not the student's

Each check returns its verdict (a `Verdict`); a number that fits several slips names them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mha.inference import kv_cache
from mha_course.tryit import (
    as_number,
    describe_number,
    first_match,
    guarded,
    not_tried,
    not_yet,
    refuse_if_reached,
    require_params,
    right,
    self_check,
    slip_readings,
)

CASE = dict(B=1, h=8, max_len=1024, d_k=64, itemsize=4)  # float32, the lesson's question
ARGS = ("B", "h", "max_len", "d_k", "itemsize")
BASE = dict(B=3, h=5, max_len=7, d_k=11, itemsize=2)  # distinct primes: each factor shows alone
RULE = ("write the formula yourself from the shapes: KVCache(...).nbytes and the package's cost "
        "functions are the reference this exercise is checked against")

_WHY = {  # what each argument is, said when the formula does not grow with it as it should
    "B": "every sequence of the batch keeps its own keys and values",
    "h": "every head caches its own keys and values",
    "max_len": "the cache has a slot for each of the max_len positions",
    "d_k": "each cached key and value is a vector of d_k numbers per head",
    "itemsize": "each number takes itemsize bytes, and that depends on the dtype",
}


def _bytes(B: int, h: int, max_len: int, d_k: int, itemsize: int) -> int:
    """The right count, by the lesson's formula: K and V, each (B, h, max_len, d_k)."""
    return 2 * B * h * max_len * d_k * itemsize


def _number_mistakes(B: int, h: int, max_len: int, d_k: int, itemsize: int,
                     ) -> list[tuple[float, str]]:
    """Typical wrong byte counts at one size, each with its slip (several may share a value)."""
    numbers = B * h * max_len * d_k  # entries of K alone
    want = 2 * numbers * itemsize
    listed = [
        (numbers * itemsize, "that is K alone (or V alone): the cache holds both"),
        (2 * numbers * 2, "that is 2 bytes per number (float16 or bfloat16); the question is "
                          "float32"),
        (numbers * itemsize, "that halves the cache for the causal mask? Every later query reads "
                             "all earlier keys, so each of the max_len slots keeps a key and a "
                             "value: the mask does not shrink the cache"),
        (2 * numbers, "that counts numbers, not bytes: multiply by the bytes of one float32"),
        (2 * numbers * 8, "that is 8 bytes per number (float64); the question is float32"),
        (3 * numbers * itemsize, "that caches the queries too: only K and V are kept, no later "
                                 "step needs an old query"),
        (want * 8, "that is bits: the answer is wanted in bytes (8 bits each)"),
        (want * h, "that uses d_model = h * d_k where d_k belongs: each head caches vectors of "
                   "d_k numbers"),
        (want * 2, "that has the factor 2 for K and V twice"),
        (want / 8, "that is divided by 8 (bits to bytes?) where the count is in bytes already"),
        (want * 32, "that is 32 layers: the question asks for one layer"),
        (want / 10**9, "that is the size in GB (billions of bytes): the answer is wanted in bytes"),
        (want / 2**20, "that is the size in MiB: the answer is wanted in bytes"),
        (want / 10**6, "that is the size in MB (millions of bytes): the answer is wanted in bytes"),
        (want / 2**10, "that is the size in KiB: the answer is wanted in bytes"),
        (want / 10**3, "that is the size in kB (thousands of bytes): the answer is wanted in bytes"),
        (want / 2**30, "that is the size in GiB: the answer is wanted in bytes"),
        (2 * B * h * d_k * itemsize, "that is the cache of one position: multiply by the "
                                     f"max_len = {max_len} positions it has room for"),
        (2 * B * max_len * d_k * itemsize, f"that leaves out the h = {h} heads: every head caches "
                                           "its own keys and values"),
        (2 * B * h * max_len * itemsize, "that leaves out d_k: each cached key and value is a "
                                         "vector of d_k numbers per head"),
    ]
    slips = [("kv", 1 / 2, "K alone (V forgotten)"), ("kv", 2, "the factor 2 for K and V twice"),
             ("item", 1 / itemsize, "numbers counted, not bytes"),
             ("item", 8 / itemsize, "8 bytes a number (float64)"),
             ("item", 2 / itemsize, "2 bytes a number (float16)"),
             ("item", 8, "bits, not bytes"), ("h", 1 / h, "the heads left out"),
             ("h", h, "d_model in place of d_k"), ("len", 1 / max_len, "one position, not max_len")]
    for i, (kind_a, a, why_a) in enumerate(slips):  # two slips at once: K alone and numbers, ...
        for kind_b, b, why_b in slips[i + 1:]:  # one of each kind; a pair that cancels is left
            if kind_a != kind_b and not math.isclose(a * b, 1.0):  # to the function part
                listed.append((want * a * b, f"two slips together: {why_a}, and {why_b}"))
    sizes = dict(B=B, h=h, max_len=max_len, d_k=d_k)
    for name, value in sizes.items():  # one size off by one: max_len - 1 slots, d_k + 1, ...
        for step in (-1, 1):
            if value + step > 0:
                off = _bytes(**{**sizes, name: value + step}, itemsize=itemsize)
                listed.append((off, f"that counts {name} {'-' if step < 0 else '+'} 1 where "
                                    f"{name} = {value} belongs (an off-by-one in one size)"))
    return listed


FACTORS = {"2 (K and V)": 2, "8 (bits per byte)": 8}
"""What a whole ratio to the right count may mean, beyond the slips listed by value."""


def _describe(got: float, want: float, name: str, factors: dict[str, float]) -> str:
    """How an unlisted number relates to the right one (describe_number: a whole ratio named, any
    other only by the powers of 2 around it), and what to count where no factor fits."""
    said = describe_number(got, want, name, factors)
    if "between" in said:  # no whole ratio: only the powers of 2 around it are said
        said += (", by no clean factor: count K and V, B * h * max_len * d_k numbers each, and the "
                 "bytes of each number")
    return said


@self_check
def check_cache_bytes(answer: Any, B: int = 1, h: int = 8, max_len: int = 1024, d_k: int = 64,
                      itemsize: int = 4) -> str:
    """Say right, or which slip (or slips) the byte count of one layer's KV cache fits."""
    if answer is None:
        return not_tried("write the cache's size in bytes as `answer` (an int)")
    if callable(answer):
        return _judge_formula(answer)
    got = as_number(answer, "the cache's size")
    want = _bytes(B, h, max_len, d_k, itemsize)
    if got == want:
        refuse_if_reached((kv_cache,), "count the bytes from the formula yourself (by hand, or "
                          "with numbers in your own expression): KVCache(...).nbytes and the "
                          "package's cost functions are the reference this exercise is checked "
                          "against")
        return right(f"{want:,} bytes = {want / 2**20:g} MiB: K and V, each {want // 2 // itemsize:,} "
                     f"numbers of {itemsize} bytes")
    said = first_match(got, _number_mistakes(B, h, max_len, d_k, itemsize),
                       atol=1e-9 * max(1.0, abs(got)))
    if said:
        not_yet(said)
    if got != int(got):
        not_yet(f"a number of bytes is a whole number, got {got:g}")
    if got <= 0:
        not_yet(f"a cache takes a positive number of bytes, got {got:g}: count K and V, "
                f"B * h * max_len * d_k numbers each, and the bytes of each number")
    if 0.9 < got / want < 1.1 and abs(got - want) > 2:  # off by 1 or 2: said by _describe
        not_yet("your number is close but not exact: count the bytes exactly, with no rounding "
                "and no unit conversion (a KiB is 1024 bytes, not 1000)")
    not_yet(_describe(got, want, "your number", {**FACTORS, f"h = {h}": h}))


def _call(fn: Callable[..., Any], sizes: dict[str, int]) -> float | None:
    """fn at one set of sizes, under the grading guard: its number of bytes, or None for None."""
    result = guarded(fn, *(sizes[a] for a in ARGS), rule=RULE)
    if result is None:
        return None
    return as_number(result, f"{_name(fn)}'s result")


def _name(fn: Callable[..., Any]) -> str:
    """The student's function's name, or 'your function' for a lambda."""
    name = getattr(fn, "__name__", "")
    return name if name.isidentifier() else "your function"


def _growth(fn: Callable[..., Any], base: float) -> dict[str, float]:
    """For each argument: how the result grows when that argument alone doubles (2 = in proportion)."""
    grown = {}
    for a in ARGS:
        doubled = _call(fn, {**BASE, a: 2 * BASE[a]})
        grown[a] = math.nan if doubled is None or base == 0 else doubled / base
    return grown


def _growth_story(grown: dict[str, float]) -> list[str]:
    """One sentence per argument the result does not grow with in proportion."""
    told = []
    for a, r in grown.items():
        if math.isclose(r, 2.0, rel_tol=1e-9):
            continue
        if math.isclose(r, 1.0, rel_tol=1e-9):
            fixed = " (a fixed number of bytes per number?)" if a == "itemsize" else ""
            told.append(f"does not change when {a} doubles{fixed}: {_WHY[a]}")
        elif math.isclose(r, 4.0, rel_tol=1e-9):
            told.append(f"grows 4 times when {a} doubles: {a} is counted twice (squared); "
                        f"{_WHY[a]}, once")
        elif math.isfinite(r):
            told.append(f"is not proportional to {a}: doubling {a} multiplies the result by {r:.3g}; "
                        f"{_WHY[a]}")
        else:
            told.append(f"returns None when {a} doubles: it must return a number for any sizes")
    return told


def _judge_formula(fn: Callable[..., Any]) -> str:
    """Right if fn gives the bytes of one layer's cache at every size tried, else why not."""
    name = _name(fn)
    require_params(fn, ARGS, name)
    at_case = _call(fn, CASE)
    if at_case is None:
        return not_tried(f"make {name} return the cache's bytes for (B, h, max_len, d_k, itemsize), "
                         f"then run the cell")
    base = _call(fn, BASE)
    if base is None:
        not_yet(f"{name} returns None at other sizes: it must return a number for any sizes")
    sizes = ", ".join(f"{a} = {BASE[a]}" for a in ARGS)
    if base <= 0 or at_case <= 0:
        where = sizes if base <= 0 else "the lesson's sizes"
        not_yet(f"{name} gives {base if base <= 0 else at_case:g} bytes at {where}: a cache of "
                f"any size takes a positive number of bytes (a // that rounds to whole MiB?)")
    want_case, want_base = _bytes(**CASE), _bytes(**BASE)
    grown = _growth(fn, base)
    if at_case == want_case and base == want_base and all(
            math.isclose(r, 2.0, rel_tol=1e-9) for r in grown.values()):
        return right(f"2 * B * h * max_len * d_k * itemsize: K and V, checked at {2 + len(ARGS)} "
                     f"sizes; at the lesson's it gives {want_case:,} bytes")
    if at_case != want_case and at_case - want_case == base - want_base:
        not_yet(f"{name} is off by the same {at_case - want_case:+g} bytes at every size: a term "
                f"that does not belong is added to the product")
    if all(math.isclose(r, 1.0, rel_tol=1e-9) for r in grown.values()):
        not_yet(f"{name} returns the same number whatever the sizes: compute the bytes from its "
                f"five arguments")
    for a in ARGS[:-1]:  # one size off by one at every size: max_len - 1 slots, ...
        for step in (-1, 1):
            if all(fn_at == _bytes(**{**at, a: at[a] + step}) for fn_at, at in
                   ((base, BASE), (at_case, CASE))):
                not_yet(f"{name} counts {a} {'-' if step < 0 else '+'} 1 where {a} belongs (an "
                        f"off-by-one in one size): {_WHY[a]}")
    if math.isclose(grown["itemsize"], 1.0) and all(
            math.isclose(r, 2.0) for a, r in grown.items() if a != "itemsize"):
        per_number = base / (_bytes(**BASE) / BASE["itemsize"])  # the bytes it uses, K and V
        if per_number > 0:  # a constant typed in for itemsize, maybe with V forgotten
            fits = [f"{c} bytes a number typed in for itemsize"
                    + ("" if k == 2 else ", with V forgotten (K alone)")
                    for k in (2, 1) for c in (1, 2, 4, 8) if math.isclose(per_number, k * c / 2)]
            if fits:
                cancel = any(f.startswith("8 bytes") and "V forgotten" in f for f in fits)
                not_yet(f"{name} does not use itemsize (it stays the same when itemsize doubles): "
                        + "; or ".join(fits) + (". K alone at 8 bytes a number equals K and V at "
                                                "float32's 4, which is why the lesson's size "
                                                "alone could not show it" if cancel else ""))
    if all(math.isclose(r, 2.0, rel_tol=0.02) for r in grown.values()) and not all(
            math.isclose(r, 2.0, rel_tol=1e-9) for r in grown.values()):  # // or int() rounds
        per = base / math.prod(BASE[a] for a in ARGS)
        said = [why for c, why in _CONSTANT_MISTAKES if math.isclose(per, c, rel_tol=0.05)]
        if math.isclose(per, 2 / 8, rel_tol=0.05):
            said.append("it divides by 8, as if itemsize were in bits: it is the bytes of one "
                        "number already")
        not_yet(f"{name} rounds its result (a // or int() on the way), so it is not exactly "
                f"proportional to the sizes" + (": and " + "; or ".join(said) if said else
                                                "; a byte count needs no rounding"))
    told = _growth_story(grown)
    if told:
        not_yet(f"{name} " + "; and it ".join(told))
    per = base / math.prod(BASE[a] for a in ARGS)  # proportional to each size: only the constant
    said = first_match(per, _CONSTANT_MISTAKES, atol=1e-12)
    if not said:  # two slips in the constant: K alone and bits, K and V twice and MiB, ...
        pairs = slip_readings(per, 2.0, [
            ("kv", 1 / 2, "it counts K alone (V forgotten)"),
            ("kv", 2, "it counts K and V twice"), ("q", 3 / 2, "it caches the queries too"),
            ("unit", 8, "it counts bits, not bytes"), ("unit", 2**-20, "it gives MiB"),
            ("unit", 2**-10, "it gives KiB"), ("layers", 32, "it counts 32 layers")], rtol=1e-9)
        said = "; or ".join(p.replace(" together with it ", ", and ") for p in pairs) or None
    if said:
        not_yet(f"{name} grows in proportion to every argument, but {said}")
    not_yet(f"{name} grows in proportion to every argument, but "
            + _describe(base, want_base, "its result", FACTORS))


_CONSTANT_MISTAKES = [  # result / (B h max_len d_k itemsize) when only the constant in front is off
    (1, "it counts K alone (or V alone): the cache holds both"),
    (1, "it halves the cache for the causal mask? Every later query reads all earlier keys, so "
        "each of the max_len slots keeps a key and a value"),
    (3, "it caches the queries too: only K and V are kept, no later step needs an old query"),
    (4, "it counts K and V twice each (itemsize is already the bytes of one number)"),
    (16, "it counts bits: the answer is wanted in bytes (8 bits each)"),
    (64, "it counts 32 layers: the question asks for one layer"),
    (2 / 2**20, "it gives MiB: the answer is wanted in bytes"),
    (2 / 10**6, "it gives MB (millions of bytes): the answer is wanted in bytes"),
    (2 / 2**10, "it gives KiB: the answer is wanted in bytes"),
    (2 / 10**3, "it gives kB (thousands of bytes): the answer is wanted in bytes"),
    (2 / 2**30, "it gives GiB: the answer is wanted in bytes"),
]


@self_check
def check_cache_formula(my_cache_bytes: Any) -> str:
    """Say right if my_cache_bytes(B, h, max_len, d_k, itemsize) counts one layer's cache at
    every size tried, else which argument or factor it gets wrong."""
    if my_cache_bytes is None:
        return not_tried("write `my_cache_bytes(B, h, max_len, d_k, itemsize)` returning the bytes "
                         "of one layer's cache")
    if not callable(my_cache_bytes):
        shown = type(my_cache_bytes).__name__
        not_yet(f"my_cache_bytes must be a function of (B, h, max_len, d_k, itemsize), got {shown}: "
                f"the number for the lesson's sizes goes in `answer`, checked by check_cache_bytes")
    return _judge_formula(my_cache_bytes)
