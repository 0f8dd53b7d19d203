"""Self-check for the Try-it of 16_positions_and_variants.ipynb: RoPE positions of a chunk after a cache.

The student writes `chunk_positions(n_cached, t_new)`: the positions at which the t_new new
queries must be rotated when n_cached tokens are already in the KV cache. The check calls it
under the grading guard (the package's own helpers are off limits), names the usual slips by
the positions it returns, says how any other answer relates to the right one, and checks the
scores those positions give against the rows of a full forward over all n_cached + t_new tokens.
Positions are read in any array-like form (list, range, numpy ints or whole floats, a tensor,
one (1, t_new) row); the rule is checked at other cache sizes too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from mha import steps
from mha.attention import posenc
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

CASE = dict(n_cached=5, t_new=3)  # the lesson's question
OTHER_SIZES = ((2, 4), (0, 3), (9, 1))
"""(n_cached, t_new) the function must also get right: the numbers of the example are not the rule."""

def _rule() -> str:
    """What the grading guard says when the package's own helpers made the answer."""
    return _("build the positions yourself (numpy is enough)")


def _call(fn: Callable, n_cached: int, t_new: int) -> Any:
    """fn(n_cached, t_new) under the guard, or NotYet naming the package code or the error."""
    out = run_student(fn, n_cached, t_new, said_as=f"chunk_positions({n_cached}, {t_new})",
                      rule=_rule())
    return list(out) if isinstance(out, Iterator) else out  # a generator or map: its items


def _as_positions(out: Any, n_cached: int, t_new: int) -> np.ndarray:
    """The returned positions as a (t_new,) int array, or NotYet saying what arrived instead."""
    call = f"chunk_positions({n_cached}, {t_new})"
    p = read_array(out, _("{call} must return an array of positions (whole numbers)").format(
        call=call))
    if p.dtype == np.bool_:
        not_yet(_("{call} must return whole numbers (an array of positions), got "
                  "booleans").format(call=call))
    if not np.issubdtype(p.dtype, np.number):
        not_yet(_("{call} must return whole numbers (an array of positions), got {kind} of dtype "
                  "{dtype}").format(call=call, kind=type(out).__name__, dtype=p.dtype))
    if p.ndim == 0 and t_new == 1 or p.ndim == 2 and p.shape[0] == 1:
        p = p.reshape(-1)  # one position as a scalar, or positions as one (1, t_new) row
    if p.ndim != 1:
        not_yet(_("{call} must return a 1-D array, one position per new query (shape "
                  "({t_new},)), got shape {shape}").format(call=call, t_new=t_new, shape=p.shape))
    if len(p) == n_cached + t_new and n_cached > 0:
        not_yet(_("{call} returned all {n} positions of the sequence: return only the t_new = "
                  "{t_new} positions of the new queries; the cached keys were rotated once, when "
                  "they were stored, and are not rotated again").format(call=call, n=len(p),
                                                                        t_new=t_new))
    if len(p) == 0:
        not_yet(_("{call} returned no positions: want t_new = {t_new}, one per new query "
                  "(np.arange(start, stop) is empty when stop <= start)").format(call=call,
                                                                                 t_new=t_new))
    if len(p) == n_cached and n_cached != t_new:
        not_yet(_("{call} returned {n} positions, one per cached token: want t_new = {t_new}, one "
                  "per new query").format(call=call, n=len(p), t_new=t_new))
    if len(p) != t_new:
        not_yet(_("{call} returned {n} positions: want t_new = {t_new}, one per new "
                  "query").format(call=call, n=len(p), t_new=t_new))
    if not np.all(np.isfinite(p)):
        not_yet(_("{call} returned {got}: positions are finite whole numbers").format(
            call=call, got=p.tolist()))
    if not np.array_equal(p, np.round(p)):
        not_yet(_("{call} returned {got}: those are not whole numbers, and positions count tokens "
                  "(0, 1, 2, ...); {said}").format(
                      call=call, got=p.tolist(),
                      said=relate(p, _want(n_cached, t_new), _("your positions"))))
    return p.astype(np.int64)


def _want(n_cached: int, t_new: int) -> np.ndarray:
    """The right positions."""
    return n_cached + np.arange(t_new)


def _mistakes(n_cached: int, t_new: int) -> list[tuple[np.ndarray, str]]:
    """(positions a usual slip gives, what the slip is), for this cache size and chunk."""
    i = np.arange(t_new)
    want = _want(n_cached, t_new)
    S = n_cached + t_new
    return [
        (i, _("the chunk is rotated from 0, as if nothing were cached (0, 1, 2, ...): the new "
              "queries come after the cached tokens in the sequence, so rotating them from 0 "
              "makes every score see the wrong offset (check_relative calls this "
              "positions_ignored)")),
        (want - 1, _("off by one, one too early: your first new query sits at the position of the "
                     "last cached token, which is already in the cache; the first new query comes "
                     "after it")),
        (want + 1, _("off by one the other way, one too late: a position is skipped between the "
                     "last cached token and the first new query")),
        (want[::-1], _("the right positions, reversed: query i of the chunk is the i-th new "
                       "token, so the positions grow with i")),
        (i + 1, _("counted from 1 within the chunk: positions count from 0, and from the start of "
                  "the sequence, cached tokens included")),
        (n_cached - t_new + i, _("that is S - t_new + i with S = n_cached: in rope's "
                                 "`S - T + arange(T)`, S is the length AFTER the chunk is "
                                 "appended, not the number of cached tokens")),
        (S + i, _("that starts after the chunk (S + i, with S the length after appending): the "
                  "chunk's own tokens are the last t_new of those S, not the next ones")),
    ]


