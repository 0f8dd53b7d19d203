"""Say what is wrong with a student's ring attention (19_attention_across_devices.ipynb, A7), as
`mha_course.diagnose.generation` does for generation.

    check_merge(merge_partials)                  # the exact logsumexp merge of two partial results
    check_positions(zigzag_positions)            # the global positions each zigzag rank holds
    check_step(ring_step, globals())             # one ring step: a block, masked by positions, merged in
    check_ring(ring_attention, globals())        # W simulated ranks, W steps: the full output
    check_pairs(causal_pairs, globals())         # the causal (query, key) pairs each rank scores
    (each has a *_diagnosis twin that returns the Diagnosis object instead of raising)

How it decides. Every verdict rests on values, in float64, against an independent reference
written here (`_attend`: the softmax over the allowed keys in one pass, with each row's
logsumexp), never against the code under test. Merge: two partial results over a split of the
keys must merge into the one-pass answer, on random splits, a side with no key (lse -inf), rows
with no key on either side (out 0, lse -inf, no NaN) and scores near 1000 (exp overflows); where
they do not, the planted merges (`MERGE_MISTAKES`) run on the same inputs and the one that matches
is named. Positions: the zigzag layout, chunks r and 2W-1-r of 2W in increasing order, and a
ValueError when T does not cut into 2W chunks; the usual slips are named (`POSITION_MISTAKES`).
Ring step: a block of keys at its global positions merged into a running result must equal one
pass over both; the planted steps (`STEP_MISTAKES`: the mask built from the block's own indices,
`<` for `<=`, transposed, no lse in the merge, NaN on hidden rows and blocks ...) name the mistake.
Ring: the output must equal one-process attention, and the calls of `ring_step` (the reference,
swapped in and recorded by `StepRecorder`) must show a ring: W ranks with the layout's positions,
each attending to every block it needs once, each block's positions and values travelling with
its keys. Pairs: the count of `mha.parallel.ring.causal_work` (written again here), and each usual slip
computed beside it.

Graded on its own: `check_step`, `check_ring` and `check_pairs` swap the reference versions of
the earlier parts into the student's namespace (`diagnose.swapped_in`), so a wrong merge costs
only the merge's points; a part that is missing or failed to compile is put in too, with a note.

Shape legend: B batch, h heads, T tokens, W ranks (world size), T_r = T / W tokens per rank,
d_k head width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mha.attention.torch_attention import attention_lse as _attention_lse
from mha.attention.torch_attention import merge_partials as _merge

# Bound at import: a grader's diagnose.refusing(parallel, ...) cannot reach what the verdicts use.
from mha.parallel.ring import block_mask as _block_mask
from mha.parallel.ring import rank_positions as _rank_positions
from mha_course.diagnose import Diagnosis, _to_numpy, swapped_in
from mha_course.diagnose import run_student as _run

RTOL, ATOL = 1e-9, 1e-11  # float64 throughout: any right order of operations lands far inside
NEG_INF_BELOW = -1e8  # an lse at or below this counts as -inf (a -1e9 fill works as well)


def _float(a: Any) -> np.ndarray:
    return np.asarray(_to_numpy(a), dtype=np.float64)


def _pair(result: Any, what: str, shape: tuple[int, ...]) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """The student's (out, lse) as float64 arrays, lse at or below NEG_INF_BELOW as -inf; or a problem."""
    if result is None:
        return None, None, f"{what} returned None: did you forget the `return (out, lse)`?"
    if not isinstance(result, tuple | list) or len(result) != 2:
        got = type(result).__name__ + (f" of {len(result)}" if isinstance(result, tuple | list) else "")
        return None, None, f"{what} must return two things, (out, lse); got {got}"
    try:
        out, lse = _float(result[0]), _float(result[1])
    except Exception as e:
        return None, None, f"{what} returned something that is not a tensor ({type(e).__name__}: {e})"
    if out.shape != shape:
        return None, None, f"{what} returned out of shape {out.shape}; expected {shape}, (B, h, T, d_k)"
    if lse.shape != shape[:-1]:
        hint = " (drop the keepdim axis)" if lse.shape == shape[:-1] + (1,) else ""
        return None, None, f"{what} returned lse of shape {lse.shape}; expected {shape[:-1]}, (B, h, T){hint}"
    return out, np.where(lse <= NEG_INF_BELOW, -np.inf, lse), None


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Same values, -inf and inf where the other has them, NaN only where the other has NaN."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))


# ---- the independent reference ---------------------------------------------------------------
def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over the allowed keys in one pass: -> (out (B,h,T,d_k), lse (B,h,T)).

    A row with no allowed key has lse -inf and out 0 (no mass at all).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B, h, T): -inf on a row with no key
    base = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # exp(-inf - 0) = 0 there
    return torch.exp(scores - base[..., None]) @ v, lse  # (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)


