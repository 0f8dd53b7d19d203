"""Self-check for the Try-it of 14_padding_masks.ipynb: a decoder's padding mask, (B, 1, T, S).

The student writes `my_decoder_mask(lengths, T)`; the check runs it under the grading guard (the
package's mask builders are the answer key, so a function that calls them is told so) on the
lesson's batch and on two more, and reads the mask in every convention: booleans with
True = may attend (right), an additive 0 / -inf float mask (right: SDPA adds it), the inverted
True = blocked of torch's key_padding_mask, 0/1 numbers (named: SDPA adds a float mask and
refuses an integer one). No message shows the mask or the expression that builds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mha import steps
from mha_course.i18n import _, use_language
from mha_course.tryit import (
    NotYet,
    first_match,
    inverted_match,
    joined,
    mask_verdict,
    not_tried,
    not_yet,
    read_array,
    read_mask,
    relate,
    require_params,
    right,
    run_student,
    self_check,
    transposed_match,
    words_of,
)

LENGTHS = (5, 3, 1)
T = 5
OTHER_BATCHES = (((2, 6, 4), 6), ((3, 1), 4))
"""Two more batches the function runs on: other lengths, and a T above every length."""


def _rule() -> str:
    """What the grading guard says when the package's mask builders made the answer."""
    return _("build the mask yourself from np.arange and comparisons (steps.causal_mask may give "
             "the triangle); the package's mask builders are the answer key")


def _what() -> str:
    """What the placeholder asks for."""
    return _("write my_decoder_mask(lengths, T): a (B, 1, T, T) boolean mask, True = may attend, "
             "built from np.arange and comparisons")


def _batch(lengths: Sequence[int], T: int) -> str:
    return _("lengths {lengths} at T = {T}").format(lengths=[int(n) for n in lengths], T=T)