def _rows_matched(positions: np.ndarray, n_cached: int, t_new: int) -> tuple[list[int | None], bool]:
    """For each new query, the row of the full forward's scores its own scores equal (None: no row)."""
    rng = np.random.default_rng(14)
    S = n_cached + t_new
    q = rng.normal(size=(1, 2, S, 16))  # (B, h, S, d_k): the queries of all S tokens
    k = rng.normal(size=(1, 2, S, 16))  # (B, h, S, d_k): n_cached cached keys + t_new new ones
    rot_k = posenc.rope(k, np.arange(S))  # (B, h, S, d_k): each key at its own position
    full = steps.scaled_scores(posenc.rope(q, np.arange(S)), rot_k)  # (B, h, S, S)
    chunk = steps.scaled_scores(posenc.rope(q[:, :, n_cached:], positions), rot_k)  # (B, h, t_new, S)
    rows = [next((r for r in range(S) if np.allclose(chunk[:, :, j], full[:, :, r], rtol=0, atol=1e-12)),
                 None) for j in range(t_new)]
    same = bool(np.allclose(chunk, full[:, :, n_cached:], rtol=0, atol=1e-12))
    return rows, same


def _diagnosis(got: np.ndarray, n_cached: int, t_new: int) -> str | None:
    """None for the right positions, else what is wrong with them, without the right ones."""
    want = _want(n_cached, t_new)
    if np.array_equal(got, want):
        return None
    named = first_match(got, _mistakes(n_cached, t_new))
    if named:
        return named
    if t_new > 1 and len(set(got.tolist())) == 1:
        return _("every new query at the same position {position}: each token has its own "
                 "position, one more than the token before it").format(position=int(got[0]))
    if (got < 0).any():
        return _("position {position} is negative: positions count tokens from 0 (a negative "
                 "position marks padding in this package)").format(position=int(got[got < 0][0]))
    step = np.diff(got)
    if t_new > 1 and (step == step[0]).all() and step[0] not in (0, 1):
        return _("your positions step by {step} from one new query to the next: consecutive "
                 "tokens sit one position apart").format(step=int(step[0]))
    if t_new > 1 and not (step == 1).all():
        return _("your positions {got} do not grow by one from query to query: consecutive "
                 "tokens sit one position apart").format(got=got.tolist())
    said = relate(got, want, _("your positions"))
    rows, _same = _rows_matched(got, n_cached, t_new)
    n_ok = sum(r == n_cached + j for j, r in enumerate(rows))
    return _("{said}; at them {n_ok} of the {t_new} new queries get the scores the full forward "
             "gives that token").format(said=said, n_ok=n_ok, t_new=t_new)


@self_check
def check_chunk_positions(chunk_positions: Any, n_cached: int = 5, t_new: int = 3) -> str:
    """Say right, or which slip the positions chunk_positions(n_cached, t_new) returns make."""
    if chunk_positions is None:
        return not_tried(_("write the function chunk_positions(n_cached, t_new) and pass it (no "
                           "brackets)"))
    if not callable(chunk_positions):
        not_yet(_("pass the function itself, chunk_positions (no brackets), not a value: got "
                  "{kind} {value!r:.60}").format(kind=type(chunk_positions).__name__,
                                                 value=chunk_positions))
    out = _call(chunk_positions, n_cached, t_new)
    if out is None:
        return not_tried(_("chunk_positions({n_cached}, {t_new}) returns None: write its body so "
                           "that it returns the positions (and check its `return`)").format(
                               n_cached=n_cached, t_new=t_new))
    got = _as_positions(out, n_cached, t_new)
    wrong = _diagnosis(got, n_cached, t_new)
    if wrong:
        not_yet(wrong)
    same_everywhere = _("it returns the same positions whatever n_cached and t_new: build them "
                        "from n_cached and t_new, not from the numbers of this example")
    for n, t in OTHER_SIZES:
        other = _call(chunk_positions, n, t)
        where = _("right for chunk_positions({n_cached}, {t_new}), but chunk_positions({n}, "
                  "{t})").format(n_cached=n_cached, t_new=t_new, n=n, t=t)
        if other is None:
            not_yet(_("{where} returns None: return the positions for every n_cached and "
                      "t_new").format(where=where))
        try:
            p = _as_positions(other, n, t)
        except NotYet as e:
            why = same_everywhere if _same_values(other, got) else words_of(str(e))
            not_yet(_("{where}: {why}").format(where=where, why=why))
        wrong = _diagnosis(p, n, t)
        if wrong:
            if np.array_equal(p, got):
                wrong = same_everywhere
            not_yet(_("{where}: {why}").format(where=where, why=wrong))
    rows, same = _rows_matched(got, n_cached, t_new)
    if not same:  # cannot happen for the right positions; guards the check itself
        not_yet(_("the positions look right but their scores equal rows {rows} of the full "
                  "forward").format(rows=rows))
    return right(_("query i of the chunk is token n_cached + i; at those positions the new "
                   "queries' scores equal rows {first} .. {last} of the full forward (within "
                   "1e-12), and your function is right for other cache sizes too").format(
                       first=n_cached, last=n_cached + t_new - 1))


def _same_values(out: Any, got: np.ndarray) -> bool:
    """Whether a returned value holds exactly the positions `got` (any other kind: no)."""
    try:
        p = np.asarray(out.detach().cpu() if hasattr(out, "detach") else out).reshape(-1)
    except Exception:  # noqa: BLE001 - ragged lists and other non-arrays
        return False
    return p.shape == got.shape and bool(np.array_equal(p, got))