def _causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(T_q, T_k) True where the query at q_pos may see the key at k_pos (global positions)."""
    return k_pos[None, :] <= q_pos[:, None]


def _merge_ref(out_a, lse_a, out_b, lse_b):
    """The logsumexp merge, written again here (the verdicts never run the code they judge)."""
    lse = torch.logaddexp(lse_a, lse_b)  # (..., T)
    base = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(lse_a - base)[..., None] * out_a + torch.exp(lse_b - base)[..., None] * out_b, lse


def _qkv(shape: tuple[int, ...], seed: int, n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(n)]


def _layout(T: int, W: int, layout: str) -> list[torch.Tensor]:
    """The positions each rank holds, written again here: contiguous runs, or chunks r and 2W-1-r."""
    if layout == "contiguous":
        return [torch.arange(r * T // W, (r + 1) * T // W) for r in range(W)]
    n = T // (2 * W)  # positions per chunk
    return [torch.cat([torch.arange(r * n, (r + 1) * n), torch.arange((2 * W - 1 - r) * n, (2 * W - r) * n)])
            for r in range(W)]


def _work(T: int, W: int, layout: str) -> list[int]:
    """Allowed (query, key) pairs per rank under the causal mask: the query at t sees t + 1 keys."""
    return [int((p + 1).sum()) for p in _layout(T, W, layout)]


# ---- the references a later part runs with (swapped in) ----------------------------------------
def reference_zigzag_positions(T: int, world_size: int) -> list[torch.Tensor]:
    """The zigzag positions of `mha.parallel.ring.rank_positions`: rank r holds chunks r and 2W-1-r."""
    return _rank_positions(T, world_size, "zigzag")


def reference_ring_step(q, k, v, q_pos, k_pos, out, lse, causal=False):
    """One ring step as `mha.parallel.ring.ring_rank` takes it: attend to the block, merge it in."""
    allowed = _block_mask(torch.as_tensor(q_pos), torch.as_tensor(k_pos), causal)  # (T_r, T_k) or None
    if allowed is not None and not bool(allowed.any()):
        return out, lse  # hidden entirely: nothing to add
    o, o_lse = _attention_lse(q, k, v, allowed)  # (B, h, T_r, d_k), (B, h, T_r)
    return _merge(out, lse, o, o_lse)


# ---- part 1: the merge -----------------------------------------------------------------------
@dataclass(frozen=True)
class MergeCase:
    """Two partial results over a split of S keys, for T queries."""

    kind: str  # "split", "rows", "one_empty", "huge", "both_empty"
    B: int = 2
    h: int = 3
    T: int = 5
    S: int = 7
    d_k: int = 4
    seed: int = 0

    def __str__(self) -> str:
        return {"split": "the keys split at random between A and B",
                "rows": "some rows with no key on side A (lse_a -inf on those rows)",
                "one_empty": "side A with no key at all (lse_a = -inf, out_a = 0)",
                "huge": "scores near 1000 (exp(lse) overflows float64)",
                "both_empty": "rows 1 and 3 with no key on either side"}[self.kind] + \
            f" (B={self.B}, h={self.h}, T={self.T}, S={self.S}, d_k={self.d_k})"


MERGE_CASES: tuple[MergeCase, ...] = (
    MergeCase("split"), MergeCase("rows", seed=1), MergeCase("one_empty", 1, 2, 4, 6, 3, seed=2),
    MergeCase("huge", seed=3), MergeCase("both_empty", 2, 2, 5, 6, 4, seed=4),
    MergeCase("split", 1, 1, 1, 9, 8, seed=5), MergeCase("rows", 3, 2, 6, 5, 2, seed=6))
"""The inputs a merge is judged on: each usual mistake fails on one of the first five."""


def merge_inputs(case: MergeCase) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor]]:
    """((out_a, lse_a, out_b, lse_b), (out, lse) of one pass over all the keys) for a case."""
    q, = _qkv((case.B, case.h, case.T, case.d_k), case.seed, 1)
    k, v = _qkv((case.B, case.h, case.S, case.d_k), case.seed + 50, 2)
    g = torch.Generator().manual_seed(case.seed + 100)
    if case.kind == "huge":  # a shared direction scores ~1000 for every (query, key) pair
        q = q.clone()
        k = k.clone()
        q[..., 0] = 100.0
        k[..., 0] = 10 * math.sqrt(case.d_k) + 0.01 * k[..., 0]  # q . k / sqrt(d_k) = 1000 + O(1)
    side = torch.rand(case.S, generator=g) < 0.5
    side[0], side[-1] = True, False  # both sides hold a key
    in_a = side.expand(case.T, case.S).clone()  # (T, S): key s is on side A
    if case.kind == "rows":
        in_a = torch.rand(case.T, case.S, generator=g) < 0.5
        in_a[0] = False  # row 0: nothing on side A
        in_a[-1] = True  # last row: everything on side A
    if case.kind == "one_empty":
        in_a = torch.zeros(case.T, case.S, dtype=torch.bool)
    allowed_a, allowed_b = in_a, ~in_a
    if case.kind == "both_empty":
        allowed_a, allowed_b = allowed_a.clone(), allowed_b.clone()
        allowed_a[[1, 3]] = False
        allowed_b[[1, 3]] = False
    a, b = _attend(q, k, v, allowed_a), _attend(q, k, v, allowed_b)
    return (a[0], a[1], b[0], b[1]), _attend(q, k, v, allowed_a | allowed_b)


def _m_average(oa, la, ob, lb):
    return (oa + ob) / 2, torch.logaddexp(la, lb)


def _m_unnormalised(oa, la, ob, lb):
    return torch.exp(la)[..., None] * oa + torch.exp(lb)[..., None] * ob, torch.logaddexp(la, lb)


def _m_overflow(oa, la, ob, lb):
    wa, wb = torch.exp(la)[..., None], torch.exp(lb)[..., None]
    return (wa * oa + wb * ob) / (wa + wb), torch.logaddexp(la, lb)


def _m_overflow_lse(oa, la, ob, lb):
    wa, wb = torch.exp(la)[..., None], torch.exp(lb)[..., None]
    return (wa * oa + wb * ob) / (wa + wb), torch.log(wa + wb)[..., 0]


def _m_lse_max(oa, la, ob, lb):
    return _merge_ref(oa, la, ob, lb)[0], torch.maximum(la, lb)


def _m_lse_sum(oa, la, ob, lb):
    return _merge_ref(oa, la, ob, lb)[0], la + lb


def _m_nan_empty(oa, la, ob, lb):
    lse = torch.logaddexp(la, lb)
    return torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob, lse


def _m_swapped(oa, la, ob, lb):
    out, lse = _merge_ref(ob, la, oa, lb)
    return out, lse


_OVERFLOW = ("exp(lse) overflowed: with scores near 1000, exp(lse_a) is inf and inf / inf is NaN. "
             "Subtract the merged lse before exp: share_a = exp(lse_a - lse), lse = logaddexp(lse_a, lse_b)")

MERGE_MISTAKES: dict[str, tuple[Callable, str]] = {
    "average": (_m_average,
                "you averaged the two normalised outputs: each side must count with its share of "
                "the softmax mass, exp(lse_a - lse) and exp(lse_b - lse), lse = logaddexp(lse_a, lse_b)"),
    "swapped": (_m_swapped,
                "the shares are swapped: out_a goes with exp(lse_a - lse), out_b with exp(lse_b - lse)"),
    "unnormalised": (_m_unnormalised,
                     "the weights exp(lse_a) and exp(lse_b) are not normalised: divide by the total "
                     "mass, i.e. weight each side by exp(lse_side - lse) with lse = logaddexp(lse_a, lse_b)"),
    "lse_max": (_m_lse_max,
                "the merged lse is max(lse_a, lse_b): it is the log of the total mass, "
                "log(exp(lse_a) + exp(lse_b)) = torch.logaddexp(lse_a, lse_b)"),
    "lse_sum": (_m_lse_sum,
                "the merged lse is lse_a + lse_b (that multiplies the two masses): it is "
                "log(exp(lse_a) + exp(lse_b)) = torch.logaddexp(lse_a, lse_b)"),
    "nan_empty": (_m_nan_empty,
                  "NaN on the rows where both sides are empty (lse_a = lse_b = -inf): exp(-inf - (-inf)) "
                  "is NaN. Such a row has no mass at all: out 0 and lse -inf. Shift by the merged lse "
                  "only where it is finite, e.g. torch.where(torch.isfinite(lse), lse, 0)"),
    "overflow": (_m_overflow, _OVERFLOW),
    "overflow_lse": (_m_overflow_lse, _OVERFLOW + " (the lse too: log(exp(lse_a) + exp(lse_b)) is inf there)"),
}
"""The planted merges the diagnosis runs beside a student's: (function, what it shows)."""


