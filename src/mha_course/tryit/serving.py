"""Self-checks for the Try-it of 18_serving.ipynb: where a token lands in a paged cache, and how
many blocks requests that share a prompt take.

The student writes two functions; each check runs one under the grading guard (the package's
`BlockPool` is what it compares with, not their work) on the lesson's example and on others, so
numbers typed for one example are not the rule:

- `my_slot(t, table, block_size) -> (block, offset)`: the physical block of the pool that holds
  token t of a sequence with this block table, and the token's slot inside that block;
- `my_blocks(prefix_len, new_tokens, block_size) -> int`: the blocks in use once a parent sequence
  holding a prompt of prefix_len tokens is forked into one request per entry of new_tokens and
  request i appends new_tokens[i] tokens; the parent stays, the forks share its blocks, and a
  request that appends into the shared, partly filled last block copies it first (copy-on-write).

Each check names every usual slip that fits the function's answers on all the examples, and
otherwise says where they first go wrong, without showing the right numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from mha_course.i18n import _
from mha_course.tryit import (
    NotYet,
    describe_number,
    first_match,
    not_tried,
    not_yet,
    read_array,
    require_params,
    right,
    run_student,
    self_check,
    where_in_students_code,
)


def _rule() -> str:
    """What the grading guard says when the package's BlockPool made the answer."""
    return _("work it out yourself from the block table and the block size; the package's "
             "BlockPool is what the check compares with")


def _student_raised(err: NotYet) -> bool:
    """True when run_student's NotYet reports an error the student's code raised (not the grading
    guard, not a call with the wrong parameters): the error it was raised while handling."""
    from mha_course import integrity  # the course's guard; imported late to keep this module light

    cause = err.__context__
    return isinstance(cause, Exception) and not isinstance(cause, NotYet | integrity.ReferenceUsed) \
        and where_in_students_code(cause.__traceback__) is not None


# --- my_slot(t, table, block_size) -> (block, offset) ------------------------------------------

SLOT_ARGS = ("t", "table", "block_size")
OTHER_TABLES: tuple[tuple[tuple[int, ...], int], ...] = (((3, 0), 2), ((2, 7, 5, 1), 3),
                                                         ((5,), 5), ((9, 8, 7), 1))
"""(table, block_size) the function must also get right: every token of each such sequence."""


