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
from mha_course.i18n import _
from mha_course.tryit import (
    _bracket,
    _exact,
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
)

CASE = dict(B=1, h=8, max_len=1024, d_k=64, itemsize=4)  # float32, the lesson's question
ARGS = ("B", "h", "max_len", "d_k", "itemsize")
BASE = dict(B=3, h=5, max_len=7, d_k=11, itemsize=2)  # distinct primes: each factor shows alone


def _rule() -> str:
    """What the grading guard says when the package's own cache made the answer."""
    return _("write the formula yourself from the shapes: KVCache(...).nbytes and the package's "
             "cost functions are the reference this exercise is checked against")


def _why(arg: str) -> str:
    """What each argument is, said when the formula does not grow with it as it should."""
    return {
        "B": _("every sequence of the batch keeps its own keys and values"),
        "h": _("every head caches its own keys and values"),
        "max_len": _("the cache has a slot for each of the max_len positions"),
        "d_k": _("each cached key and value is a vector of d_k numbers per head"),
        "itemsize": _("each number takes itemsize bytes, and that depends on the dtype"),
    }[arg]


def _bytes(B: int, h: int, max_len: int, d_k: int, itemsize: int) -> int:
    """The right count, by the lesson's formula: K and V, each (B, h, max_len, d_k)."""
    return 2 * B * h * max_len * d_k * itemsize


def _number_mistakes(B: int, h: int, max_len: int, d_k: int, itemsize: int,
                     ) -> list[tuple[float, str]]:
    """Typical wrong byte counts at one size, each with its slip (several may share a value)."""
    numbers = B * h * max_len * d_k  # entries of K alone
    want = 2 * numbers * itemsize
    listed = [
        (numbers * itemsize, _("that is K alone (or V alone): the cache holds both")),
        (2 * numbers * 2, _("that is 2 bytes per number (float16 or bfloat16); the question is "
                            "float32")),
        (numbers * itemsize, _("that halves the cache for the causal mask? Every later query "
                               "reads all earlier keys, so each of the max_len slots keeps a key "
                               "and a value: the mask does not shrink the cache")),
        (2 * numbers, _("that counts numbers, not bytes: multiply by the bytes of one float32")),
        (2 * numbers * 8, _("that is 8 bytes per number (float64); the question is float32")),
        (3 * numbers * itemsize, _("that caches the queries too: only K and V are kept, no later "
                                   "step needs an old query")),
        (want * 8, _("that is bits: the answer is wanted in bytes (8 bits each)")),
        (want * h, _("that uses d_model = h * d_k where d_k belongs: each head caches vectors of "
                     "d_k numbers")),
        (want * 2, _("that has the factor 2 for K and V twice")),
        (want / 8, _("that is divided by 8 (bits to bytes?) where the count is in bytes "
                     "already")),
        (want * 32, _("that is 32 layers: the question asks for one layer")),
        (want / 10**9, _("that is the size in GB (billions of bytes): the answer is wanted in "
                         "bytes")),
        (want / 2**20, _("that is the size in MiB: the answer is wanted in bytes")),
        (want / 10**6, _("that is the size in MB (millions of bytes): the answer is wanted in "
                         "bytes")),
        (want / 2**10, _("that is the size in KiB: the answer is wanted in bytes")),
        (want / 10**3, _("that is the size in kB (thousands of bytes): the answer is wanted in "
                         "bytes")),
        (want / 2**30, _("that is the size in GiB: the answer is wanted in bytes")),
        (2 * B * h * d_k * itemsize, _("that is the cache of one position: multiply by the "
                                       "max_len = {max_len} positions it has room for").format(
                                           max_len=max_len)),
        (2 * B * max_len * d_k * itemsize, _("that leaves out the h = {h} heads: every head "
                                             "caches its own keys and values").format(h=h)),
        (2 * B * h * max_len * itemsize, _("that leaves out d_k: each cached key and value is a "
                                           "vector of d_k numbers per head")),
    ]
    slips = [("kv", 1 / 2, _("K alone (V forgotten)")),
             ("kv", 2, _("the factor 2 for K and V twice")),
             ("item", 1 / itemsize, _("numbers counted, not bytes")),
             ("item", 8 / itemsize, _("8 bytes a number (float64)")),
             ("item", 2 / itemsize, _("2 bytes a number (float16)")),
             ("item", 8, _("bits, not bytes")), ("h", 1 / h, _("the heads left out")),
             ("h", h, _("d_model in place of d_k")),
             ("len", 1 / max_len, _("one position, not max_len"))]
    for i, (kind_a, a, why_a) in enumerate(slips):  # two slips at once: K alone and numbers, ...
        for kind_b, b, why_b in slips[i + 1:]:  # one of each kind; a pair that cancels is left
            if kind_a != kind_b and not math.isclose(a * b, 1.0):  # to the function part
                listed.append((want * a * b, _("two slips together: {a}, and {b}").format(
                    a=why_a, b=why_b)))
    sizes = dict(B=B, h=h, max_len=max_len, d_k=d_k)
    for name, value in sizes.items():  # one size off by one: max_len - 1 slots, d_k + 1, ...
        for step in (-1, 1):
            if value + step > 0:
                off = _bytes(**{**sizes, name: value + step}, itemsize=itemsize)
                listed.append((off, _("that counts {name} {sign} 1 where {name} = {value} belongs "
                                      "(an off-by-one in one size)").format(
                                          name=name, sign="-" if step < 0 else "+", value=value)))
    return listed