def _planted(mistakes: Mapping[str, tuple[Callable, str]], args: tuple, shape: tuple[int, ...],
             out: np.ndarray, lse: np.ndarray, mask: np.ndarray | None = None) -> str | None:
    """'why [matches planted mistake 'name']' for the first planted version whose (out, lse) is the student's."""
    for name, (fn, why) in mistakes.items():
        with np.errstate(all="ignore"):
            theirs, problem = _run(fn, *(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
        if problem:
            continue
        p_out, p_lse, problem = _pair(theirs, name, shape)
        if problem:
            continue
        if mask is not None:
            p_out, out = _zero_rows(p_out, mask), _zero_rows(out, mask)
        if _close(out, p_out) and _close(lse, p_lse):
            return f"{why} [matches planted mistake '{name}']"
    return None


def _bug_of(why: str) -> str | None:
    """'name' from a message ending in "[matches planted mistake 'name']", else None."""
    return why.rsplit("'", 2)[-2] if "planted mistake '" in why else None


def _zero_rows(out: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """out with the finite values of the given (B, h, T) rows set to 0: rows with no mass (NaN stays)."""
    return np.where(rows[..., None] & np.isfinite(out), 0.0, out)


def _first_difference(out, lse, want_out, want_lse) -> str:
    """Where the student's (out, lse) first differs from the right one, in words."""
    for what, got, want in (("lse", lse, want_lse), ("out", out, want_out)):
        if np.isnan(got).any() and not np.isnan(want).any():
            idx = tuple(int(i) for i in np.argwhere(np.isnan(got))[0])
            return f"{what} has NaN (first at index {idx}), where the right answer has none"
        if not _close(got, want):
            bad = ~np.isclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return f"{what}{list(idx)} is {got[idx]:.6g}, expected {want[idx]:.6g}"
    return "it differs"


def merge_diagnosis(fn: Callable, cases: Sequence[MergeCase] = MERGE_CASES) -> Diagnosis:
    """Merge two partial results on each case; the answer must equal one pass over all keys."""
    for case in cases:
        args, (want_out, want_lse) = merge_inputs(case)
        shape = tuple(args[0].shape)
        with np.errstate(all="ignore"):
            got, problem = _run(fn, *(a.clone() for a in args))
        call = f"merge_partials on {case}"
        if problem is None:
            out, lse, problem = _pair(got, "merge_partials", shape)
        if problem:
            return Diagnosis("merge_partials", False, f"{call}: {problem}")
        want_out, want_lse = _float(want_out), _float(want_lse)
        if _close(out, want_out) and _close(lse, want_lse):
            continue
        why = _planted(MERGE_MISTAKES, args, shape, out, lse) or (
            f"{_first_difference(out, lse, want_out, want_lse)}; no known mistake fits. The merge is "
            f"out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b, lse = logaddexp(lse_a, lse_b), and "
            f"a row with no key on either side gives out 0, lse -inf")
        return Diagnosis("merge_partials", False, f"{call}: {why}",
                         bug=_bug_of(why))
    return Diagnosis("merge_partials", True,
                     f"merge_partials equals one pass over all the keys on {len(cases)} splits "
                     f"(random, a side or a row with no key, scores near 1000)",
                     cases=tuple(str(c) for c in cases))


def check_merge(fn: Callable, cases: Sequence[MergeCase] = MERGE_CASES) -> str:
    """`merge_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return merge_diagnosis(fn, cases).check()


# ---- part 2: the zigzag positions --------------------------------------------------------------
POSITION_CASES: tuple[tuple[int, int], ...] = ((16, 4), (8, 2), (6, 1), (24, 3), (4, 2), (40, 5))
"""(T, world_size) the positions are checked on; the first tells every usual mistake apart."""

REFUSE_CASES: tuple[tuple[int, int], ...] = ((12, 4), (6, 2), (9, 1))
"""(T, world_size) that the zigzag layout cannot split: T is not divisible by 2W."""


def _chunks(T: int, W: int) -> list[list[int]]:
    n = T // (2 * W)
    return [list(range(c * n, (c + 1) * n)) for c in range(2 * W)]


POSITION_MISTAKES: dict[str, tuple[Callable[[int, int], list[list[int]]], str]] = {
    "contiguous": (lambda T, W: [list(range(r * T // W, (r + 1) * T // W)) for r in range(W)],
                   "that is the contiguous layout (rank r holds T/W positions in a row); the zigzag "
                   "cuts T into 2W chunks and gives rank r chunks r and 2W-1-r"),
    "mirror_w": (lambda T, W: [_chunks(T, W)[r] + _chunks(T, W)[W - 1 - r] for r in range(W)],
                 "rank r got chunks r and W-1-r: there are 2W chunks, so the partner of chunk r is "
                 "chunk 2W-1-r (the chunks past W-1 were never handed out)"),
    "late_first": (lambda T, W: [_chunks(T, W)[2 * W - 1 - r] + _chunks(T, W)[r] for r in range(W)],
                   "the chunks are in the wrong order: each rank lists its positions in increasing "
                   "order, chunk r first, then chunk 2W-1-r"),
    "ranks_reversed": (lambda T, W: [_chunks(T, W)[W - 1 - r] + _chunks(T, W)[W + r] for r in range(W)],
                       "the ranks are in reverse order: rank 0 holds the first chunk (and the last), "
                       "rank r chunks r and 2W-1-r"),
}
"""The usual wrong layouts: (positions per rank for (T, W), what they show)."""


def _rows(result: Any, W: int, what: str) -> tuple[np.ndarray | None, str | None]:
    """The student's positions as a (W, T/W) int64 array, or a problem."""
    if result is None:
        return None, f"{what} returned None: did you forget the `return`?"
    try:
        rows = [np.asarray(_to_numpy(r)) for r in result]
        arr = np.stack(rows) if rows else np.zeros((0, 0))
    except Exception as e:
        return None, (f"{what} must return one 1-d tensor of positions per rank, all of one length "
                      f"({type(e).__name__}: {e})")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        return None, f"{what} must return whole-number positions, got dtype {arr.dtype}"
    if not np.issubdtype(arr.dtype, np.integer) and not (
            np.all(np.isfinite(arr)) and np.array_equal(arr, np.round(arr))):
        return None, f"{what} must return whole-number positions, got {arr.dtype} values"
    if arr.ndim != 2 or arr.shape[0] != W:
        return None, (f"{what} must return world_size={W} rows of positions (one per rank), got an "
                      f"array of shape {arr.shape}")
    return arr.astype(np.int64), None


def _refusal_problem(fn: Callable, T: int, W: int) -> str | None:
    call = f"zigzag_positions({T}, {W})"
    try:
        fn(T, W)
    except ValueError as e:
        if not str(e).strip():
            return (f"{call} raised a ValueError without a message: say what is wrong, e.g. T={T} "
                    f"is not divisible by 2W = {2 * W}")
        return None
    except NotImplementedError:
        return f"{call} is not written yet (it raises NotImplementedError)"
    except Exception as e:
        kind = type(e).__name__
        why = ("an assert is not a clear error (python -O drops it, callers catch ValueError)"
               if isinstance(e, AssertionError) else "check T % (2 * world_size) first")
        return f"{call} raised {kind}: {e}; {why}, and raise a ValueError that says why"
    also = (f" (checking T % W is not enough: T={T} is divisible by W={W}, but the zigzag cuts 2W "
            f"chunks)" if T % W == 0 else "")
    return (f"{call} returned positions, but T={T} does not cut into 2W = {2 * W} equal chunks: raise "
            f"a ValueError saying so (torch.chunk would silently make unequal ones){also}")


def positions_diagnosis(fn: Callable, cases: Sequence[tuple[int, int]] = POSITION_CASES,
                        refuse: Sequence[tuple[int, int]] = REFUSE_CASES) -> Diagnosis:
    """fn(T, W) must give rank r chunks r and 2W-1-r of 2W, in order, and refuse T not divisible by 2W."""
    for T, W in cases:
        call = f"zigzag_positions({T}, {W})"
        want = np.stack([p.numpy() for p in _layout(T, W, "zigzag")])  # (W, T / W)
        with np.errstate(all="ignore"):
            got, problem = _run(fn, T, W)
        if problem:
            return Diagnosis("zigzag_positions", False, f"{call} {problem}")
        arr, problem = _rows(got, W, call)
        if problem is None and arr.shape != want.shape:
            problem = (f"{call}: each rank holds T/W = {T // W} positions; yours hold {arr.shape[1]}")
        if problem:
            return Diagnosis("zigzag_positions", False, problem)
        if np.array_equal(arr, want):
            continue
        why = next((f"{msg} [matches planted mistake '{name}']"
                    for name, (slip, msg) in POSITION_MISTAKES.items()
                    if np.array_equal(arr, np.array(slip(T, W)))), None)
        if why is None:
            flat = np.sort(arr.ravel())
            why = ("every position 0..T-1 must be on exactly one rank" if not np.array_equal(flat, np.arange(T))
                   else "no usual slip fits: rank r holds chunks r and 2W-1-r of the 2W chunks of T/2W positions")
        return Diagnosis("zigzag_positions", False,
                         f"{call}: {why}\n  yours    {arr.tolist()}\n  expected {want.tolist()}",
                         bug=_bug_of(why))
    for T, W in refuse:
        if problem := _refusal_problem(fn, T, W):
            return Diagnosis("zigzag_positions", False, problem, bug="no_refusal")
    return Diagnosis("zigzag_positions", True,
                     f"zigzag_positions matches on {len(cases)} layouts (rank r holds chunks r and "
                     f"2W-1-r) and refuses {len(refuse)} splits that do not cut into 2W chunks",
                     cases=tuple(f"T={T}, W={W}" for T, W in cases))


def check_positions(fn: Callable, cases: Sequence[tuple[int, int]] = POSITION_CASES,
                    refuse: Sequence[tuple[int, int]] = REFUSE_CASES) -> str:
    """`positions_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return positions_diagnosis(fn, cases, refuse).check()


# ---- part 3: one ring step ---------------------------------------------------------------------
@dataclass(frozen=True)
class StepCase:
    """One rank's queries at q_pos, a block of keys at k_pos, and what it has merged before."""

    name: str
    q_pos: tuple[int, ...]
    k_pos: tuple[int, ...]
    prior_pos: tuple[int, ...] | None  # the block merged already (None: out 0, lse -inf)
    causal: bool = True
    B: int = 2
    h: int = 2
    d_k: int = 4
    seed: int = 0

    def __str__(self) -> str:
        before = "from nothing (out 0, lse -inf)" if self.prior_pos is None else \
            f"after the block at {list(self.prior_pos)}"
        return (f"{self.name}: queries at {list(self.q_pos)}, the block at {list(self.k_pos)}, "
                f"causal={self.causal}, {before}")


_C = [tuple(range(4 * r, 4 * r + 4)) for r in range(4)]  # contiguous, T = 16, W = 4
_Z = [(0, 1, 6, 7), (2, 3, 4, 5)]  # zigzag, T = 8, W = 2
STEP_CASES: tuple[StepCase, ...] = (
    StepCase("contiguous rank 2, rank 1's block", _C[2], _C[1], _C[2], seed=0),
    StepCase("contiguous rank 1, its own block", _C[1], _C[1], None, seed=1),
    StepCase("contiguous rank 1, rank 3's block (hidden)", _C[1], _C[3], _C[1], seed=2),
    StepCase("zigzag rank 0, rank 1's block", _Z[0], _Z[1], _Z[0], seed=3),
    StepCase("zigzag rank 1, rank 0's block", _Z[1], _Z[0], _Z[1], B=1, h=3, d_k=8, seed=4),
    StepCase("no mask, another rank's block", _C[0], _C[2], _C[0], causal=False, seed=5),
    StepCase("zigzag rank 0, rank 1's block, from nothing", _Z[0], _Z[1], None, seed=6),
)
"""The steps ring_step is judged on: each usual mistake fails on one of the first five."""


def step_inputs(case: StepCase) -> tuple[tuple, tuple[torch.Tensor, torch.Tensor]]:
    """((q, k, v, q_pos, k_pos, out, lse, causal), the right (out, lse)) for a case."""
    T_r, T_k = len(case.q_pos), len(case.k_pos)
    q, = _qkv((case.B, case.h, T_r, case.d_k), case.seed, 1)
    k, v = _qkv((case.B, case.h, T_k, case.d_k), case.seed + 10, 2)
    q_pos, k_pos = torch.tensor(case.q_pos), torch.tensor(case.k_pos)
    allow = (lambda kp: _causal(q_pos, kp)) if case.causal else (lambda kp: None)
    if case.prior_pos is None:
        out = torch.zeros_like(q)  # (B, h, T_r, d_k): no keys yet ...
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)  # ... so no mass
        want = _attend(q, k, v, allow(k_pos))
    else:
        k0, v0 = _qkv((case.B, case.h, len(case.prior_pos), case.d_k), case.seed + 20, 2)
        p_pos = torch.tensor(case.prior_pos)
        out, lse = _attend(q, k0, v0, allow(p_pos))
        want = _attend(q, torch.cat([k0, k], 2), torch.cat([v0, v], 2), allow(torch.cat([p_pos, k_pos])))
    return (q, k, v, q_pos, k_pos, out, lse, case.causal), want


def _mask(q_pos, k_pos, causal: bool, how: str) -> torch.Tensor | None:
    if not causal or how == "none":
        return None
    if how == "strict":
        return k_pos[None, :] < q_pos[:, None]
    if how == "local":  # the block's own indices: right only where q_pos and k_pos are the same
        return torch.ones(len(q_pos), len(k_pos), dtype=torch.bool).tril()
    if how == "transposed":  # (T_k, T_q), read as (T_q, T_k)
        return k_pos[:, None] <= q_pos[None, :]
    return _causal(q_pos, k_pos)


def planted_step(how: str = "global", merge: str = "lse", skip: bool = True, safe: bool = True,
                 scale: bool = True) -> Callable:
    """A ring step with one usual mistake (the defaults make it right)."""
    def step(q, k, v, q_pos, k_pos, out, lse, causal=False):
        allowed = _mask(q_pos, k_pos, causal, how)  # (T_r, T_k) or None
        if skip and allowed is not None and not bool(allowed.any()):
            return out, lse
        scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)  # (B, h, T_r, T_k)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        if safe:
            o, o_lse = _attend(q if scale else q * math.sqrt(q.shape[-1]), k, v, allowed)
        else:  # a plain softmax: a row of -inf gives NaN
            o, o_lse = torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)
        if merge == "average":
            return (out + o) / 2, torch.logaddexp(lse, o_lse)
        new_out, new_lse = _merge_ref(out, lse, o, o_lse)
        return new_out, (lse if merge == "keep_lse" else new_lse)
    return step


