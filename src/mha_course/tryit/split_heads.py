"""Self-check for the Try-it of 03_split_heads.ipynb: when is merge_no_transpose harmless?"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from mha import steps
from mha_course import planted
from mha_course.i18n import _
from mha_course.tryit import (
    NotYet,
    first_match,
    guarded,
    joined,
    not_tried,
    not_yet,
    right,
    self_check,
)

Shape = tuple[int, int, int, int]  # (B, T, d_model, h)

# Shapes that tell the usual rules apart: one token, one head, both, neither; B = 1 and not;
# T == h; d_k = 1 (d_model == h).
SHAPES: tuple[Shape, ...] = (
    (2, 1, 8, 4), (2, 5, 8, 1), (2, 5, 8, 4), (1, 2, 2, 2), (3, 4, 6, 3), (1, 1, 4, 2),
    (4, 3, 12, 1), (1, 3, 6, 2), (1, 1, 4, 1), (3, 1, 6, 6), (2, 4, 4, 4), (1, 6, 12, 1),
    (1, 4, 8, 2), (2, 3, 9, 3),
)

# Typical wrong rules, each with why it is wrong (phrased without giving the rule away).
def _mistakes() -> tuple[tuple[Callable[[int, int, int, int], bool], str], ...]:
    """Typical wrong rules, each with why it is wrong (phrased without giving the rule away)."""
    return (
        (lambda B, T, d_model, h: True,
         _("your rule says the bug is always harmless (True for every shape the module accepts), "
           "but the round trip is wrong for most shapes. A condition every valid shape meets, "
           "such as d_model % h == 0 (needed for the split itself), cannot tell the harmless "
           "shapes apart.")),
        (lambda B, T, d_model, h: False,
         _("your rule says the bug always matters, but some shapes give x back exactly.")),
        (lambda B, T, d_model, h: h == 1,
         _("your rule covers the shapes with one head but not all the exact ones: look at the T "
           "of the shapes it gets wrong; what does swapping the h and T axes do when T has "
           "length 1?")),
        (lambda B, T, d_model, h: T == 1,
         _("your rule covers the shapes with one token but not all the exact ones: look at the h "
           "of the shapes it gets wrong; what does swapping the h and T axes do when h has "
           "length 1?")),
        (lambda B, T, d_model, h: T == 1 and h == 1,
         _("your rule asks for one token and one head at once: does swapping the h and T axes "
           "need both of them to have length 1 before it reorders nothing?")),
        (lambda B, T, d_model, h: B == 1,
         _("your rule depends on B, but B is an outer axis the skipped transpose never touches: "
           "each sequence is merged on its own.")),
        (lambda B, T, d_model, h: d_model == h,
         _("your rule depends on d_k (d_model == h means d_k = 1), but the skipped transpose "
           "swaps the h and T axes, not d_k.")),
        (lambda B, T, d_model, h: T == h,
         _("your rule asks for T == h, but swapping two axes of equal length > 1 still reorders "
           "the numbers (a square matrix and its transpose differ).")),
    )


def _measured(shape: Shape) -> bool:
    """Whether merge_no_transpose(split_heads(x)) gives x back exactly for this shape."""
    B, T, d_model, h = shape
    x = np.random.default_rng(1).normal(size=(B, T, d_model))  # (B, T, d_model)
    merged = planted.merge_no_transpose(steps.split_heads(x, h))  # (B, h, T, d_k) -> (B, T, d_model)
    return bool(np.array_equal(merged, x))


# Pairs of shapes that differ in one number the round trip does not depend on: a rule that
# answers them differently depends on that number.
PROBES: dict[str, tuple[tuple[Shape, Shape], ...]] = {
    "B": (((1, 3, 6, 2), (4, 3, 6, 2)), ((1, 1, 4, 2), (3, 1, 4, 2)), ((1, 4, 8, 1), (5, 4, 8, 1))),
    "d_model": (((2, 3, 6, 3), (2, 3, 12, 3)), ((2, 3, 6, 2), (2, 3, 2, 2)),
                ((2, 1, 8, 4), (2, 1, 4, 4)), ((2, 5, 3, 1), (2, 5, 8, 1))),
}


def _apply(rule: Callable[..., Any], shape: Shape) -> bool:
    """rule(*shape) as a bool (under the grading guard), or NotYet saying what it did instead."""
    try:
        said = guarded(rule, *shape, rule=_("my_rule must be a rule about the four numbers, not "
                                            "a run of the round trip"))
    except NotYet:
        raise
    except Exception as e:  # noqa: BLE001 - the student's code: report, do not crash
        not_yet(_("my_rule{shape} raised {error}: {text}; my_rule must take the four numbers "
                  "(B, T, d_model, h) and return True or False").format(
            shape=shape, error=type(e).__name__, text=e))
    if said is None:
        not_yet(_("my_rule{shape} returned None: return True where the bug is harmless, False "
                  "elsewhere").format(shape=shape))
    try:
        value = np.asarray(said.detach().cpu() if hasattr(said, "detach") else said)  # torch too
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        value = np.asarray(None)
    if value.shape == () and value.dtype == np.bool_:
        return bool(value)  # True, np.True_, a 0-d boolean array or tensor
    if value.shape == () and value.dtype.kind in "iu" and int(value) in (0, 1):
        return bool(value)  # 1 / 0 read as True / False
    not_yet(_("my_rule{shape} must return True or False, got {kind} {answer!r:.40}").format(
        shape=shape, kind=type(said).__name__, answer=said))


def _disagreements(mine: list[bool], measured: list[bool], shapes: tuple[Shape, ...]) -> str:
    """The shapes where the rule and the measured round trip disagree, as a sentence."""
    parts = [(_("{shape} the round trip is exact, your rule says {said}") if m else
              _("{shape} the round trip is wrong, your rule says {said}")).format(shape=s, said=r)
             for s, r, m in zip(shapes, mine, measured, strict=True) if r != m]
    if len(parts) > 4:
        return _("(B, T, d_model, h) = {parts}; and {n} more").format(parts=joined(parts[:4]),
                                                                      n=len(parts) - 4)
    return _("(B, T, d_model, h) = {parts}").format(parts=joined(parts))


def _depends(rule: Callable[..., Any]) -> str:
    """' Your rule changes its answer when only B changes: ...' or ''."""
    for name, pairs in PROBES.items():
        for a, b in pairs:
            ra, rb = _apply(rule, a), _apply(rule, b)
            if ra != rb:
                return _(" Your rule also changes its answer when only {name} changes: {a} -> "
                         "{ra}, {b} -> {rb}; the skipped transpose never touches {name}, so the "
                         "round trip is the same for both.").format(name=name, a=a, ra=ra, b=b,
                                                                     rb=rb)
    return ""


def _too_broad_or_narrow(mine: list[bool], measured: list[bool]) -> str:
    """How many shapes the rule calls harmless wrongly, and how many exact ones it misses."""
    broad = sum(r and not m for r, m in zip(mine, measured, strict=True))
    narrow = sum(m and not r for r, m in zip(mine, measured, strict=True))
    said = []
    if broad:
        said.append((_("calls {n} shape harmless where the round trip is wrong") if broad == 1
                     else _("calls {n} shapes harmless where the round trip is wrong")).format(
            n=broad))
    if narrow:
        said.append((_("misses {n} shape where it is exact") if narrow == 1
                     else _("misses {n} shapes where it is exact")).format(n=narrow))
    if len(said) == 2:
        return _("your rule {this} and {that}").format(this=said[0], that=said[1])
    return _("your rule {this}").format(this=said[0])


_ROLE = {"b": 0, "batch": 0, "t": 1, "seq": 1, "seq_len": 1, "n": 1, "d_model": 2, "d": 2,
         "dm": 2, "c": 2, "h": 3, "heads": 3, "n_heads": 3, "nh": 3}


def _order_of(rule: Callable) -> tuple[int, ...] | None:
    """The order its parameter names put (B, T, d_model, h) in, if not the lesson's; else None."""
    try:
        names = [p.lower() for p in inspect.signature(rule).parameters][:4]
    except (TypeError, ValueError):
        return None
    roles = tuple(_ROLE.get(n, -1) for n in names)
    if sorted(roles) != [0, 1, 2, 3] or roles == (0, 1, 2, 3):
        return None
    return roles