def _factors() -> dict[str, float]:
    """What a whole ratio to the right count may mean, beyond the slips listed by value."""
    return {_("2 (K and V)"): 2, _("8 (bits per byte)"): 8}


def _describe(got: float, want: float, name: str, factors: dict[str, float]) -> str:
    """How an unlisted number relates to the right one (describe_number: a whole ratio named, any
    other only by the powers of 2 around it), and what to count where no factor fits."""
    said = describe_number(got, want, name, factors)
    r = got / want if want else 0.0
    if r > 0 and not _exact(words := _bracket(r)) and words in said:
        # no whole ratio: only the powers of 2 around it are said
        return _("{said}, by no clean factor: count K and V, B * h * max_len * d_k numbers each, "
                 "and the bytes of each number").format(said=said)
    return said


@self_check
def check_cache_bytes(answer: Any, B: int = 1, h: int = 8, max_len: int = 1024, d_k: int = 64,
                      itemsize: int = 4) -> str:
    """Say right, or which slip (or slips) the byte count of one layer's KV cache fits."""
    if answer is None:
        return not_tried(_("write the cache's size in bytes as `answer` (an int)"))
    if callable(answer):
        return _judge_formula(answer)
    got = as_number(answer, _("the cache's size"))
    want = _bytes(B, h, max_len, d_k, itemsize)
    if got == want:
        refuse_if_reached((kv_cache,), _("count the bytes from the formula yourself (by hand, or "
                                         "with numbers in your own expression): KVCache(...).nbytes "
                                         "and the package's cost functions are the reference this "
                                         "exercise is checked against"))
        return right(_("{want:,} bytes = {mib:g} MiB: K and V, each {numbers:,} numbers of "
                       "{itemsize} bytes").format(want=want, mib=want / 2**20,
                                                  numbers=want // 2 // itemsize, itemsize=itemsize))
    said = first_match(got, _number_mistakes(B, h, max_len, d_k, itemsize),
                       atol=1e-9 * max(1.0, abs(got)))
    if said:
        not_yet(said)
    if got != int(got):
        not_yet(_("a number of bytes is a whole number, got {got:g}").format(got=got))
    if got <= 0:
        not_yet(_("a cache takes a positive number of bytes, got {got:g}: count K and V, "
                  "B * h * max_len * d_k numbers each, and the bytes of each number").format(
                      got=got))
    if 0.9 < got / want < 1.1 and abs(got - want) > 2:  # off by 1 or 2: said by _describe
        not_yet(_("your number is close but not exact: count the bytes exactly, with no rounding "
                  "and no unit conversion (a KiB is 1024 bytes, not 1000)"))
    not_yet(_describe(got, want, _("your number"), {**_factors(), f"h = {h}": h}))


def _call(fn: Callable[..., Any], sizes: dict[str, int]) -> float | None:
    """fn at one set of sizes, under the grading guard: its number of bytes, or None for None."""
    result = guarded(fn, *(sizes[a] for a in ARGS), rule=_rule())
    if result is None:
        return None
    return as_number(result, _("{name}'s result").format(name=_name(fn)))


def _name(fn: Callable[..., Any]) -> str:
    """The student's function's name, or 'your function' for a lambda."""
    name = getattr(fn, "__name__", "")
    return name if name.isidentifier() else _("your function")


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
            if a == "itemsize":
                told.append(_("does not change when {a} doubles (a fixed number of bytes per "
                              "number?): {why}").format(a=a, why=_why(a)))
            else:
                told.append(_("does not change when {a} doubles: {why}").format(a=a, why=_why(a)))
        elif math.isclose(r, 4.0, rel_tol=1e-9):
            told.append(_("grows 4 times when {a} doubles: {a} is counted twice (squared); {why}, "
                          "once").format(a=a, why=_why(a)))
        elif math.isfinite(r):
            told.append(_("is not proportional to {a}: doubling {a} multiplies the result by "
                          "{r:.3g}; {why}").format(a=a, r=r, why=_why(a)))
        else:
            told.append(_("returns None when {a} doubles: it must return a number for any "
                          "sizes").format(a=a))
    return told


def _pair_slips() -> list[tuple[str, float, str]]:
    """(kind, factor on the constant 2, what the formula does) for slips in the constant."""
    return [("kv", 1 / 2, _("counts K alone (V forgotten)")),
            ("kv", 2, _("counts K and V twice")), ("q", 3 / 2, _("caches the queries too")),
            ("unit", 8, _("counts bits, not bytes")), ("unit", 2**-20, _("gives MiB")),
            ("unit", 2**-10, _("gives KiB")), ("layers", 32, _("counts 32 layers"))]


def _slip_pairs(per: float) -> list[str]:
    """Every slip, and every pair of slips of different kinds, whose factors turn the right
    constant 2 into `per` (as mha_course.tryit.slip_readings, worded as one sentence)."""
    slips = _pair_slips()
    found = [_("it {a}").format(a=why) for _k, a, why in slips
             if math.isclose(per, 2.0 * a, rel_tol=1e-9)]
    for i, (kind_a, a, why_a) in enumerate(slips):
        for kind_b, b, why_b in slips[i + 1:]:
            if kind_a != kind_b and not math.isclose(a * b, 1.0) and \
                    math.isclose(per, 2.0 * a * b, rel_tol=1e-9):
                found.append(_("it {a}, and {b}").format(a=why_a, b=why_b))
    return list(dict.fromkeys(found))


def _judge_formula(fn: Callable[..., Any]) -> str:
    """Right if fn gives the bytes of one layer's cache at every size tried, else why not."""
    name = _name(fn)
    require_params(fn, ARGS, name)
    at_case = _call(fn, CASE)
    if at_case is None:
        return not_tried(_("make {name} return the cache's bytes for (B, h, max_len, d_k, "
                           "itemsize), then run the cell").format(name=name))
    base = _call(fn, BASE)
    if base is None:
        not_yet(_("{name} returns None at other sizes: it must return a number for any "
                  "sizes").format(name=name))
    sizes = ", ".join(f"{a} = {BASE[a]}" for a in ARGS)
    if base <= 0 or at_case <= 0:
        where = sizes if base <= 0 else _("the lesson's sizes")
        not_yet(_("{name} gives {got:g} bytes at {where}: a cache of any size takes a positive "
                  "number of bytes (a // that rounds to whole MiB?)").format(
                      name=name, got=base if base <= 0 else at_case, where=where))
    want_case, want_base = _bytes(**CASE), _bytes(**BASE)
    grown = _growth(fn, base)
    if at_case == want_case and base == want_base and all(
            math.isclose(r, 2.0, rel_tol=1e-9) for r in grown.values()):
        return right(_("2 * B * h * max_len * d_k * itemsize: K and V, checked at {n} sizes; at "
                       "the lesson's it gives {want:,} bytes").format(n=2 + len(ARGS),
                                                                      want=want_case))
    if at_case != want_case and at_case - want_case == base - want_base:
        not_yet(_("{name} is off by the same {offset:+g} bytes at every size: a term that does "
                  "not belong is added to the product").format(name=name,
                                                               offset=at_case - want_case))
    if all(math.isclose(r, 1.0, rel_tol=1e-9) for r in grown.values()):
        not_yet(_("{name} returns the same number whatever the sizes: compute the bytes from its "
                  "five arguments").format(name=name))
    for a in ARGS[:-1]:  # one size off by one at every size: max_len - 1 slots, ...
        for step in (-1, 1):
            if all(fn_at == _bytes(**{**at, a: at[a] + step}) for fn_at, at in
                   ((base, BASE), (at_case, CASE))):
                not_yet(_("{name} counts {a} {sign} 1 where {a} belongs (an off-by-one in one "
                          "size): {why}").format(name=name, a=a, sign="-" if step < 0 else "+",
                                                 why=_why(a)))
    if math.isclose(grown["itemsize"], 1.0) and all(
            math.isclose(r, 2.0) for a, r in grown.items() if a != "itemsize"):
        per_number = base / (_bytes(**BASE) / BASE["itemsize"])  # the bytes it uses, K and V
        if per_number > 0:  # a constant typed in for itemsize, maybe with V forgotten
            typed = [(k, c) for k in (2, 1) for c in (1, 2, 4, 8)
                     if math.isclose(per_number, k * c / 2)]
            fits = [_("{c} bytes a number typed in for itemsize").format(c=c) if k == 2 else
                    _("{c} bytes a number typed in for itemsize, with V forgotten (K "
                      "alone)").format(c=c) for k, c in typed]
            if fits:
                if (1, 8) in typed:  # K alone at 8 bytes: cancels at float32
                    not_yet(_("{name} does not use itemsize (it stays the same when itemsize "
                              "doubles): {fits}. K alone at 8 bytes a number equals K and V at "
                              "float32's 4, which is why the lesson's size alone could not show "
                              "it").format(name=name, fits=_("; or ").join(fits)))
                not_yet(_("{name} does not use itemsize (it stays the same when itemsize "
                          "doubles): {fits}").format(name=name, fits=_("; or ").join(fits)))
    if all(math.isclose(r, 2.0, rel_tol=0.02) for r in grown.values()) and not all(
            math.isclose(r, 2.0, rel_tol=1e-9) for r in grown.values()):  # // or int() rounds
        per = base / math.prod(BASE[a] for a in ARGS)
        said = [why for c, why in _constant_mistakes() if math.isclose(per, c, rel_tol=0.05)]
        if math.isclose(per, 2 / 8, rel_tol=0.05):
            said.append(_("it divides by 8, as if itemsize were in bits: it is the bytes of one "
                          "number already"))
        if said:
            not_yet(_("{name} rounds its result (a // or int() on the way), so it is not exactly "
                      "proportional to the sizes: and {said}").format(
                          name=name, said=_("; or ").join(said)))
        not_yet(_("{name} rounds its result (a // or int() on the way), so it is not exactly "
                  "proportional to the sizes; a byte count needs no rounding").format(name=name))
    told = _growth_story(grown)
    if told:
        text = _("{name} {said}").format(name=name, said=told[0])
        not_yet(text + "".join(_("; and it {said}").format(said=t) for t in told[1:]))
    per = base / math.prod(BASE[a] for a in ARGS)  # proportional to each size: only the constant
    said = first_match(per, _constant_mistakes(), atol=1e-12)
    if not said:  # two slips in the constant: K alone and bits, K and V twice and MiB, ...
        said = _("; or ").join(_slip_pairs(per)) or None
    if said:
        not_yet(_("{name} grows in proportion to every argument, but {said}").format(name=name,
                                                                                      said=said))
    not_yet(_("{name} grows in proportion to every argument, but {said}").format(
        name=name, said=_describe(base, want_base, _("its result"), _factors())))


def _constant_mistakes() -> list[tuple[float, str]]:
    """result / (B h max_len d_k itemsize) when only the constant in front is off, and the slip."""
    return [
        (1, _("it counts K alone (or V alone): the cache holds both")),
        (1, _("it halves the cache for the causal mask? Every later query reads all earlier keys, "
              "so each of the max_len slots keeps a key and a value")),
        (3, _("it caches the queries too: only K and V are kept, no later step needs an old "
              "query")),
        (4, _("it counts K and V twice each (itemsize is already the bytes of one number)")),
        (16, _("it counts bits: the answer is wanted in bytes (8 bits each)")),
        (64, _("it counts 32 layers: the question asks for one layer")),
        (2 / 2**20, _("it gives MiB: the answer is wanted in bytes")),
        (2 / 10**6, _("it gives MB (millions of bytes): the answer is wanted in bytes")),
        (2 / 2**10, _("it gives KiB: the answer is wanted in bytes")),
        (2 / 10**3, _("it gives kB (thousands of bytes): the answer is wanted in bytes")),
        (2 / 2**30, _("it gives GiB: the answer is wanted in bytes")),
    ]


@self_check
def check_cache_formula(my_cache_bytes: Any) -> str:
    """Say right if my_cache_bytes(B, h, max_len, d_k, itemsize) counts one layer's cache at
    every size tried, else which argument or factor it gets wrong."""
    if my_cache_bytes is None:
        return not_tried(_("write `my_cache_bytes(B, h, max_len, d_k, itemsize)` returning the "
                           "bytes of one layer's cache"))
    if not callable(my_cache_bytes):
        not_yet(_("my_cache_bytes must be a function of (B, h, max_len, d_k, itemsize), got "
                  "{kind}: the number for the lesson's sizes goes in `answer`, checked by "
                  "check_cache_bytes").format(kind=type(my_cache_bytes).__name__))
    return _judge_formula(my_cache_bytes)
