"""Self-check for the Try-it of 17_generation.ipynb: the positions of a left-padded batch.

The student writes `my_positions(lengths, T)`, the (B, T) positions of prompts of `lengths`
left-padded to T columns: 0, 1, ... on each prompt's real tokens, a negative number (-1) on every
pad. The check runs it under the grading guard (so `compose.padded_positions` is not praised as
their work) on the lesson's batch and on others (so numbers typed for one batch are not the rule),
names the usual slips, and otherwise says how the answer relates to the right one.

`judge_padded_positions` is the judge of one array; it raises NotYet and also judges A6's
`left_padded_positions` (through `mha_course.diagnose.generation`), so its first five messages keep
their wording.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mha.modules import compose
from mha_course.i18n import _
from mha_course.tryit import (
    NotYet,
    first_match,
    not_tried,
    not_yet,
    read_array,
    relate,
    right,
    run_student,
    self_check,
    words_of,
)

OTHER_BATCHES: tuple[tuple[tuple[int, ...], int], ...] = (((1, 4), 6), ((4, 1, 4, 2), 4), ((3,), 3))
"""(lengths, T) the function must also get right: the lesson's batch is an example, not the rule."""


def _rule() -> str:
    """What the grading guard says when the package's padded_positions made the answer."""
    return _("write the positions yourself (numpy is fine); compose.padded_positions is what the "
             "check compares with")


def _as_positions(answer: Any, B: int, T: int) -> np.ndarray:
    """The answer as a (B, T) int array (floats holding whole numbers are fine), or NotYet."""
    got = read_array(answer, _("positions must be a (B={B}, T={T}) int array").format(B=B, T=T))
    if got.dtype == object:
        not_yet(_("positions must be a (B={B}, T={T}) int array, got {kind} whose entries are not "
                  "numbers").format(B=B, T=T, kind=type(answer).__name__))
    if got.shape != (B, T):
        if got.shape == (T, B) and B != T:
            not_yet(_("positions must be (B={B}, T={T}), one per token, got shape {shape} (that "
                      "is (T, B): rows and columns transposed, one row per sentence)").format(
                          B=B, T=T, shape=got.shape))
        if got.ndim == 3 and got.shape[1:] == (B, T):
            not_yet(_("positions must be (B={B}, T={T}), one per token, got shape {shape} ({n} "
                      "arrays of (B, T): return the positions alone, not a pair such as tokens "
                      "and positions)").format(B=B, T=T, shape=got.shape, n=got.shape[0]))
        not_yet(_("positions must be (B={B}, T={T}), one per token, got shape {shape}").format(
            B=B, T=T, shape=got.shape))
    if got.dtype == np.bool_ or not np.issubdtype(got.dtype, np.number):
        not_yet(_("positions must be whole numbers (an int array), got dtype {dtype}").format(
            dtype=got.dtype))
    if not np.issubdtype(got.dtype, np.integer):
        if not np.isfinite(got).all() or not np.array_equal(got, np.round(got)):
            bad = got[~np.isfinite(got) | (got != np.round(got))].flat[0]
            not_yet(_("positions must be whole numbers (an int array), got dtype {dtype} with "
                      "{bad:g}").format(dtype=got.dtype, bad=float(bad)))
        got = got.astype(np.int64)  # 3.0 is position 3
    return got