def _slot(t: int, table: Sequence[int], block_size: int) -> tuple[int, int]:
    """Token t sits in logical block t // block_size, which the table maps to a physical block."""
    return table[t // block_size], t % block_size


def _slot_mistakes() -> list[tuple[Callable[[int, Sequence[int], int], tuple[int, int]], str]]:
    """(a usual slip's rule, what the slip is), in the learner's language."""
    return [
        (lambda t, tb, bs: (t // bs, t % bs),
         _("that is the logical block, t // block_size (the block's place in the sequence): the "
           "block table says which physical block of the pool holds it")),
        (lambda t, tb, bs: (t % bs, tb[t // bs]),
         _("block and offset are swapped: return (block, offset)")),
        (lambda t, tb, bs: (tb[(t - 1) // bs], (t - 1) % bs),
         _("that counts the tokens from 1: token t is at position t, and position 0 is the first "
           "slot of the first block")),
        (lambda t, tb, bs: (tb[t // bs], t % bs + 1),
         _("the offset counts from 1: the slots inside a block are 0 .. block_size - 1")),
        (lambda t, tb, bs: (tb[t // bs - 1], t % bs),
         _("one block early: token t is in logical block t // block_size (tokens 0 .. "
           "block_size - 1 in block 0), no - 1")),
        (lambda t, tb, bs: (tb[t // bs], t - tb[t // bs] * bs),
         _("the offset is worked out from the physical block number: it is the token's place "
           "inside its block, the same whichever physical block holds it")),
        (lambda t, tb, bs: (tb[t // bs], t),
         _("the offset is the token's position in the sequence: it is its slot inside the block, "
           "0 .. block_size - 1")),
        (lambda t, tb, bs: (tb[t // len(tb)], t % len(tb)),
         _("that divides by the table's length: a block holds block_size tokens, so divide by "
           "block_size")),
        (lambda t, tb, bs: (tb[-(-t // bs)], t % bs),
         _("the block number is rounded up: token t is in logical block t // block_size, rounded "
           "down")),
    ]


def _index_hint(text: str) -> str:
    """What an IndexError in my_slot most likely means."""
    if "index" in text and "range" in text:  # Python's own words, English in both editions
        return _("an index past the end of the table: token t sits in logical block "
                 "t // block_size (rounded down), and that is below len(table) for every token the "
                 "sequence holds")
    return ""


def _read_slot(out: Any, said_as: str, t: int, table: Sequence[int], block_size: int,
               ) -> tuple[int, int]:
    """The answer as a pair of whole numbers, or NotYet saying what arrived."""
    if out is None:
        not_yet(_("{said_as} returns None: return the pair (block, offset)").format(
            said_as=said_as))
    if isinstance(out, str | bytes):
        not_yet(_("{said_as} must return the pair (block, offset), got text {out!r:.40}").format(
            said_as=said_as, out=out))
    got = read_array(out, _("{said_as} must return the pair (block, offset)").format(
        said_as=said_as))
    if got.dtype == object or got.dtype.kind not in "iuf" or got.size and got.dtype.kind == "b":
        not_yet(_("{said_as} must return two whole numbers (block, offset), got {kind} of "
                  "{dtype}").format(said_as=said_as, kind=type(out).__name__, dtype=got.dtype))
    if got.shape == ():
        flat = table[t // block_size] * block_size + t % block_size
        if float(got) == flat:
            not_yet(_("that is the slot's flat number, block * block_size + offset (where it sits "
                      "in the pool's (n_blocks, block_size) arrays flattened): return the pair "
                      "(block, offset)"))
        not_yet(_("{said_as} must return two numbers, (block, offset), got one number").format(
            said_as=said_as))
    if got.shape != (2,):
        not_yet(_("{said_as} must return two numbers, (block, offset), got shape {shape}").format(
            said_as=said_as, shape=got.shape))
    if got.dtype.kind == "f" and not (got == got.round()).all():
        not_yet(_("{said_as} must return whole numbers (block, offset), got {got}").format(
            said_as=said_as, got=got.tolist()))
    return int(got[0]), int(got[1])


def _slot_cases(table: Sequence[int], block_size: int) -> list[tuple[int, tuple[int, ...], int]]:
    """(t, table, block_size) for every token of the lesson's sequence, then of the others."""
    cases = [(t, tuple(table), block_size) for t in range(len(table) * block_size)]
    for tb, bs in OTHER_TABLES:
        cases += [(t, tb, bs) for t in range(len(tb) * bs)]
    return cases


def _rule_outputs(rule: Callable, cases: list[tuple[int, tuple[int, ...], int]]) -> list | None:
    """A slip's answers on every case, or None where it cannot run (it would raise)."""
    try:
        return [tuple(int(v) for v in rule(t, list(tb), bs)) for t, tb, bs in cases]
    except (IndexError, ZeroDivisionError):
        return None


def _name(fn: Callable) -> str:
    """The student's function's name, or 'function' for a lambda."""
    name = getattr(fn, "__name__", "")
    return name if name.isidentifier() else _("function")


def _raises(rule: Callable, t: int, table: Sequence[int], block_size: int) -> bool:
    """True when a slip's rule cannot place token t (it runs off the table)."""
    try:
        rule(t, list(table), block_size)
    except (IndexError, ZeroDivisionError):
        return True
    return False


def _table_words(table: Sequence[int], block_size: int) -> str:
    return _("table {table}, block size {block_size}").format(table=list(table),
                                                             block_size=block_size)


def _judge_slot(fn: Callable, table: Sequence[int], block_size: int) -> str:
    """Right only if fn places every token of the lesson's sequence and of the others."""
    name = _name(fn)
    require_params(fn, SLOT_ARGS, name)
    cases = _slot_cases(table, block_size)
    mistakes = _slot_mistakes()
    got = []
    for i, (t, tb, bs) in enumerate(cases):
        said_as = _("for t = {t}, {table}, your {name}").format(t=t, table=_table_words(tb, bs),
                                                                 name=name)
        try:
            out = run_student(fn, t, list(tb), bs, said_as=said_as, hint=_index_hint,
                              rule=_rule())
        except NotYet as raised:  # a slip that runs off the table raises where the rule does
            named = [why for rule, why in mistakes
                     if _rule_outputs(rule, cases[:i]) == got and _raises(rule, *cases[i])]
            if named and _student_raised(raised):
                not_yet(first_match(0, [(0, why) for why in named]))
            raise
        if i == 0 and out is None:
            return not_tried(_("your {name} returns None (the placeholder, or a missing "
                               "`return`): return the pair (block, offset)").format(name=name))
        got.append(_read_slot(out, said_as, t, tb, bs))
    want = [_slot(t, tb, bs) for t, tb, bs in cases]
    if got == want:
        return right(_("block table[t // block_size], offset t % block_size: every token of the "
                       "lesson's sequence and of {n} others lands where the pool keeps it").format(
                           n=len(OTHER_TABLES)))
    named = [why for rule, why in mistakes if _rule_outputs(rule, cases) == got]
    if named:
        not_yet(first_match(0, [(0, why) for why in named]))
    n_lesson = len(table) * block_size
    if got[:n_lesson] == want[:n_lesson]:
        k = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        t, tb, bs = cases[k]
        lesson = _rule_outputs(lambda t_, tb_, bs_: _slot(t_, table, block_size), cases[n_lesson:])
        if lesson is not None and lesson == got[n_lesson:]:
            not_yet(_("your {name} is right for the lesson's sequence but answers as if every "
                      "sequence had its table and block size: it must compute the slot from its "
                      "arguments, not from numbers written for one table").format(name=name))
        not_yet(_("your {name} is right for the lesson's sequence but not for {table} (first at "
                  "t = {t}): {part}").format(name=name, table=_table_words(tb, bs), t=t,
                                             part=_which_part(got[k], want[k])))
    k = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
    t, tb, bs = cases[k]
    blocks_ok = all(g[0] == w[0] for g, w in zip(got, want, strict=True))
    offsets_ok = all(g[1] == w[1] for g, w in zip(got, want, strict=True))
    overall = (_(" (your blocks are right for every token)") if blocks_ok else
               _(" (your offsets are right for every token)") if offsets_ok else "")
    not_yet(_("the first token that lands in the wrong place is t = {t} of the lesson's sequence "
              "({table}): {part}{overall}").format(t=t, table=_table_words(tb, bs),
                                                   part=_which_part(got[k], want[k]),
                                                   overall=overall))


def _which_part(got: tuple[int, int], want: tuple[int, int]) -> str:
    """Which of block and offset is wrong, without the right values."""
    if got[0] != want[0] and got[1] != want[1]:
        return _("both the block and the offset are wrong")
    if got[0] != want[0]:
        return _("the offset is right, the block is not: look the logical block t // block_size "
                 "up in the table")
    return _("the block is right, the offset is not: it is the token's slot inside its block")


@self_check
def check_token_slot(my_slot: Any, table: Sequence[int] = (6, 3, 4), block_size: int = 4) -> str:
    """Your `my_slot(t, table, block_size)` -> (block, offset), for every token of the lesson's
    sequence and of others."""
    if my_slot is None:
        return not_tried(_("write my_slot(t, table, block_size) returning the pair (block, offset) "
                           "and pass the function"))
    if not callable(my_slot):
        not_yet(_("pass the function my_slot itself (check_token_slot(my_slot)), not its result: "
                  "got {kind}; the check calls it for every token t").format(
                      kind=type(my_slot).__name__))
    return _judge_slot(my_slot, table, block_size)


# --- my_blocks(prefix_len, new_tokens, block_size) -> blocks in use ----------------------------

BLOCK_ARGS = ("prefix_len", "new_tokens", "block_size")
OTHER_WORKLOADS: tuple[tuple[int, tuple[int, ...], int], ...] = (
    (8, (3, 5), 4), (13, (2, 9), 8), (5, (1, 1, 1, 1), 2), (16, (1, 16, 17), 16), (3, (1,), 4),
    (1, (7, 2), 3), (12, (4, 4), 6))
"""(prefix_len, new_tokens, block_size) the function must also get right: prompts that fill their
last block exactly and ones that do not, requests that stay in the copied block and ones that leave it."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _blocks(P: int, new: Sequence[int], bs: int) -> int:
    """The parent's ceil(P / bs) blocks, then per request the blocks its tokens take after the
    shared prompt's last P % bs tokens (a copy of the partly filled block counts as one of them)."""
    return _ceil(P, bs) + sum(_ceil(P % bs + n, bs) for n in new)


def _free_slots(P: int, bs: int) -> int:
    return (bs - P % bs) % bs


def _block_mistakes() -> list[tuple[Callable[[int, Sequence[int], int], int], str]]:
    """(a usual slip's count, what the slip is), in the learner's language."""
    return [
        (lambda P, new, bs: _ceil(P, bs) + sum(_ceil(P + n, bs) for n in new),
         _("that gives every request its own copy of the prompt: a fork points at the parent's "
           "blocks (their refcount goes up), it takes no new blocks for the shared prefix")),
        (lambda P, new, bs: sum(_ceil(P + n, bs) for n in new),
         _("that gives every request its own copy of the prompt and leaves out the parent: the "
           "forks share the parent's blocks, so the prompt is held once")),
        (lambda P, new, bs: _ceil(P, bs) + sum(_ceil(max(0, n - _free_slots(P, bs)), bs)
                                               for n in new),
         _("that counts the free slots of the shared, partly filled last block as room for every "
           "request: a request that appends into a shared block copies it first (copy-on-write), "
           "and the copy is a block of its own")),
        (lambda P, new, bs: _ceil(P, bs) + sum((1 if P % bs else 0) + _ceil(n, bs) for n in new),
         _("that counts the copy-on-write copy as an empty block on top of the new tokens' "
           "blocks: the copy holds the prompt's last prefix_len % block_size tokens, and its free "
           "slots take the request's first new tokens")),
        (lambda P, new, bs: _ceil(P, bs) + sum(_ceil(n, bs) for n in new),
         _("that puts each request's new tokens in fresh blocks and leaves out the copy of the "
           "shared, partly filled last block: appending into it copies it (copy-on-write), and "
           "the copy carries the prompt's last prefix_len % block_size tokens")),
        (lambda P, new, bs: P // bs + sum((P % bs + n) // bs for n in new),
         _("rounded down: a partly filled block still takes a whole block (a ceiling division)")),
        (lambda P, new, bs: P // bs + 1 + sum(_ceil(P % bs + n, bs) for n in new),
         _("the prompt's blocks counted as prefix_len // block_size + 1: one too many when the "
           "prompt fills its last block exactly (an off-by-one in the fill count; a ceiling "
           "division is exact)")),
        (lambda P, new, bs: _ceil(P, bs) + sum((P % bs + n) // bs + 1 for n in new),
         _("each request's blocks counted as a floor division + 1: one too many when its tokens "
           "fill their last block exactly (an off-by-one in the fill count; a ceiling division is "
           "exact)")),
        (lambda P, new, bs: sum(_ceil(P % bs + n, bs) for n in new),
         _("that leaves out the prompt's own blocks: the parent holds them (once, shared by every "
           "fork)")),
        (lambda P, new, bs: len(new) * _ceil(P, bs) + sum(_ceil(P % bs + n, bs) for n in new),
         _("that counts the shared prompt's blocks once per request: the forks point at the same "
           "blocks, so they are in use once")),
        (lambda P, new, bs: _ceil(P, bs) - (1 if P % bs and new else 0)
         + sum(_ceil(P % bs + n, bs) for n in new),
         _("that drops the parent's partly filled last block once the requests have copied it: "
           "the parent still holds it (refcount 1), so it is not free")),
        (lambda P, new, bs: P + sum(new), _("that counts tokens, not blocks")),
    ]


def _workload_words(P: int, new: Sequence[int], bs: int) -> str:
    return f"prefix_len = {P}, new_tokens = {list(new)}, block_size = {bs}"


def _read_count(out: Any, said_as: str) -> int:
    """The answer as a whole number, or NotYet saying what arrived."""
    if isinstance(out, str | bytes):
        not_yet(_("{said_as} must return a number of blocks, got text {out!r:.40}").format(
            said_as=said_as, out=out))
    got = read_array(out, _("{said_as} must return a number of blocks").format(said_as=said_as))
    if got.dtype == object or got.dtype.kind not in "iuf":
        not_yet(_("{said_as} must return a number of blocks, got {kind} of {dtype}").format(
            said_as=said_as, kind=type(out).__name__, dtype=got.dtype))
    if got.shape not in ((), (1,)):
        not_yet(_("{said_as} must return one number (the blocks in use), got shape {shape}: add "
                  "the blocks up").format(said_as=said_as, shape=got.shape))
    value = float(got.reshape(()))
    if not math.isfinite(value) or value != round(value):
        not_yet(_("{said_as} must return a whole number of blocks, got {value:g}").format(
            said_as=said_as, value=value))
    return int(value)


def _judge_blocks(fn: Callable, P: int, new: Sequence[int], bs: int) -> str:
    """Right only if fn counts the blocks of the lesson's workload and of the others."""
    name = _name(fn)
    require_params(fn, BLOCK_ARGS, name)
    cases = [(P, tuple(new), bs), *OTHER_WORKLOADS]
    got = []
    for i, (p, nw, b) in enumerate(cases):
        said_as = _("for {workload}, your {name}").format(workload=_workload_words(p, nw, b),
                                                          name=name)
        out = run_student(fn, p, list(nw), b, said_as=said_as, rule=_rule())
        if out is None:
            if i == 0:
                return not_tried(_("your {name} returns None (the placeholder, or a missing "
                                   "`return`): return the number of blocks in use").format(
                                       name=name))
            not_yet(_("{said_as} returns None: it must return a number for any workload").format(
                said_as=said_as))
        got.append(_read_count(out, said_as))
    want = [_blocks(*c) for c in cases]
    if got == want:
        return right(_("the prompt's blocks once, then per request the blocks its tokens fill "
                       "after the prompt's partly filled tail (the copy-on-write copy among "
                       "them): right for the lesson's workload and {n} others").format(
                           n=len(OTHER_WORKLOADS)))
    mistakes = _block_mistakes()
    named = [why for rule, why in mistakes if [rule(*c) for c in cases] == got]
    if named:
        not_yet(first_match(0, [(0, why) for why in named]))
    if got[0] == want[0]:
        k = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        if len(set(got)) == 1:
            not_yet(_("your {name} gives the same number for every workload: it must count the "
                      "blocks from its arguments, not return a number worked out for "
                      "one").format(name=name))
        said = describe_number(got[k], want[k], _("yours"))
        not_yet(_("right for the lesson's workload, but not for {workload}: {said}. Check the "
                  "case where the prompt fills its last block exactly, and requests whose tokens "
                  "stay inside the copied block").format(workload=_workload_words(*cases[k]),
                                                         said=said))
    fits = [why for rule, why in mistakes if rule(*cases[0]) == got[0]]
    hint = _(" (at the lesson's workload alone it fits: {fits})").format(
        fits=_("; or ").join(fits)) if fits else ""
    said = describe_number(got[0], want[0], _("your count"))
    not_yet(_("for the lesson's workload ({workload}) {said}{hint}. Count the parent's blocks, "
              "then for each request the copy of the shared, partly filled last block and the "
              "blocks after it").format(workload=_workload_words(*cases[0]), said=said, hint=hint))


@self_check
def check_blocks_needed(my_blocks: Any, prefix_len: int = 10, new_tokens: Sequence[int] = (3, 6, 1),
                        block_size: int = 4) -> str:
    """Your `my_blocks(prefix_len, new_tokens, block_size)` -> blocks in use, for the lesson's
    workload and others."""
    if my_blocks is None:
        return not_tried(_("write my_blocks(prefix_len, new_tokens, block_size) returning the "
                           "number of blocks in use and pass the function"))
    if not callable(my_blocks):
        not_yet(_("pass the function my_blocks itself (check_blocks_needed(my_blocks)), not a "
                  "number: got {kind}; the check runs it on other workloads too").format(
                      kind=type(my_blocks).__name__))
    return _judge_blocks(my_blocks, prefix_len, tuple(new_tokens), block_size)
