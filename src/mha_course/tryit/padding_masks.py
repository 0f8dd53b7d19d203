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
from mha_course.tryit import (
    NotYet,
    first_match,
    inverted_match,
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
)

LENGTHS = (5, 3, 1)
T = 5
OTHER_BATCHES = (((2, 6, 4), 6), ((3, 1), 4))
"""Two more batches the function runs on: other lengths, and a T above every length."""

RULE = ("build the mask yourself from np.arange and comparisons (steps.causal_mask may give the "
        "triangle); the package's mask builders are the answer key")
WHAT = ("write my_decoder_mask(lengths, T): a (B, 1, T, T) boolean mask, True = may attend, built "
        "from np.arange and comparisons")


def _batch(lengths: Sequence[int], T: int) -> str:
    return f"lengths {[int(n) for n in lengths]} at T = {T}"


def _parts(lengths: Sequence[int], T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of the mask: real (B, T), one-too-many (B, T), the lower triangle (T, S)."""
    pos = np.arange(T)
    lens = np.asarray(lengths)[:, None]  # (B, 1)
    return pos[None, :] < lens, pos[None, :] <= lens, pos[None, :] <= pos[:, None]


def _want(lengths: Sequence[int], T: int) -> np.ndarray:
    """The right mask (B, 1, T, S), True = may attend."""
    real, _, tri = _parts(lengths, T)
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
        (keys & tri, f"the query term is missing: padded queries still attend (sequence {b}, "
                     f"length {n}: its padded query {n} sees key 0). The real rows are right, since "
                     f"under causal masking a real query's earlier keys are all real, but the row "
                     f"of a padded query must be blocked everywhere"),
        (more_keys & more_rows & tri,
         f"off by one: your 'real' counts position lengths[b] as real (<= where < belongs), so "
         f"query {n} of sequence {b}, its first padded one, attends keys 0..{n}"),
        (keys & more_rows & tri,
         f"off by one on the query term: it counts position lengths[b] as real (<= where < "
         f"belongs), so query {n} of sequence {b}, its first padded one, attends"),
        (short[:, None, None, :] & short[:, None, :, None] & tri,
         f"off by one the other way: the last real position of each sequence (lengths[b] - 1) is "
         f"treated as padding, so query {int(lengths[0]) - 1} of sequence 0, its last real token, "
         f"sees nothing"),
        (keys & rows, "the causal triangle is missing: real queries also see later real keys, but "
                      "a decoder's query t sees only the keys s at or before it"),
        (keys & rows & tri.T, "the triangle is transposed, the upper one: query t sees the keys s >= t, the "
                              "future, instead of those at or before it"),
        (~keys & rows & tri, "the key term is inverted: True on the padded keys and False on the "
                             "real ones, so every real query is left with nothing it may attend "
                             "(under causal masking its padded keys all lie in its future)"),
        (~keys & tri, "True on padded keys: the key term marks the padding instead of the real "
                      "keys, and the query term is missing"),
        (np.broadcast_to(tri, keys.shape[:2] + tri.shape),
         "no padding in it: that is the causal triangle alone, the lengths never enter. Its real "
         "rows happen to be right (a real query's earlier keys are all real), but every padded "
         "query's row is open, and it sees padded keys too"),
        (np.broadcast_to(keys, keys.shape[:2] + tri.shape),
         "only the key term: padded keys are hidden, but the causal triangle is missing (real "
         "queries see later keys) and so is the query term (padded queries attend)"),
        (left[:, None, None, :] & left[:, None, :, None] & tri,
         "that is left padding: the pads at the start of each row and the real tokens at the end; "
         "this batch is padded on the right (the real tokens first, lengths[b] of them)"),
        (left[:, None, None, :] & tri, "that treats the pads as sitting at the start of each row "
                                       "(left padding) and leaves the padded queries open; this "
                                       "batch is padded on the right"),
    ]


def _regions(got: np.ndarray, lengths: Sequence[int], T: int) -> str:
    """Which kinds of (query, key) pair the mask gets wrong, counted, with a first example."""
    want = _want(lengths, T)
    lens = np.asarray(lengths)[:, None, None, None]  # (B, 1, 1, 1)
    t = np.arange(T)[None, None, :, None]  # queries along axis 2
    s = np.arange(T)[None, None, None, :]  # keys along axis 3
    real_q, real_k = t < lens, s < lens
    kinds = [
        (want & ~got, "real queries miss real keys at or before them"),
        (got & ~real_q, "padded queries attend"),
        (got & real_q & ~real_k, "real queries see padded keys"),
        (got & real_q & real_k & (s > t), "real queries see later keys (the future)"),
    ]
    said = []
    for where, words in kinds:
        if where.any():
            b, _, q, k = (int(i) for i in np.argwhere(where)[0])
            said.append(f"{words}: {int(where.sum())} entr{'y' if where.sum() == 1 else 'ies'}, "
                        f"first sequence {b} (length {int(lengths[b])}), query {q}, key {k}")
    return "; ".join(said)


def _judge_pattern(allowed: np.ndarray, convention: str, answer: np.ndarray,
                   lengths: Sequence[int], T: int) -> str:
    """The sentence for a mask whose pattern (read in its convention) is wrong."""
    want = _want(lengths, T)
    named = first_match(allowed, _mistakes(lengths, T))
    if named is None and not np.array_equal(allowed, ~want):
        named = inverted_match(allowed, _mistakes(lengths, T), want) \
            or transposed_match(allowed, _mistakes(lengths, T))
    if named is None:
        if np.array_equal(allowed, ~want) and convention == "0/1":  # ~ on integers is no negation
            named = ("your mask is inverted: 1 where attention is blocked and 0 where it is allowed, "
                     "the convention of torch's key_padding_mask (True = ignore); here True means "
                     "may attend, and mask == 0 gives those booleans")
        elif np.array_equal(allowed, ~want):
            named = mask_verdict(answer, want, "your mask") or ""
        else:
            structure = relate(allowed, want, "your mask")
            generic = re.match(r"your mask (allows|blocks) \d+ entr", structure) is not None
            regions = _regions(allowed, lengths, T)
            named = regions if generic else f"{structure}; {regions}"
    if convention == "0/1":
        named += (". Also, as 0/1 numbers it is not a mask to SDPA (it adds a float mask to the "
                  "scores and refuses an integer one): write booleans")
    elif convention == "additive" and "swapped" not in named:
        named += " (read as an additive mask: 0 = attend, -inf = blocked)"
    return named


def judge_mask(answer: Any, lengths: Sequence[int], T: int) -> str:
    """The form of a right mask for one batch ("boolean", ...), or NotYet naming what is wrong."""
    B = len(lengths)
    value = read_array(answer, f"the mask must be a ({B}, 1, {T}, {T}) array of booleans")
    if value.dtype == object or value.dtype.kind not in "biuf":
        not_yet(f"the mask must be an array of booleans (True = may attend), got "
                f"{type(answer).__name__} of dtype {value.dtype}")
    if value.shape != (B, 1, T, T):
        not_yet(_shape_says(value, lengths, T))
    allowed, convention = read_mask(value, "your mask")
    want = _want(lengths, T)
    if np.array_equal(allowed, want):
        if convention == "bool":
            return "boolean"
        if convention == "additive":
            if np.isneginf(value[~want]).all():
                return ("additive (0 = attend, -inf = blocked: SDPA adds it to the scores, so it is "
                        "the same mask as the boolean one, which this package's modules take)")
            not_yet("the right places, as an additive mask, but with a finite fill: a padded "
                    "query's row is blocked everywhere, and adding the same big negative number to "
                    "every score of a row changes nothing once softmax subtracts the row max, so "
                    "that query attends as if it had no mask (measured in this lesson). Fill with "
                    "-inf, or write booleans")
        kind = "integers" if value.dtype.kind in "iu" else "floats"
        effect = ("SDPA refuses an integer attn_mask" if kind == "integers" else
                  "SDPA adds a float mask to the scores, so 1 on the allowed keys and 0 on the "
                  "blocked ones only tilts the weights: padded keys keep most of their weight")
        not_yet(f"the pattern is right, but as 0/1 {kind} ({value.dtype}), not booleans: "
                f"{effect}, and this package's modules refuse it. mask == 1 gives the booleans")
    not_yet(f"for {_batch(lengths, T)}: {_judge_pattern(allowed, convention, value, lengths, T)}")


def _shape_says(value: np.ndarray, lengths: Sequence[int], T: int) -> str:
    """The sentence for a mask of the wrong shape."""
    B, shape = len(lengths), value.shape
    if shape == (B, T, T):
        return (f"shape (B, T, S) = {shape}: the head axis is missing. Against scores (B, h, T, S) "
                f"SDPA lines a 3-D mask's B up with the heads: an error when h != B, silently the "
                f"wrong sequences when h == B. The mask needs a head axis of size 1 after the "
                f"batch: ({B}, 1, {T}, {T})")
    if shape == (B, 1, 1, T):
        return (f"shape (B, 1, 1, S) = {shape}: that is the key side alone; it broadcasts over the "
                f"queries, so neither the padded query rows nor the causal triangle are in it")
    if shape == (B, 1, T, 1):
        return (f"shape (B, 1, T, 1) = {shape}: that is the query side alone; the keys and the "
                f"causal triangle are not in it")
    if shape == (T, T):
        return (f"shape (T, S) = {shape}: one mask for every sequence cannot follow their lengths; "
                f"it needs the batch axis and a head axis of 1: ({B}, 1, {T}, {T})")
    if len(shape) == 4 and shape[:2] == (B, 1) and shape[2] == shape[3] == max(lengths) != T:
        return (f"shape {shape} for {_batch(lengths, T)}: the mask's size comes from the longest "
                f"length, not from T; the batch is padded to T positions")
    if len(shape) == 4 and shape[:2] == (B, 1) and shape[2] == shape[3] and abs(shape[2] - T) == 1:
        return (f"shape {shape} for {_batch(lengths, T)}: one position {'too many' if shape[2] > T else 'too few'} "
                f"along the queries and the keys; the batch has T positions, 0 .. T - 1")
    return relate(value.astype(bool) if value.dtype == np.bool_ else value, _want(lengths, T),
                  "your mask")


def _run(fn: Callable, lengths: Sequence[int], T: int) -> Any:
    """fn(lengths, T) under the grading guard; an error in it is named with the batch and line."""
    name = getattr(fn, "__name__", "function")
    return run_student(fn, np.array(lengths), T, said_as=f"for {_batch(lengths, T)}, your {name}",
                       allow=(steps,), rule=RULE)


def _same_as(out: Any, other: Any) -> bool:
    """True if two returned masks are the same array (the function ignored its arguments)."""
    try:
        a, b = np.asarray(out), np.asarray(other)
    except Exception:  # noqa: BLE001 - anything numpy cannot read is not the same
        return False
    return a.shape == b.shape and np.array_equal(a, b)


def _judge_function(fn: Callable) -> str:
    """Run fn on the lesson's batch and on OTHER_BATCHES; right only if every one is right."""
    name = getattr(fn, "__name__", "function")
    first = _run(fn, LENGTHS, T)
    if first is None:
        return not_tried(WHAT + f" (your {name} returns None so far: end it with `return` and "
                                "your mask)")
    form = ""
    for i, (lengths, t) in enumerate(((LENGTHS, T), *OTHER_BATCHES)):
        out = first if i == 0 else _run(fn, lengths, t)
        try:
            form = judge_mask(out, lengths, t)
        except NotYet as verdict:
            why = str(verdict).removeprefix("not yet: ")
            if i == 0:
                not_yet(why)
            if _same_as(out, first):
                not_yet(f"your {name} gives the same mask for {_batch(lengths, t)} as for "
                        f"{_batch(LENGTHS, T)}: it must build the mask from its arguments "
                        f"(lengths and T), not from the notebook's try_lengths or a fixed size")
            not_yet(f"right for {_batch(LENGTHS, T)}, but not for another batch: {why}")
    batches = "; ".join(_batch(ls, t) for ls, t in OTHER_BATCHES)
    return right(f"your {name} gives the (B, 1, T, T) mask, {form}, for {_batch(LENGTHS, T)} and "
                 f"for two more batches ({batches}): each real query sees the real keys at or "
                 f"before it, each padded query sees nothing")


@self_check
def check_decoder_mask(answer: Any) -> str:
    """Say right, or name the mistake in my_decoder_mask(lengths, T) -> (B, 1, T, S), True = may attend."""
    if answer is None:
        return not_tried(WHAT)
    if callable(answer):
        require_params(answer, ("lengths", "T"), "my_decoder_mask")
        return _judge_function(answer)
    try:
        judge_mask(answer, LENGTHS, T)
    except NotYet as verdict:
        not_yet(str(verdict).removeprefix("not yet: ") + ". (The check wants the function, "
                "my_decoder_mask(lengths, T), not an array)")
    not_yet(f"that is the right mask for {_batch(LENGTHS, T)}, but the check wants the function "
            f"that builds it, my_decoder_mask(lengths, T): it runs it on two more batches, and "
            f"makes sure the package's own mask builders are not doing the work")
