"""Self-check for the Try-it of 19_attention_across_devices.ipynb: the bytes a ring rank sends.

The student writes `ring_bytes(B, h, T, W, d_k, itemsize)`: the bytes of K and V one rank sends
in one whole forward pass of ring attention (positions left out). The check runs it under the
grading guard (`parallel.ring_bytes_per_step` is the package's, not theirs) at the lesson's sizes,
names the usual slips (every slip that gives the same number), and then at other sizes, one
argument changed at a time: two slips that cancel at the lesson's sizes (K alone, counted in
float64 bytes) or a number typed for one size show there as an argument the bytes do not follow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mha_course.i18n import _
from mha_course.tryit import (
    NotYet,
    all_matches,
    as_number,
    describe_number,
    first_match,
    not_tried,
    not_yet,
    right,
    run_student,
    self_check,
    words_of,
)

SIZES = ("B", "h", "T", "W", "d_k", "itemsize")
OTHER = dict(B=2, h=4, T=2048, W=8, d_k=128, itemsize=2)
"""Each argument's second value: the check changes one at a time (T and W stay divisible)."""


def _rule() -> str:
    """What the grading guard says when the package's ring_bytes_per_step made the answer."""
    return _("count the bytes yourself from the block shapes; parallel.ring_bytes_per_step is the "
             "package's (and it counts the positions too)")