def _parts(lengths: Sequence[int], T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of the mask: real (B, T), one-too-many (B, T), the lower triangle (T, S)."""
    pos = np.arange(T)
    lens = np.asarray(lengths)[:, None]  # (B, 1)
    return pos[None, :] < lens, pos[None, :] <= lens, pos[None, :] <= pos[:, None]


def _want(lengths: Sequence[int], T: int) -> np.ndarray:
    """The right mask (B, 1, T, S), True = may attend."""
    real, _more, tri = _parts(lengths, T)
    return real[:, None, None, :] & real[:, None, :, None] & tri  # (B, 1, T, S)


def _mistakes(lengths: Sequence[int], T: int) -> list[tuple[np.ndarray, str]]:
    """Typical wrong (B, 1, T, S) masks (read as True = may attend), each with the sentence that
    names it. The sentences say what the mask does, never the expression that fixes it."""
    real, one_more, tri = _parts(lengths, T)
    keys, rows = real[:, None, None, :], real[:, None, :, None]  # (B, 1, 1, S), (B, 1, T, 1)
    more_keys, more_rows = one_more[:, None, None, :], one_more[:, None, :, None]
    short = np.arange(T)[None, :] < np.asarray(lengths)[:, None] - 1  # (B, T): one too few real
    b = int(np.argmin(lengths))
    n = int(lengths[b])
    left = np.arange(T)[None, :] >= T - np.asarray(lengths)[:, None]  # (B, T): pads first
    return [
        (keys & tri, _("the query term is missing: padded queries still attend (sequence {b}, "
                       "length {n}: its padded query {n} sees key 0). The real rows are right, "
                       "since under causal masking a real query's earlier keys are all real, but "
                       "the row of a padded query must be blocked everywhere").format(b=b, n=n)),
        (more_keys & more_rows & tri,
         _("off by one: your 'real' counts position lengths[b] as real (<= where < belongs), so "
           "query {n} of sequence {b}, its first padded one, attends keys 0..{n}").format(b=b, n=n)),
        (keys & more_rows & tri,
         _("off by one on the query term: it counts position lengths[b] as real (<= where < "
           "belongs), so query {n} of sequence {b}, its first padded one, attends").format(b=b,
                                                                                          n=n)),
        (short[:, None, None, :] & short[:, None, :, None] & tri,
         _("off by one the other way: the last real position of each sequence (lengths[b] - 1) "
           "is treated as padding, so query {q} of sequence 0, its last real token, sees "
           "nothing").format(q=int(lengths[0]) - 1)),
        (keys & rows, _("the causal triangle is missing: real queries also see later real keys, "
                        "but a decoder's query t sees only the keys s at or before it")),
        (keys & rows & tri.T, _("the triangle is transposed, the upper one: query t sees the keys "
                                "s >= t, the future, instead of those at or before it")),
        (~keys & rows & tri, _("the key term is inverted: True on the padded keys and False on "
                               "the real ones, so every real query is left with nothing it may "
                               "attend (under causal masking its padded keys all lie in its "
                               "future)")),
        (~keys & tri, _("True on padded keys: the key term marks the padding instead of the real "
                        "keys, and the query term is missing")),
        (np.broadcast_to(tri, keys.shape[:2] + tri.shape),
         _("no padding in it: that is the causal triangle alone, the lengths never enter. Its "
           "real rows happen to be right (a real query's earlier keys are all real), but every "
           "padded query's row is open, and it sees padded keys too")),
        (np.broadcast_to(keys, keys.shape[:2] + tri.shape),
         _("only the key term: padded keys are hidden, but the causal triangle is missing (real "
           "queries see later keys) and so is the query term (padded queries attend)")),
        (left[:, None, None, :] & left[:, None, :, None] & tri,
         _("that is left padding: the pads at the start of each row and the real tokens at the "
           "end; this batch is padded on the right (the real tokens first, lengths[b] of them)")),
        (left[:, None, None, :] & tri, _("that treats the pads as sitting at the start of each "
                                         "row (left padding) and leaves the padded queries open; "
                                         "this batch is padded on the right")),
    ]


def _regions(got: np.ndarray, lengths: Sequence[int], T: int) -> str:
    """Which kinds of (query, key) pair the mask gets wrong, counted, with a first example."""
    want = _want(lengths, T)
    lens = np.asarray(lengths)[:, None, None, None]  # (B, 1, 1, 1)
    t = np.arange(T)[None, None, :, None]  # queries along axis 2
    s = np.arange(T)[None, None, None, :]  # keys along axis 3
    real_q, real_k = t < lens, s < lens
    kinds = [
        (want & ~got, _("real queries miss real keys at or before them")),
        (got & ~real_q, _("padded queries attend")),
        (got & real_q & ~real_k, _("real queries see padded keys")),
        (got & real_q & real_k & (s > t), _("real queries see later keys (the future)")),
    ]
    said = []
    for where, words in kinds:
        if where.any():
            b, _h, q, k = (int(i) for i in np.argwhere(where)[0])
            n = int(where.sum())
            if n == 1:
                said.append(_("{words}: 1 entry, first sequence {b} (length {length}), query {q}, "
                              "key {k}").format(words=words, b=b, length=int(lengths[b]), q=q,
                                                k=k))
            else:
                said.append(_("{words}: {n} entries, first sequence {b} (length {length}), query "
                              "{q}, key {k}").format(words=words, n=n, b=b,
                                                     length=int(lengths[b]), q=q, k=k))
    return joined(said)


def _generic(allowed: np.ndarray, want: np.ndarray) -> bool:
    """True when relate can only count the entries a mask allows or blocks wrongly (no inverted,
    transposed, diagonal or shifted reading). Decided on relate's English sentence, whose form
    is fixed, so the decision is the same in every edition."""
    with use_language("en"):
        story = relate(allowed, want, "your mask")
    return re.match(r"your mask (allows|blocks) \d+ entr", story) is not None


def _judge_pattern(allowed: np.ndarray, convention: str, answer: np.ndarray,
                   lengths: Sequence[int], T: int) -> str:
    """The sentence for a mask whose pattern (read in its convention) is wrong."""
    want = _want(lengths, T)
    named = first_match(allowed, _mistakes(lengths, T))
    if named is None and not np.array_equal(allowed, ~want):
        named = inverted_match(allowed, _mistakes(lengths, T), want) \
            or transposed_match(allowed, _mistakes(lengths, T))
    swapped = False  # 0 and -inf swapped, said by mask_verdict
    if named is None:
        if np.array_equal(allowed, ~want) and convention == "0/1":  # ~ on integers is no negation
            named = _("your mask is inverted: 1 where attention is blocked and 0 where it is "
                      "allowed, the convention of torch's key_padding_mask (True = ignore); here "
                      "True means may attend, and mask == 0 gives those booleans")
        elif np.array_equal(allowed, ~want):
            named = mask_verdict(answer, want, _("your mask")) or ""
            swapped = convention == "additive"
        else:
            structure = relate(allowed, want, _("your mask"))
            regions = _regions(allowed, lengths, T)
            named = regions if _generic(allowed, want) else _("{structure}; {regions}").format(
                structure=structure, regions=regions)
    if convention == "0/1":
        return _("{said}. Also, as 0/1 numbers it is not a mask to SDPA (it adds a float mask to "
                 "the scores and refuses an integer one): write booleans").format(said=named)
    if convention == "additive" and not swapped:
        return _("{said} (read as an additive mask: 0 = attend, -inf = blocked)").format(
            said=named)
    return named


def judge_mask(answer: Any, lengths: Sequence[int], T: int) -> str:
    """The form of a right mask for one batch ("boolean", ...), or NotYet naming what is wrong."""
    B = len(lengths)
    value = read_array(answer, _("the mask must be a ({B}, 1, {T}, {T}) array of booleans").format(
        B=B, T=T))
    if value.dtype == object or value.dtype.kind not in "biuf":
        not_yet(_("the mask must be an array of booleans (True = may attend), got {kind} of dtype "
                  "{dtype}").format(kind=type(answer).__name__, dtype=value.dtype))
    if value.shape != (B, 1, T, T):
        not_yet(_shape_says(value, lengths, T))
    allowed, convention = read_mask(value, _("your mask"))
    want = _want(lengths, T)
    if np.array_equal(allowed, want):
        if convention == "bool":
            return _("boolean")
        if convention == "additive":
            if np.isneginf(value[~want]).all():
                return _("additive (0 = attend, -inf = blocked: SDPA adds it to the scores, so it "
                         "is the same mask as the boolean one, which this package's modules "
                         "take)")
            not_yet(_("the right places, as an additive mask, but with a finite fill: a padded "
                      "query's row is blocked everywhere, and adding the same big negative number "
                      "to every score of a row changes nothing once softmax subtracts the row max, "
                      "so that query attends as if it had no mask (measured in this lesson). Fill "
                      "with -inf, or write booleans"))
        if value.dtype.kind in "iu":
            not_yet(_("the pattern is right, but as 0/1 integers ({dtype}), not booleans: SDPA "
                      "refuses an integer attn_mask, and this package's modules refuse it. "
                      "mask == 1 gives the booleans").format(dtype=value.dtype))
        not_yet(_("the pattern is right, but as 0/1 floats ({dtype}), not booleans: SDPA adds a "
                  "float mask to the scores, so 1 on the allowed keys and 0 on the blocked ones "
                  "only tilts the weights: padded keys keep most of their weight, and this "
                  "package's modules refuse it. mask == 1 gives the booleans").format(
                      dtype=value.dtype))
    not_yet(_("for {batch}: {said}").format(
        batch=_batch(lengths, T), said=_judge_pattern(allowed, convention, value, lengths, T)))


def _shape_says(value: np.ndarray, lengths: Sequence[int], T: int) -> str:
    """The sentence for a mask of the wrong shape."""
    B, shape = len(lengths), value.shape
    if shape == (B, T, T):
        return _("shape (B, T, S) = {shape}: the head axis is missing. Against scores (B, h, T, S) "
                 "SDPA lines a 3-D mask's B up with the heads: an error when h != B, silently the "
                 "wrong sequences when h == B. The mask needs a head axis of size 1 after the "
                 "batch: ({B}, 1, {T}, {T})").format(shape=shape, B=B, T=T)
    if shape == (B, 1, 1, T):
        return _("shape (B, 1, 1, S) = {shape}: that is the key side alone; it broadcasts over the "
                 "queries, so neither the padded query rows nor the causal triangle are in "
                 "it").format(shape=shape)
    if shape == (B, 1, T, 1):
        return _("shape (B, 1, T, 1) = {shape}: that is the query side alone; the keys and the "
                 "causal triangle are not in it").format(shape=shape)
    if shape == (T, T):
        return _("shape (T, S) = {shape}: one mask for every sequence cannot follow their "
                 "lengths; it needs the batch axis and a head axis of 1: ({B}, 1, {T}, "
                 "{T})").format(shape=shape, B=B, T=T)
    if len(shape) == 4 and shape[:2] == (B, 1) and shape[2] == shape[3] == max(lengths) != T:
        return _("shape {shape} for {batch}: the mask's size comes from the longest length, not "
                 "from T; the batch is padded to T positions").format(shape=shape,
                                                                      batch=_batch(lengths, T))
    if len(shape) == 4 and shape[:2] == (B, 1) and shape[2] == shape[3] and abs(shape[2] - T) == 1:
        if shape[2] > T:
            return _("shape {shape} for {batch}: one position too many along the queries and the "
                     "keys; the batch has T positions, 0 .. T - 1").format(
                         shape=shape, batch=_batch(lengths, T))
        return _("shape {shape} for {batch}: one position too few along the queries and the keys; "
                 "the batch has T positions, 0 .. T - 1").format(shape=shape,
                                                                 batch=_batch(lengths, T))
    return relate(value.astype(bool) if value.dtype == np.bool_ else value, _want(lengths, T),
                  _("your mask"))


def _run(fn: Callable, lengths: Sequence[int], T: int) -> Any:
    """fn(lengths, T) under the grading guard; an error in it is named with the batch and line."""
    name = getattr(fn, "__name__", _("function"))
    return run_student(fn, np.array(lengths), T, allow=(steps,), rule=_rule(),
                       said_as=_("for {batch}, your {name}").format(batch=_batch(lengths, T),
                                                                    name=name))


def _same_as(out: Any, other: Any) -> bool:
    """True if two returned masks are the same array (the function ignored its arguments)."""
    try:
        a, b = np.asarray(out), np.asarray(other)
    except Exception:  # noqa: BLE001 - anything numpy cannot read is not the same
        return False
    return a.shape == b.shape and np.array_equal(a, b)


def _judge_function(fn: Callable) -> str:
    """Run fn on the lesson's batch and on OTHER_BATCHES; right only if every one is right."""
    name = getattr(fn, "__name__", _("function"))
    first = _run(fn, LENGTHS, T)
    if first is None:
        return not_tried(_("{what} (your {name} returns None so far: end it with `return` and "
                           "your mask)").format(what=_what(), name=name))
    form = ""
    for i, (lengths, t) in enumerate(((LENGTHS, T), *OTHER_BATCHES)):
        out = first if i == 0 else _run(fn, lengths, t)
        try:
            form = judge_mask(out, lengths, t)
        except NotYet as verdict:
            why = words_of(str(verdict))
            if i == 0:
                not_yet(why)
            if _same_as(out, first):
                not_yet(_("your {name} gives the same mask for {batch} as for {lesson}: it must "
                          "build the mask from its arguments (lengths and T), not from the "
                          "notebook's try_lengths or a fixed size").format(
                              name=name, batch=_batch(lengths, t), lesson=_batch(LENGTHS, T)))
            not_yet(_("right for {lesson}, but not for another batch: {why}").format(
                lesson=_batch(LENGTHS, T), why=why))
    batches = joined(_batch(ls, t) for ls, t in OTHER_BATCHES)
    return right(_("your {name} gives the (B, 1, T, T) mask, {form}, for {lesson} and for two "
                   "more batches ({batches}): each real query sees the real keys at or before "
                   "it, each padded query sees nothing").format(
                       name=name, form=form, lesson=_batch(LENGTHS, T), batches=batches))


@self_check
def check_decoder_mask(answer: Any) -> str:
    """Say right, or name the mistake in my_decoder_mask(lengths, T) -> (B, 1, T, S), True = may attend."""
    if answer is None:
        return not_tried(_what())
    if callable(answer):
        require_params(answer, ("lengths", "T"), "my_decoder_mask")
        return _judge_function(answer)
    try:
        judge_mask(answer, LENGTHS, T)
    except NotYet as verdict:
        not_yet(_("{said}. (The check wants the function, my_decoder_mask(lengths, T), not an "
                  "array)").format(said=words_of(str(verdict))))
    not_yet(_("that is the right mask for {lesson}, but the check wants the function that builds "
              "it, my_decoder_mask(lengths, T): it runs it on two more batches, and makes sure the "
              "package's own mask builders are not doing the work").format(
                  lesson=_batch(LENGTHS, T)))