def _mistakes(lengths: np.ndarray, T: int, want: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """(positions a usual slip gives, what the slip is); the first five are A6's wording."""
    real = want >= 0
    cols = np.broadcast_to(np.arange(T), want.shape)  # (B, T): the column numbers
    start = (T - lengths)[:, None]  # (B, 1): the column of each prompt's first real token
    return [
        (compose.padded_positions(lengths, T, side="right"),
         _("the pads are on the right: for generation they go on the LEFT, so every prompt ends "
           "in the last column and the next token is appended in the same place for all")),
        (np.maximum(want, 0), _("the pads are at position 0: a pad then looks like each "
                                "sentence's first token and is attended to; mark pads with -1 "
                                "(negative)")),
        (np.where(real, want + 1, -1), _("off by one: a sentence's first real token is at "
                                         "position 0, not 1")),
        (np.where(real, cols, -1), _("the positions count from the first column, not from where "
                                     "each sentence starts: a left-padded sentence's first real "
                                     "token is at position 0, whatever column it sits in")),
        (cols, _("every row is 0..T-1: that ignores the padding altogether")),
        (np.where(real, want, 1), _("the pads are at position 1 (Hugging Face's generate fills "
                                    "pad positions with 1, because its attention mask hides "
                                    "them); here the position itself marks a pad, so a pad must "
                                    "be negative (-1)")),
        (np.maximum(want + 1, 0), _("counted from 1 with pads at 0: a sentence's first real token "
                                    "is at position 0, and a pad is -1")),
        (np.where(real, lengths[:, None] - 1 - want, -1),
         _("counted backwards: the last token got 0; a sentence counts 0, 1, 2, ... from its "
           "FIRST real token")),
        (np.where(real, want - 1, -1), _("off by one the other way: the first real token got -1, "
                                         "which marks it as a pad; a prompt counts from 0")),
        (np.where(want > 0, want, -1), _("the first real token got a negative position too: "
                                         "position 0 is a real token, so the test for a real "
                                         "position is >= 0, not > 0")),
        (np.where(cols - start + 1 >= 0, cols - start + 1, -1),
         _("off by one: each prompt's first real token got 1 (and the pad just before it 0, read "
           "as a token): a prompt's first real token is at position 0")),
    ]


def _reversed_rows(lengths: np.ndarray, T: int) -> np.ndarray | None:
    """The batch with its rows in reverse order, when that differs from the right one."""
    flipped = compose.padded_positions(lengths[::-1].copy(), T)  # (B, T)
    return None if np.array_equal(lengths, lengths[::-1]) else flipped


def _structure(got: np.ndarray, lengths: np.ndarray, T: int, want: np.ndarray) -> str | None:
    """Property by property: are the pads where they belong, and do the real tokens count 0, 1, ...?"""
    pads, got_pads = want < 0, got < 0  # (B, T) each
    if pads.any() and not got_pads.any():
        return _("no position is negative, so nothing is marked as a pad: the mask reads a key "
                 "only if its position is >= 0, so every pad needs a negative position (-1)")
    for b in range(len(lengths)):
        n_pad, n_got = int(pads[b].sum()), int(got_pads[b].sum())
        if n_got != n_pad:
            return _("row {b} (a prompt of {length} tokens in {T} columns) has {n} negative "
                     "position(s), so {n} token(s) marked as pads; count how many pads a prompt "
                     "of that length gets").format(b=b, length=int(lengths[b]), T=T, n=n_got)
    if not np.array_equal(got_pads, pads):
        return _("the negative positions are in the wrong columns: left padding puts every pad "
                 "before the prompt's first token, so each row's pads come first")
    rows = [got[b][~pads[b]] for b in range(len(lengths))]  # each prompt's real positions
    wrong = [b for b, r in enumerate(rows) if not np.array_equal(r, np.arange(r.size))]
    steps = {b: np.diff(rows[b]) for b in wrong}
    if all(rows[b].size > 1 and (steps[b] == 1).all() for b in wrong):
        starts = {int(rows[b][0]) for b in wrong}
        if len(wrong) == len(rows) and len(starts) == 1:
            return _("the pads are right, and every prompt counts up by 1 from {start} at its "
                     "first real token: a prompt's first token is at position 0").format(
                         start=starts.pop())
        return _("the pads are right, but row {b} counts up from {start} at its first real token "
                 "({n} of {rows} rows start off 0): each prompt counts from 0 on its own").format(
                     b=wrong[0], start=int(rows[wrong[0]][0]), n=len(wrong), rows=len(rows))
    b = wrong[0]
    d = steps[b]
    length = int(lengths[b])
    if d.size and (d == -1).all():
        return _("the pads are right, but row {b} (a prompt of {length} tokens) counts down: "
                 "count 0, 1, 2, ... up from its first real token").format(b=b, length=length)
    if d.size and (d == 0).all():
        return _("the pads are right, but row {b} (a prompt of {length} tokens) gives all its "
                 "real tokens the same position {position}: each token gets its own, one more "
                 "than the token before").format(b=b, length=length, position=int(rows[b][0]))
    if d.size and (d == d[0]).all():
        return _("the pads are right, but row {b} (a prompt of {length} tokens) goes up by "
                 "{step} from one token to the next: positions go up by 1 per token").format(
                     b=b, length=length, step=int(d[0]))
    return None


def judge_padded_positions(answer: Any, lengths: Sequence[int] = (2, 5, 3), T: int = 5) -> str:
    """Left-padded positions (B, T): 0..L-1 on each prompt's real tokens, a negative number on each pad.

    Returns "right: ..." or raises NotYet naming the mistake. Any negative pad position is right
    (a pad is any negative position, as the lesson's table says); -1 is the usual one.
    """
    if answer is None:
        return not_tried(_("replace None with your (B, T) array of positions"))
    lengths = np.asarray(lengths)
    want = compose.padded_positions(lengths, T)  # (B, T): -1 on the pads
    got = _as_positions(answer, len(lengths), T)
    seen = np.where(got < 0, -1, got)  # every negative position is a pad
    if np.array_equal(seen, want):
        return right(_("each prompt counts 0, 1, ... from its own first token, and every pad is "
                       "negative"))
    mistakes = _mistakes(lengths, T, want)
    if (flipped := _reversed_rows(lengths, T)) is not None:
        mistakes.append((flipped, _("the rows follow the lengths in reverse order: row b is "
                                    "prompt b, with lengths[b] real tokens")))
    named = first_match(seen, mistakes) or _structure(seen, lengths, T, want)
    if named:
        not_yet(named)
    not_yet(relate(seen, want, _("your positions"), show_shape=False))


def _batch(lengths: Sequence[int], T: int) -> str:
    return _("lengths {lengths}, T = {T}").format(lengths=list(int(n) for n in lengths), T=T)


def _run(fn: Callable, lengths: Any, T: int) -> Any:
    """fn(lengths, T) under the grading guard; an error in it is named with the batch and its line."""
    name = getattr(fn, "__name__", _("function"))
    return run_student(fn, lengths, T, rule=_rule(), said_as=_("for {batch}, your {name}").format(
        batch=_batch(lengths, T), name=name))


def _judge_function(fn: Callable, lengths: Sequence[int], T: int) -> str:
    """Run fn on the lesson's batch and on OTHER_BATCHES; right only if every one is right."""
    name = getattr(fn, "__name__", _("your function"))
    first = _run(fn, lengths, T)
    if first is None:
        return not_tried(_("your {name} returns None (the placeholder, or a missing `return`): "
                           "write the code that builds the (B, T) positions and return "
                           "them").format(name=name))
    like = (lambda ls: np.array(ls)) if isinstance(lengths, np.ndarray) else list  # as the lesson
    batches = [(tuple(int(n) for n in lengths), T), *OTHER_BATCHES]
    for i, (ls, t) in enumerate(batches):
        out = first if i == 0 else _run(fn, like(ls), t)
        try:
            judge_padded_positions(out, ls, t)
        except NotYet as verdict:
            if i > 0 and _same_array(out, first):
                not_yet(_("your {name} gives the same array for {batch} as for {lesson}: it must "
                          "compute the positions from its arguments, not return numbers written "
                          "for one batch").format(name=name, batch=_batch(ls, t),
                                                  lesson=_batch(lengths, T)))
            said = words_of(str(verdict))
            if i == 0:
                not_yet(_("for {batch}: {said}").format(batch=_batch(ls, t), said=said))
            not_yet(_("for {batch} (the lesson's batch was right): {said}").format(
                batch=_batch(ls, t), said=said))
    return right(_("each prompt counts 0, 1, ... from its own first token and every pad is "
                   "negative, on the lesson's batch and {n} others").format(n=len(OTHER_BATCHES)))


def _same_array(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        return False


@self_check
def check_padded_positions(answer: Any, lengths: Sequence[int] = (2, 5, 3), T: int = 5) -> str:
    """Your `my_positions(lengths, T)` -> left-padded positions (B, T), on this batch and on others."""
    if answer is None:
        return not_tried(_("replace None with your function my_positions(lengths, T) that returns "
                           "the (B, T) positions"))
    if callable(answer):
        return _judge_function(answer, lengths, T)
    judge_padded_positions(answer, lengths, T)  # an array: a wrong one is named here
    not_yet(_("these are the right positions for {batch}. The Try-it asks for the function that "
              "makes them, my_positions(lengths, T), so that the check can run it on other batches "
              "and see that it is your code, not compose.padded_positions: put your lines in a def "
              "and pass the function").format(batch=_batch(lengths, T)))