def _want(B: int, h: int, T: int, W: int, d_k: int, itemsize: int) -> int:
    """(W - 1) steps, each sending K and V blocks of (B, h, T / W, d_k), itemsize bytes a number."""
    return (W - 1) * 2 * B * h * (T // W) * d_k * itemsize


def _mistakes(B: int, h: int, T: int, W: int, d_k: int, itemsize: int) -> list[tuple[int, str]]:
    """(bytes a usual slip gives, what the slip is), at these sizes."""
    block = B * h * (T // W) * d_k  # numbers in one rank's K block (B, h, T / W, d_k)
    step = 2 * block * itemsize  # K and V
    want = (W - 1) * step
    return [
        (step, _("that is one step: a rank passes blocks on at W - 1 steps (it keeps the last "
                 "one)")),
        (W * step, _("that counts W steps: after W - 1 sends every rank has seen every block, so "
                     "the last block is not sent on")),
        ((W - 1) * block * itemsize, _("that is K alone (or V alone): each step sends both")),
        (want // 2, _("that halves it for the causal mask: a ring rank passes every block on, even "
                      "one its queries skip, because the next rank may need it")),
        (2 * want // W, _("that is the Ulysses formula (2 / W of the ring's bytes): the question "
                          "is the ring's, where K and V blocks travel round, one hop per step")),
        ((W - 1) * 2 * block, _("that counts numbers, not bytes: multiply by the bytes of one "
                                "number")),
        ((W - 1) * 2 * block * 8, _("that is 8 bytes per number (float64); here a number takes "
                                    "{itemsize}").format(itemsize=itemsize)),
        (2 * want, _("that counts what a rank receives as well as what it sends: the question is "
                     "what it sends")),
        ((W - 1) * W * step, _("that forgot /W: a rank holds only its T / W tokens' keys and "
                               "values, not the whole sequence's")),
        (W * want, _("that is the whole ring's bytes, summed over the W ranks: the question is "
                     "what one rank sends")),
        (W * W * step, _("that forgot /W and counts W steps")),
        ((W - 1) * 3 * block * itemsize, _("that sends Q too: in a ring the queries stay put; "
                                           "only K and V travel")),
        (want + (W - 1) * (T // W) * 8, _("that includes our implementation's int64 positions; "
                                          "the exercise counts K and V only")),
        (want * 8, _("that is bits: the answer is wanted in bytes (8 bits each)")),
        (want // 2**20, _("that is MiB: the answer is wanted in bytes")),
        (want // 2**10, _("that is KiB: the answer is wanted in bytes")),
    ]


def _factors(W: int, itemsize: int) -> dict[str, float]:
    """Named factors for describe_number: what a slip multiplies or divides by."""
    return {_("W (the ranks)"): W, _("2 (K and V)"): 2,
            _("the itemsize ({itemsize} bytes)").format(itemsize=itemsize): itemsize,
            _("W - 1 (the steps that send)"): W - 1, _("8 (bits per byte)"): 8}


def _several(got: int, sizes: dict[str, int]) -> bool:
    """True when two or more listed slips give this number (the function would tell which)."""
    return len(all_matches(got, [(v, why) for v, why in _mistakes(**sizes) if v > 0])) > 1


def _judge_number(got: int, sizes: dict[str, int], what: str) -> None:
    """NotYet naming the slip (or how the number relates to the right one), if it is wrong."""
    want = _want(**sizes)
    if got == want:
        return
    named = first_match(got, [(v, why) for v, why in _mistakes(**sizes) if v > 0])
    if named:
        not_yet(_("{what}: {named}").format(what=what, named=named))
    if pair := _pairs([(sizes, got)], most=2):
        not_yet(_("{what}: this number fits {pair} (pass your function ring_bytes to the check to "
                  "tell which)").format(what=what, pair=pair))
    said = describe_number(got, want, _("your answer"), _factors(sizes["W"], sizes["itemsize"]))
    not_yet(_("{what}: {said}. Count the steps that send, the tensors each step sends, the numbers "
              "in one rank's block and the bytes of one number").format(what=what, said=said))


def _call(fn: Callable, sizes: dict[str, int]) -> int | None:
    """fn(**sizes) under the grading guard, as a whole number; an error in it is named with its line."""
    name = getattr(fn, "__name__", "function")
    args = ", ".join(f"{k}={v}" for k, v in sizes.items())
    out = run_student(fn, *sizes.values(), said_as=f"{name}({args})", rule=_rule())
    return None if out is None else as_number(out, f"{name}({args})", integer=True)


def _probes(sizes: dict[str, int]) -> list[tuple[str, dict[str, int]]]:
    """(the argument changed, the sizes) for each argument changed alone to a second value."""
    out = []
    for key in SIZES:
        other = dict(sizes, **{key: OTHER[key] if OTHER[key] != sizes[key] else 2 * sizes[key]})
        if other["T"] % (2 * other["W"]) == 0:  # whole blocks (and zigzag halves) per rank
            out.append((key, other))
    return out


def _scalings(B: int, h: int, T: int, W: int, d_k: int, itemsize: int) -> list[tuple[str, float, str]]:
    """(what it counts wrong, factor on the right bytes, the slip) for slips that multiply the bytes.

    Slips of different kinds (steps, tensors, units, tokens) combine; two of one kind do not.
    """
    return [("steps", 1 / (W - 1), _("one step counted (a rank sends at W - 1 steps)")),
            ("steps", W / (W - 1), _("W steps counted (the last block is not sent on)")),
            ("tensors", 1 / 2, _("K alone (each step sends both K and V)")),
            ("tensors", 3 / 2, _("Q sent too (queries stay put)")),
            ("units", 1 / itemsize, _("numbers counted, not bytes")),
            ("units", 8 / itemsize, _("8 bytes per number (float64)")),
            ("units", 8, _("bits, not bytes")),
            ("tokens", W, _("the /W forgotten (a rank holds T / W tokens)"))]


def _pair_fits(values: list[tuple[dict[str, int], int]]) -> list[str]:
    """Each pair of slips of different kinds that together gives the answer at all these sizes."""
    tables = [_scalings(**sizes) for sizes, _n in values]
    n = len(tables[0])
    fits = []
    for i in range(n):
        for j in range(i + 1, n):
            if tables[0][i][0] != tables[0][j][0] and all(
                    abs(got - _want(**s) * t[i][1] * t[j][1]) <= 1e-9 * _want(**s)
                    for t, (s, got) in zip(tables, values, strict=True)):
                fits.append(_("{a}, and {b}").format(a=tables[0][i][2], b=tables[0][j][2]))
    return fits


def _pairs(values: list[tuple[dict[str, int], int]], most: int = 3) -> str | None:
    """Two slips of different kinds that together give the answer at every one of these sizes."""
    fits = _pair_fits(values)
    if not fits:
        return None
    return _("two slips together: {fits}").format(fits=_("; or ").join(fits[:most]))


def _named(values: list[tuple[dict[str, int], int]]) -> str | None:
    """Every listed slip that gives the function's bytes at all these sizes, named; else two
    multiplying slips together; or None."""
    table = [_mistakes(**sizes) for sizes, _n in values]
    fits = [why for i, (_v, why) in enumerate(table[0])
            if all(t[i][0] == got and t[i][0] > 0 for t, (_s, got) in zip(table, values, strict=True))]
    return first_match(0, [(0, why) for why in fits]) or _pairs(values)  # each that fits


def _judge_function(fn: Callable, sizes: dict[str, int]) -> str:
    """Right at the lesson's sizes and whenever one argument changes; else the slip, or the argument."""
    name = getattr(fn, "__name__", _("your function"))
    got = _call(fn, sizes)
    if got is None:
        return not_tried(_("your {name} returns None (the placeholder, or a missing `return`): "
                           "return the bytes as a number").format(name=name))
    values = [(sizes, got)]
    for key, other in _probes(sizes):
        value = _call(fn, other)
        if value is None:
            not_yet(_("your {name} returns None when only {key} changes ({key} = {before} -> "
                      "{after})").format(name=name, key=key, before=sizes[key], after=other[key]))
        values.append((other, value))
    if all(v == _want(**s) for s, v in values):
        return right(_("{steps} steps of K and V blocks (B, h, T / W, d_k), itemsize bytes each: "
                       "{got:,} bytes at the lesson's sizes, and right when any one size "
                       "changes").format(steps=sizes["W"] - 1, got=got))
    if got != _want(**sizes):
        not_yet(_named(values) or _unlisted(values))
    key, other, value = next((k, s, v) for (k, _s), (s, v) in zip(_probes(sizes), values[1:],
                                                                    strict=True) if v != _want(**s))
    before, after = sizes[key], other[key]
    fits = _pair_fits(values)  # two slips that cancel at the lesson's sizes, e.g. K alone at 8 bytes
    if fits:
        why = _(". That fits two slips that cancel at the lesson sizes: {fits}; or a number typed "
                "in place of {key}").format(fits=_("; or ").join(fits[:3]), key=key)
    else:
        why = _typed(key)
    if value == got:
        not_yet(_("right at the lesson's sizes, but when only {key} changes ({key} = {before} -> "
                  "{after}) your {name} gives the same bytes: it does not use {key}{why}").format(
                      key=key, before=before, after=after, name=name, why=why))
    ratio = describe_number(value, _want(**other), _("yours"))
    not_yet(_("right at the lesson's sizes, but not when only {key} changes ({key} = {before} -> "
              "{after}): {ratio}. The bytes must follow {key} through your formula{why}").format(
                  key=key, before=before, after=after, ratio=ratio, why=why))


def _unlisted(values: list[tuple[dict[str, int], int]]) -> str:
    """How a function no listed slip fits is off: a constant factor, a constant offset, or which
    arguments its ratio to the right bytes moves with (where the slip sits)."""
    base, got = values[0]
    want = _want(**base)
    ratios = [v / _want(**s) for s, v in values]
    if all(abs(r - ratios[0]) <= 1e-9 * abs(ratios[0]) for r in ratios):
        said = describe_number(got, want, _("your answer"),
                               {_("2 (K and V)"): 2, _("8 (bits per byte)"): 8})
        return _("at the lesson's sizes {said}, and by the same factor at every size: one "
                 "constant factor is wrong (the tensors each step sends, or a unit), not a "
                 "size").format(said=said)
    if len({v - _want(**s) for s, v in values}) == 1:
        return _("your bytes are {offset:+,} away from the right ones, the same at every size: "
                 "something is added that does not belong (or left out)").format(offset=got - want)
    moved = [key for key in SIZES for s, r in zip((s for s, _v in values[1:]), ratios[1:], strict=True)
             if s[key] != base[key] and abs(r - ratios[0]) > 1e-9 * abs(ratios[0])]
    said = describe_number(got, want, _("your answer"))
    return _("at the lesson's sizes {said}; the ratio to the right bytes changes when only "
             "{moved} changes: the slip is in how your formula uses {used}").format(
                 said=said, moved=_(" or ").join(moved), used=_(" and ").join(moved))


def _typed(key: str) -> str:
    """What a slip in one argument usually is."""
    if key == "itemsize":
        return _(" (a number typed for float32 or float64 in place of itemsize?)")
    if key == "W":
        return _(" (the lesson's W = 4 or T / 4 typed in?)")
    if key == "T":
        return _(" (the lesson's T or T / W typed in?)")
    return _(" (a number typed in?)")


@self_check
def check_ring_bytes(answer: Any, B: int = 1, h: int = 8, T: int = 4096, W: int = 4, d_k: int = 64,
                     itemsize: int = 4) -> str:
    """Your ring_bytes(B, h, T, W, d_k, itemsize): the K and V bytes one ring rank sends in a forward pass."""
    if answer is None:
        return not_tried(_("replace None with your function ring_bytes(B, h, T, W, d_k, itemsize)"))
    sizes = dict(B=B, h=h, T=T, W=W, d_k=d_k, itemsize=itemsize)
    if callable(answer):
        return _judge_function(answer, sizes)
    got = as_number(answer, _("the bytes sent"), integer=True)
    what = _("at the lesson's sizes")
    try:
        _judge_number(got, sizes, what)
    except NotYet as verdict:
        if _several(got, sizes):
            not_yet(_("{said} (pass your function ring_bytes to the check to tell which)").format(
                said=words_of(str(verdict))))
        raise
    not_yet(_("that number is right at the lesson's sizes; the Try-it asks for the function, "
              "ring_bytes(B, h, T, W, d_k, itemsize), because one number can hide two slips that "
              "cancel (K alone counted in float64 bytes gives it too): put your formula in a def "
              "and pass the function"))