STEP_MISTAKES: dict[str, tuple[Callable, str]] = {
    "local_mask": (planted_step(how="local"),
                   "the causal mask was built from the block's own indices (a tril of T_r x T_k): that "
                   "is right only on the diagonal block, where the queries and keys are the same "
                   "positions; on the other ranks' blocks it hides keys a query may see and shows keys "
                   "it may not. Compare global positions: k_pos[None, :] <= q_pos[:, None]"),
    "strict": (planted_step(how="strict"),
               "the mask uses < where it needs <=: a query may see the key at its own position"),
    "transposed": (planted_step(how="transposed"),
                   "the mask is transposed: row i must be query i, (T_r, T_k) = k_pos[None, :] <= "
                   "q_pos[:, None]"),
    "ignores_causal": (planted_step(how="none"),
                       "causal=True was ignored: every key of the block was attended"),
    "unscaled": (planted_step(scale=False), "the scores are not divided by sqrt(d_k)"),
    "no_lse_merge": (planted_step(merge="average"),
                     "the block was merged without the logsumexp (the two outputs averaged): weight the "
                     "running output and the block's by their shares of the mass, as merge_partials does"),
    "lse_not_updated": (planted_step(merge="keep_lse"),
                        "the running lse came back unchanged: after the merge it is logaddexp(lse, the "
                        "block's lse), or the next step weights this one wrongly"),
    "rows_nan": (planted_step(safe=False),
                 "NaN on the rows that may see no key of this block (in the zigzag layout a rank's early "
                 "chunk sees nothing of a later rank's block while its late chunk sees all of it): such a "
                 "row must add nothing, lse -inf and out 0, not the NaN of a softmax over -inf"),
    "hidden_block_nan": (planted_step(skip=False, safe=False),
                         "a block the causal mask hides entirely gave NaN (a softmax of rows of -inf): "
                         "such a block changes nothing; return (out, lse) as they came"),
}
"""The planted steps the diagnosis runs beside a student's: (function, what it shows)."""