@self_check
def check_harmless_rule(my_rule: Any, shapes: tuple[Shape, ...] = SHAPES) -> str:
    """Say right, or where the rule for 'merge_no_transpose is harmless' disagrees, and why."""
    if my_rule is None:
        return not_tried(_("write my_rule, a function of (B, T, d_model, h) that returns True "
                           "where merge_no_transpose is harmless, then run this cell"))
    if not callable(my_rule):
        not_yet(_("my_rule must be a function of (B, T, d_model, h), got {kind} "
                  "{answer!r:.60}").format(kind=type(my_rule).__name__, answer=my_rule))
    measured = [_measured(s) for s in shapes]
    mine = [_apply(my_rule, s) for s in shapes]
    if mine == measured:
        return right(_("your rule matches the measured round trip on all {n} shapes: the "
                       "skipped transpose swaps the h and T axes, which reorders nothing when "
                       "one of them has length 1").format(n=len(shapes)))
    where = _disagreements(mine, measured, shapes)
    order = _order_of(my_rule)  # parameters written in another order, as their names say
    if order is not None and [_apply(my_rule, tuple(s[i] for i in order)) for s in shapes] \
            == measured:
        names = ", ".join(("B", "T", "d_model", "h")[i] for i in order)
        not_yet(_("your rule's parameters are in another order: it gives the right answer when "
                  "called as my_rule({names}), but the check (like the lesson) calls "
                  "my_rule(B, T, d_model, h)").format(names=names))
    why = first_match(np.array(mine), [([bool(w(*s)) for s in shapes], why)
                                       for w, why in _mistakes()])
    if why is not None:
        not_yet(_("{why} It disagrees at {where}").format(why=why, where=where))
    not_yet(_("{said}: at {where}.{depends} What do the shapes where the bug is harmless have in "
              "common? The transpose it skips swaps the h and T axes").format(
        said=_too_broad_or_narrow(mine, measured), where=where, depends=_depends(my_rule)))