def step_diagnosis(fn: Callable, namespace: dict | None = None,
                   cases: Sequence[StepCase] = STEP_CASES) -> Diagnosis:
    """fn(q, k, v, q_pos, k_pos, out, lse, causal) on each case must equal one pass over both blocks.

    With `namespace` (the student's globals), merge_partials there is the reference meanwhile.
    """
    swap = swapped_in(namespace, {"merge_partials": _merge}, needed=("merge_partials",)) \
        if namespace is not None else nullcontext()
    with swap:
        for case in cases:
            args, (want_out, want_lse) = step_inputs(case)
            shape = tuple(args[0].shape)
            with np.errstate(all="ignore"):
                got, problem = _run(fn, *(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
            call = f"ring_step on {case}"
            if problem is None:
                out, lse, problem = _pair(got, "ring_step", shape)
            if problem:
                return Diagnosis("ring_step", False, f"{call}: {problem}")
            want_out, want_lse = _float(want_out), _float(want_lse)
            empty = np.isneginf(want_lse)  # rows with no mass: any finite out will do
            if _close(_zero_rows(out, empty), _zero_rows(want_out, empty)) and _close(lse, want_lse):
                continue  # (a NaN on a row with no mass stays NaN, and differs)
            why = _planted(STEP_MISTAKES, args, shape, out, lse, mask=empty) or (
                f"{_first_difference(out, lse, want_out, want_lse)}; no known mistake fits. Mask the "
                f"block by global positions (k_pos <= q_pos when causal), attend with its logsumexp, "
                f"merge it into (out, lse)")
            return Diagnosis("ring_step", False, f"{call}: {why}",
                             bug=_bug_of(why))
    return Diagnosis("ring_step", True,
                     f"ring_step equals one pass over both blocks on {len(cases)} steps (own block, "
                     f"earlier and later blocks, zigzag rows that see nothing, no mask)",
                     cases=tuple(str(c) for c in cases))


def check_step(fn: Callable, namespace: dict | None = None, cases: Sequence[StepCase] = STEP_CASES) -> str:
    """`step_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return step_diagnosis(fn, namespace, cases).check()


# ---- part 4: the whole ring --------------------------------------------------------------------
@dataclass(frozen=True)
class RingCase:
    """Ring attention of q, k, v (B, h, T, d_k) on W simulated ranks."""

    B: int
    h: int
    T: int
    d_k: int
    W: int
    layout: str
    causal: bool
    seed: int = 0

    def __str__(self) -> str:
        return (f"W={self.W}, {self.layout}, causal={self.causal}, (B, h, T, d_k) = "
                f"({self.B}, {self.h}, {self.T}, {self.d_k})")


RING_CASES: tuple[RingCase, ...] = (
    RingCase(2, 2, 16, 4, 4, "zigzag", True, seed=0),
    RingCase(1, 2, 8, 4, 2, "contiguous", True, seed=1),
    RingCase(2, 3, 12, 4, 3, "contiguous", False, seed=2),
    RingCase(1, 2, 16, 8, 2, "zigzag", False, seed=3),
    RingCase(1, 1, 6, 4, 1, "zigzag", True, seed=4),
    RingCase(2, 2, 24, 4, 3, "zigzag", True, seed=5),
    RingCase(1, 2, 12, 4, 4, "contiguous", True, seed=6),
)
"""The rings ring_attention is judged on: the first shows every usual mistake."""


@dataclass
class StepCall:
    """One call of ring_step, as the recorder saw it."""

    q_pos: tuple[int, ...] | None
    k_pos: tuple[int, ...] | None
    causal: Any
    q_tokens: int | None
    q_at: tuple[int, ...] | None = None  # the positions whose queries q holds (None: not q's rows)
    k_at: tuple[int, ...] | None = None  # the positions whose keys k holds
    v_at: tuple[int, ...] | None = None


def _rows_at(block: Any, full: torch.Tensor) -> tuple[int, ...] | None:
    """The positions t whose rows full[:, :, t] make up block (B, h, n, d_k), or None."""
    try:
        b = torch.as_tensor(block, dtype=full.dtype)
        if b.ndim != 4 or b.shape[:2] != full.shape[:2] or b.shape[3] != full.shape[3]:
            return None
        at = []
        for j in range(b.shape[2]):
            same = [t for t in range(full.shape[2]) if torch.equal(full[:, :, t], b[:, :, j])]
            if not same:
                return None
            at.append(same[0])
        return tuple(at)
    except Exception:
        return None


def _ints_of(pos: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in np.asarray(_to_numpy(pos)).ravel())
    except Exception:
        return None


class StepRecorder:
    """The reference ring_step, with every call written down (what a rank held, where, and how)."""

    def __init__(self):
        self.calls: list[StepCall] = []
        self.full: tuple[torch.Tensor, ...] | None = None

    def reset(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.calls, self.full = [], (q, k, v)

    def __call__(self, q, k, v, q_pos, k_pos, out, lse, causal=False):
        """The reference step's (out, lse); the call is recorded first (even one that then raises)."""
        call = StepCall(_ints_of(q_pos), _ints_of(k_pos), causal,
                        q.shape[2] if getattr(q, "ndim", 0) == 4 else None)
        if self.full is not None:
            call.q_at, call.k_at, call.v_at = (_rows_at(x, f) for x, f in zip((q, k, v), self.full, strict=True))
        self.calls.append(call)
        return reference_ring_step(q, k, v, torch.as_tensor(q_pos), torch.as_tensor(k_pos), out, lse, causal)


def _unsharded_in_rank_order(q, k, v, case: RingCase) -> torch.Tensor:
    """The ring's per-rank outputs concatenated in rank order (right only for contiguous)."""
    pos = _layout(case.T, case.W, case.layout)
    want, _ = _attend(q, k, v, _causal(torch.arange(case.T), torch.arange(case.T)) if case.causal else None)
    return torch.cat([want.index_select(2, p) for p in pos], dim=2)


def _calls_problem(calls: list[StepCall], case: RingCase) -> str | None:
    """The first thing the recorded ring_step calls show wrong, or None."""
    W, T, T_r = case.W, case.T, case.T // case.W
    if not calls:
        return ("never called ring_step: build the ring from part 3's ring_step (each rank calls it "
                "once per step; the test swaps in the reference and watches the calls)")
    for i, c in enumerate(calls):
        where = f"call {i + 1} of ring_step"
        if c.q_tokens != T_r:
            return (f"{where} got queries of {c.q_tokens} tokens: each rank holds only its own T/W = "
                    f"{T_r} queries (a ring never puts the whole sequence on one rank)")
        if c.q_pos is None or c.k_pos is None:
            return f"{where}: q_pos and k_pos must be the global positions, 1-d int tensors"
        if bool(c.causal) != case.causal:
            return (f"{where} got causal={c.causal!r} for a ring with causal={case.causal}: pass "
                    f"`causal` on to every step")
        if c.q_at != c.q_pos:
            return (f"{where} got q_pos {list(c.q_pos)} with the queries of positions "
                    f"{list(c.q_at) if c.q_at else '(not rows of q)'}: a rank's queries and positions go together")
        if c.k_at != c.k_pos:
            own = " (the rank's own positions)" if c.k_pos == c.q_pos else ""
            return (f"the positions did not travel with the block: {where} held the keys of positions "
                    f"{list(c.k_at) if c.k_at else '(not rows of k)'} but passed k_pos {list(c.k_pos)}{own}. "
                    f"Pass each block's positions on with its keys and values, so every rank masks it "
                    f"by where its keys really are [matches planted mistake 'own_k_positions']")
        if c.v_at != c.k_at:
            return (f"the values did not travel with their keys: {where} held the keys of positions "
                    f"{list(c.k_at)} and the values of {list(c.v_at) if c.v_at else '(not rows of v)'}. "
                    f"Pass k, v and k_pos on together [matches planted mistake 'v_left_behind']")
    ranks: dict[tuple[int, ...], list[StepCall]] = {}
    for c in calls:
        ranks.setdefault(c.q_pos, []).append(c)
    layout = [tuple(int(t) for t in p) for p in _layout(T, W, case.layout)]
    if sorted(ranks) != sorted(layout):
        what = ("the zigzag layout gives rank r chunks r and 2W-1-r" if case.layout == "zigzag"
                else "the contiguous layout gives rank r positions r T/W .. (r+1) T/W - 1")
        return (f"the ranks' queries were at {[list(p) for p in ranks]}; {what}: "
                f"{[list(p) for p in layout]}")
    for r, pos in enumerate(layout):
        blocks = [c.k_pos for c in ranks[pos]]
        twice = next((b for b in blocks if blocks.count(b) > 1), None)
        if twice is not None:
            return (f"rank {r} attended to the block at {list(twice)} {blocks.count(twice)} times: each "
                    f"block is merged in once")
        needed = [b for b in layout if not case.causal or any(k <= q for k in b for q in pos)]
        missed = [b for b in needed if b not in blocks]
        if missed:
            return (f"one block missed: rank {r} never attended to the block at {list(missed[0])}, which "
                    f"its queries may see. A ring of W = {W} ranks takes W steps (its own block, then "
                    f"W - 1 received), attending before each pass [matches planted mistake 'one_block_missed']")
    return None


def ring_truth(case: RingCase) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """((q, k, v), one-process float64 attention) for a case."""
    q, k, v = _qkv((case.B, case.h, case.T, case.d_k), 200 + case.seed)
    allowed = _causal(torch.arange(case.T), torch.arange(case.T)) if case.causal else None
    return (q, k, v), _attend(q, k, v, allowed)[0]


def ring_diagnosis(fn: Callable, namespace: dict | None = None,
                   cases: Sequence[RingCase] = RING_CASES) -> Diagnosis:
    """fn(q, k, v, W, layout, causal) must equal one-process attention, through a ring of ring_step calls.

    With `namespace` (the student's globals), ring_step, merge_partials and zigzag_positions there
    are the references meanwhile, ring_step recorded: the calls must show a ring.
    """
    recorder = StepRecorder()
    refs = {"merge_partials": _merge, "zigzag_positions": reference_zigzag_positions,
            "ring_step": recorder}
    swap = swapped_in(namespace, refs, needed=tuple(refs)) if namespace is not None else nullcontext()
    with swap:
        for case in cases:
            (q, k, v), want = ring_truth(case)
            recorder.reset(q, k, v)
            call = f"ring_attention on {case}"
            with np.errstate(all="ignore"):
                got, problem = _run(fn, q.clone(), k.clone(), v.clone(), case.W, case.layout, case.causal)
            if problem:
                return Diagnosis("ring_attention", False, f"{call} {problem}")
            if got is None:
                return Diagnosis("ring_attention", False, f"{call} returned None: did you forget the `return`?")
            if isinstance(got, tuple | list) and len(got) == 2 and hasattr(got[0], "shape"):
                got = got[0]  # (out, something): the output is what is graded
            try:
                out = _float(got)
            except Exception as e:
                return Diagnosis("ring_attention", False, f"{call} returned {type(got).__name__}, not a "
                                 f"tensor ({type(e).__name__}: {e})")
            if out.shape != tuple(q.shape):
                return Diagnosis("ring_attention", False, f"{call} returned shape {out.shape}; expected "
                                 f"{tuple(q.shape)}, (B, h, T, d_k): every rank's output, back in sequence order")
            if namespace is not None and (problem := _calls_problem(recorder.calls, case)):
                return Diagnosis("ring_attention", False, f"{call}: {problem}",
                                 bug=_bug_of(problem))
            if _close(out, _float(want)):
                continue
            if _close(out, _float(_unsharded_in_rank_order(q, k, v, case))):
                why = ("the output was not put back in sequence order: the ranks' outputs were joined "
                       "in rank order, which is right only for the contiguous layout. Put row i of rank "
                       "r's output at position positions[r][i] [matches planted mistake 'not_unsharded']")
                return Diagnosis("ring_attention", False, f"{call}: {why}", bug="not_unsharded")
            err = float(np.nanmax(np.abs(out - _float(want)))) if not np.isnan(out).all() else float("nan")
            return Diagnosis("ring_attention", False,
                             f"{call}: differs from one-process attention (max error {err:.3g}); no "
                             f"known mistake fits. Start each rank at out 0, lse -inf; at each of W steps "
                             f"call ring_step on the block it holds, then pass (k, v, k_pos) to rank r + 1; "
                             f"put the outputs back in sequence order")
    return Diagnosis("ring_attention", True,
                     f"ring_attention equals one-process attention on {len(cases)} rings (both layouts, "
                     f"causal and not), every rank attending to each block it needs once",
                     cases=tuple(str(c) for c in cases))


def check_ring(fn: Callable, namespace: dict | None = None, cases: Sequence[RingCase] = RING_CASES) -> str:
    """`ring_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return ring_diagnosis(fn, namespace, cases).check()


# ---- part 5: the causal work per rank ----------------------------------------------------------
PAIRS_CASES: tuple[tuple[int, int, str], ...] = (
    (32, 4, "contiguous"), (32, 4, "zigzag"), (12, 3, "contiguous"), (24, 2, "zigzag"), (8, 1, "zigzag"),
    (40, 5, "zigzag"), (18, 6, "contiguous"))
"""(T, world_size, layout) causal_pairs is checked on."""


def _pair_slips(T: int, W: int, layout: str) -> dict[str, tuple[list[int], str]]:
    """The usual wrong counts for a case: name -> (per-rank counts, what they mean)."""
    right = _work(T, W, layout)
    T_r = T // W
    other = "zigzag" if layout == "contiguous" else "contiguous"
    blocks = [r + 1 for r in range(W)] if layout == "contiguous" else [W] * W
    return {
        "strict": ([n - T_r for n in right], "that leaves out each query's own key: under the causal "
                   "mask query t sees keys 0..t, t + 1 of them (<=, not <)"),
        "no_mask": ([T_r * T] * W, "that is every (query, key) pair, T/W x T per rank: the causal mask "
                    "leaves query t only the keys at positions <= t"),
        "own_block": ([T_r * (T_r + 1) // 2] * W, "that counts only the rank's own block (its queries "
                      "against its own keys); each query sees every earlier key, on any rank"),
        "other_layout": (_work(T, W, other), f"that is the {other} layout's count; this case is "
                         f"{layout}"),
        "blocks": (blocks, "that counts blocks, not (query, key) pairs"),
        "total": ([T * (T + 1) // 2] * W, "that is the whole causal triangle, T (T + 1) / 2: give each "
                  "rank its own share"),
    }


def pairs_diagnosis(fn: Callable, namespace: dict | None = None,
                    cases: Sequence[tuple[int, int, str]] = PAIRS_CASES) -> Diagnosis:
    """fn(T, W, layout) must give the allowed (query, key) pairs of each rank (parallel.causal_work)."""
    swap = swapped_in(namespace, {"zigzag_positions": reference_zigzag_positions},
                      needed=("zigzag_positions",)) if namespace is not None else nullcontext()
    with swap:
        for T, W, layout in cases:
            call = f"causal_pairs({T}, {W}, {layout!r})"
            want = _work(T, W, layout)
            got, problem = _run(fn, T, W, layout)
            if problem:
                return Diagnosis("causal_pairs", False, f"{call} {problem}")
            try:
                arr = np.asarray(_to_numpy(got) if not isinstance(got, list | tuple)
                                 else [_to_numpy(x) for x in got], dtype=np.float64).ravel()
            except Exception:
                return Diagnosis("causal_pairs", False, f"{call} must return W numbers, one per rank; got {got!r}")
            if arr.shape != (W,):
                return Diagnosis("causal_pairs", False, f"{call} must return world_size = {W} numbers, one "
                                 f"per rank; got {arr.size}")
            if np.array_equal(arr, np.array(want, dtype=np.float64)):
                continue
            mine = [int(x) if float(x).is_integer() else float(x) for x in arr]
            why = next((msg for slip, msg in _pair_slips(T, W, layout).values()
                        if slip != want and mine == slip),
                       "no usual slip fits: rank r scores, for each of its queries at position t, the "
                       "t + 1 keys at positions 0..t")
            return Diagnosis("causal_pairs", False, f"{call} returned {mine}, expected {want}: {why}")
    return Diagnosis("causal_pairs", True,
                     f"causal_pairs matches on {len(cases)} layouts: contiguous ranks grow, zigzag ranks "
                     f"are equal", cases=tuple(f"T={T}, W={W}, {lay}" for T, W, lay in cases))


def check_pairs(fn: Callable, namespace: dict | None = None,
                cases: Sequence[tuple[int, int, str]] = PAIRS_CASES) -> str:
    """`pairs_diagnosis(...).check()`: the success line, or AssertionError naming the slip."""
    __tracebackhide__ = True
    return pairs_diagnosis(fn, namespace, cases).check()


ALLOWED: dict[str, tuple] = {
    "step": (_merge,),
    "ring": (_merge, reference_zigzag_positions, StepRecorder),
    "pairs": (reference_zigzag_positions,),
}
"""What each later part's code may run: the earlier parts' references the test swaps in."""

