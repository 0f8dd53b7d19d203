"""Say what is wrong with a student's FlashAttention (12_flash_attention.ipynb, the tiled backward
of 15_backward_pass.ipynb, A8), as `mha_course.diagnose.parallel` does for ring attention.

    check_update(online_update)                  # one block folded into the running (m, ell, acc)
    check_forward(flash_forward, globals())      # the tiled forward, built from online_update: (out, lse)
    check_backward(flash_backward)               # the tiled backward from out and lse: (dq, dk, dv)
    check_bytes(hbm_bytes)                       # the HBM bytes of the materialised path, one head
    (each has a *_diagnosis twin that returns the Diagnosis object instead of raising)

How it decides. Every verdict rests on values, in float64, against an independent reference
written here (`_attend`: the whole (T, S) matrix at once, its softmax, the row logsumexp and the
gradients of softmax(q k^T / sqrt(d_k)) v), never against the code under test. Where a value is
wrong, the planted versions of the usual mistakes (`UPDATE_MISTAKES`, `FORWARD_MISTAKES`,
`BACKWARD_MISTAKES`, `_byte_slips`) run on the same inputs and the one that matches is named.

Graded on its own: `check_forward` swaps the reference `online_update` (`flash._update`, bound at
import) into the student's namespace (`diagnose.swapped_in`) and counts its calls, so a wrong
update costs only the update's points; a missing one is put in too, with a note.

Shape legend: B batch, h heads, T queries, S keys, d_k head width (d_v = d_k here); a state is
m (..., rows, 1), ell (..., rows, 1), acc (..., rows, d_k), as `mha.attention.flash.State`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

# Bound at import: a grader's diagnose.refusing(flash, ...) cannot reach what the verdicts use.
from mha.attention.flash import _update as _flash_update
from mha_course.diagnose import Diagnosis, _to_numpy, swapped_in
from mha_course.diagnose import run_student as _run

RTOL, ATOL = 1e-9, 1e-10  # float64 throughout: any right order of operations lands far inside



def _tile_allowed(t0: int, t1: int, s0: int, s1: int, offset: int, mask: str) -> np.ndarray:
    """(bq, bk) causal mask of a tile: from global positions, or (planted, mask="local") a tril of the tile."""
    if mask == "local":
        return np.tril(np.ones((t1 - t0, s1 - s0), dtype=bool))
    return np.arange(s0, s1)[None, :] <= np.arange(t0, t1)[:, None] + offset

def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape and values; -inf where the other has -inf; NaN only where the other has NaN."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))


def _arrays(result: Any, what: str, names: tuple[str, ...], shapes: tuple[tuple[int, ...], ...]
            ) -> tuple[list[np.ndarray] | None, str | None]:
    """The student's tuple of arrays as float64, each of its shape; or a problem in words."""
    n = len(names)
    if result is None:
        return None, f"{what} returned None: did you forget the `return ({', '.join(names)})`?"
    if not isinstance(result, tuple | list) or len(result) != n:
        got = type(result).__name__ + (f" of {len(result)}" if isinstance(result, tuple | list) else "")
        return None, f"{what} must return {n} things, ({', '.join(names)}); got {got}"
    arrays = []
    for name, x, shape in zip(names, result, shapes, strict=True):
        try:
            a = np.asarray(_to_numpy(x), dtype=np.float64)
        except Exception as e:
            return None, f"{what} returned {name} that is not an array ({type(e).__name__}: {e})"
        if a.shape != shape:
            hint = " (drop the keepdims axis)" if a.shape == shape + (1,) else \
                " (keep the last axis of length 1, keepdims=True)" if shape[-1:] == (1,) and a.shape == shape[:-1] else ""
            return None, f"{what} returned {name} of shape {a.shape}; expected {shape}{hint}"
        arrays.append(a)
    return arrays, None


def _first_difference(got: Sequence[np.ndarray], want: Sequence[np.ndarray], names: Sequence[str]) -> str:
    """Where the student's arrays first differ from the right ones, in words."""
    for name, g, w in zip(names, got, want, strict=True):
        if np.isnan(g).any() and not np.isnan(w).any():
            idx = tuple(int(i) for i in np.argwhere(np.isnan(g))[0])
            return f"{name} has NaN (first at index {list(idx)}), where the right answer has none"
        if not _close(g, w):
            bad = ~np.isclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True)
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return f"{name}{list(idx)} is {g[idx]:.6g}, expected {w[idx]:.6g}"
    return "it differs"


def _bug_of(why: str) -> str | None:
    """'name' from a message ending in "[matches planted mistake 'name']", else None."""
    return why.rsplit("'", 2)[-2] if "planted mistake '" in why else None


def _planted(mistakes: Mapping[str, tuple[Callable, str]], args: tuple, what: str,
             names: tuple[str, ...], shapes: tuple, got: Sequence[np.ndarray]) -> str | None:
    """'why [matches planted mistake 'name']' for the first planted version whose values are the student's."""
    for name, (fn, why) in mistakes.items():
        theirs, problem = _run(fn, *(a.copy() if isinstance(a, np.ndarray) else a for a in args))
        if problem:
            continue
        arrays, problem = _arrays(theirs, what, names, shapes)
        if problem:
            continue
        if all(_close(g, p) for g, p in zip(got, arrays, strict=True)):
            return f"{why} [matches planted mistake '{name}']"
    return None


def _verdict(target: str, fn: Callable, args: tuple, want: Sequence[np.ndarray], names: tuple[str, ...],
             mistakes: Mapping[str, tuple[Callable, str]], call: str, hint: str) -> Diagnosis | None:
    """Run fn on args; None if it gives `want`, else the Diagnosis (a planted mistake named if one fits)."""
    shapes = tuple(w.shape for w in want)
    got, problem = _run(fn, *(a.copy() if isinstance(a, np.ndarray) else a for a in args))
    if problem is None:
        got, problem = _arrays(got, target, names, shapes)
    if problem:
        return Diagnosis(target, False, f"{call}: {problem}")
    if all(_close(g, w) for g, w in zip(got, want, strict=True)):
        return None
    why = _planted(mistakes, args, target, names, shapes, got) or (
        f"{_first_difference(got, want, names)}; no known mistake fits. {hint}")
    return Diagnosis(target, False, f"{call}: {why}", bug=_bug_of(why))


def _randn(shape: tuple[int, ...], seed: int, n: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


# ---- the independent reference ---------------------------------------------------------------
def _allowed(T: int, S: int, causal: bool, offset: int) -> np.ndarray | None:
    """(T, S) True where query t may see key s (s <= t + offset), or None without a mask."""
    if not causal:
        return None
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + offset


def _attend(q, k, v, allowed):
    """Softmax attention in one pass over the whole (T, S): (out, lse, weights); empty rows 0, -inf."""
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)  # (B, h, T, 1)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)  # (B, h, T, 1)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # (B, h, T, S)
    with np.errstate(divide="ignore"):
        lse = (top + np.log(total))[..., 0]  # (B, h, T): -inf where nothing is allowed
    return w @ v, lse, w


def _attend_backward(q, k, v, dout, allowed):
    """(dq, dk, dv) of softmax(q k^T / sqrt(d_k)) v, from the whole weight matrix."""
    _, _, w = _attend(q, k, v, allowed)
    scale = 1.0 / math.sqrt(q.shape[-1])
    dv = w.swapaxes(-1, -2) @ dout  # (B,h,S,T) @ (B,h,T,d) -> (B,h,S,d)
    dw = dout @ v.swapaxes(-1, -2)  # (B,h,T,d) @ (B,h,d,S) -> (B,h,T,S)
    ds = w * (dw - (w * dw).sum(axis=-1, keepdims=True)) * scale  # (B, h, T, S)
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


def _update_ref(m, ell, acc, scores, v_block):
    """One block into the state, written again here (the verdicts never run the code they judge)."""
    m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))  # (..., rows, 1)
    base = np.where(np.isfinite(m_new), m_new, 0.0)
    p = np.exp(scores - base)  # (..., rows, bk)
    alpha = np.exp(m - base)  # (..., rows, 1)
    return m_new, alpha * ell + p.sum(axis=-1, keepdims=True), alpha * acc + p @ v_block


# ---- the reference a later part runs with (swapped in) ----------------------------------------
def reference_online_update(m, ell, acc, scores, v_block):
    """`mha.attention.flash._update` with the student's calling convention: (m, ell, acc) -> new (m, ell, acc)."""
    scores = np.array(scores, dtype=np.result_type(scores, v_block), copy=True)  # _update consumes it
    return _flash_update((np.asarray(m), np.asarray(ell), np.array(acc, copy=True)), scores,
                         np.asarray(v_block))


class UpdateRecorder:
    """The reference online_update, its calls counted."""

    def __init__(self):
        self.calls = 0

    def __call__(self, m, ell, acc, scores, v_block):
        self.calls += 1
        return reference_online_update(m, ell, acc, scores, v_block)


# ---- part 1: the online update -------------------------------------------------------------------
@dataclass(frozen=True)
class UpdateCase:
    """A running state over a first block of keys, then a second block folded in."""

    kind: str  # "grows", "shrinks", "first", "empty_rows", "huge"
    B: int = 2
    h: int = 2
    rows: int = 5
    bk: int = 4
    d_k: int = 3
    seed: int = 0

    def __str__(self) -> str:
        return {"grows": "the second block holds larger scores (the max grows)",
                "shrinks": "the second block's scores are all smaller than the running max",
                "first": "the first block (from m = -inf, ell = 0, acc = 0)",
                "empty_rows": "rows 1 and 3 with every key masked so far (m = -inf, scores -inf)",
                "huge": "scores near 1000 (exp overflows without the max)"}[self.kind] + \
            f" (lead ({self.B}, {self.h}), rows={self.rows}, bk={self.bk}, d_k={self.d_k})"


UPDATE_CASES: tuple[UpdateCase, ...] = (
    UpdateCase("grows"), UpdateCase("shrinks", seed=1), UpdateCase("empty_rows", seed=2),
    UpdateCase("first", 1, 3, 4, 6, 2, seed=3), UpdateCase("huge", seed=4),
    UpdateCase("grows", 1, 1, 7, 3, 5, seed=5), UpdateCase("shrinks", 3, 1, 2, 8, 4, seed=6))
"""The blocks an update is judged on: each usual mistake fails on one of the first three."""


def update_inputs(case: UpdateCase) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """((m, ell, acc, scores, v_block), the right (m, ell, acc)) for a case."""
    lead = (case.B, case.h)
    rng = np.random.default_rng(case.seed)
    s1 = rng.standard_normal(lead + (case.rows, case.bk + 1))  # the first block's scores
    v1 = rng.standard_normal(lead + (case.bk + 1, case.d_k))
    s2 = rng.standard_normal(lead + (case.rows, case.bk))  # the block to fold in
    v2 = rng.standard_normal(lead + (case.bk, case.d_k))
    if case.kind == "grows":
        s2 = s2 + 3.0
    if case.kind == "shrinks":
        s2 = s2 - 3.0
    if case.kind == "huge":
        s1, s2 = s1 + 1000.0, s2 + 1001.0
    if case.kind == "empty_rows":
        s1[..., [1, 3], :] = -np.inf
        s2[..., 1, :] = -np.inf  # row 1 still sees nothing; row 3 sees its first keys now
        s2[..., 0, 0] = -np.inf  # a masked key in a row that sees others
    m = np.full(lead + (case.rows, 1), -np.inf)
    ell, acc = np.zeros_like(m), np.zeros(lead + (case.rows, case.d_k))
    if case.kind != "first":
        m, ell, acc = _update_ref(m, ell, acc, s1, v1)
    args = (m, ell, acc, s2, v2)
    return args, _update_ref(*args)


def _u_no_rescale(m, ell, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    p = np.exp(s - np.where(np.isfinite(m_new), m_new, 0.0))
    return m_new, ell + p.sum(axis=-1, keepdims=True), acc + p @ v


def _u_rescale(which: str) -> Callable:
    def update(m, ell, acc, s, v):
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        base = np.where(np.isfinite(m_new), m_new, 0.0)
        p, alpha = np.exp(s - base), np.exp(m - base)
        return (m_new, (alpha if which == "ell" else 1.0) * ell + p.sum(axis=-1, keepdims=True),
                (alpha if which == "acc" else 1.0) * acc + p @ v)
    return update


def _u_nan(m, ell, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    p, alpha = np.exp(s - m_new), np.exp(m - m_new)
    return m_new, alpha * ell + p.sum(axis=-1, keepdims=True), alpha * acc + p @ v


def _u_block_max(m, ell, acc, s, v):
    m_new = s.max(axis=-1, keepdims=True)  # the block alone
    base = np.where(np.isfinite(m_new), m_new, 0.0)
    p, alpha = np.exp(s - base), np.exp(m - base)
    return m_new, alpha * ell + p.sum(axis=-1, keepdims=True), alpha * acc + p @ v


def _u_normalised(m, ell, acc, s, v):
    m_new, ell_new, acc_new = _update_ref(m, ell, acc, s, v)
    return m_new, ell_new, np.divide(acc_new, ell_new, out=np.zeros_like(acc_new), where=ell_new > 0)


UPDATE_MISTAKES: dict[str, tuple[Callable, str]] = {
    "no_rescale": (_u_no_rescale,
                   "ell and acc were not rescaled when the max changed: what was summed under the old max "
                   "must be multiplied by exp(m_old - m_new) before the new block's terms are added"),
    "rescale_ell_only": (_u_rescale("ell"),
                         "only ell was rescaled by exp(m_old - m_new): acc was summed under the old max "
                         "too, so it needs the same factor"),
    "rescale_acc_only": (_u_rescale("acc"),
                         "only acc was rescaled by exp(m_old - m_new): ell was summed under the old max "
                         "too, so it needs the same factor"),
    "nan_empty": (_u_nan,
                  "NaN on a row with nothing allowed yet: m_old and m_new are both -inf there and "
                  "exp(-inf - (-inf)) is NaN. Subtract m_new only where it is finite, e.g. "
                  "np.where(np.isfinite(m_new), m_new, 0.0): such a row keeps m = -inf, ell = 0, acc = 0"),
    "block_max": (_u_block_max,
                  "the new max came from this block alone: the running max is max(m_old, the block's "
                  "max), or a block of small scores lowers m and the sums stop meaning sum(exp(score - m))"),
    "normalised": (_u_normalised,
                   "acc was divided by ell inside the update: acc stays unnormalised (sum p v) until the "
                   "last block, and the division happens once, at the end"),
}
"""The planted updates the diagnosis runs beside a student's: (function, what it shows)."""

_STATE = ("m", "ell", "acc")


def update_diagnosis(fn: Callable, cases: Sequence[UpdateCase] = UPDATE_CASES) -> Diagnosis:
    """fn(m, ell, acc, scores, v_block) on each case must give the state over both blocks."""
    for case in cases:
        args, want = update_inputs(case)
        if d := _verdict("online_update", fn, args, want, _STATE, UPDATE_MISTAKES, f"online_update on {case}",
                         "m_new = max(m, block max); alpha = exp(m - m_new); ell = alpha ell + sum "
                         "exp(scores - m_new); acc = alpha acc + exp(scores - m_new) @ v_block"):
            return d
    return Diagnosis("online_update", True,
                     f"online_update gives the running (m, ell, acc) on {len(cases)} blocks (the max "
                     f"growing and not, rows with nothing allowed yet, scores near 1000)",
                     cases=tuple(str(c) for c in cases))


def check_update(fn: Callable, cases: Sequence[UpdateCase] = UPDATE_CASES) -> str:
    """`update_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return update_diagnosis(fn, cases).check()


# ---- part 2: the tiled forward -------------------------------------------------------------------
@dataclass(frozen=True)
class FlashCase:
    """Tiled attention of q (B, h, T, d_k), k and v (B, h, S, d_k) in (block_q, block_k) tiles."""

    B: int
    h: int
    T: int
    S: int
    d_k: int
    causal: bool
    block_q: int
    block_k: int
    offset: int = 0
    seed: int = 0

    def __str__(self) -> str:
        off = f", offset={self.offset}" if self.offset else ""
        return (f"(B, h, T, S, d_k) = ({self.B}, {self.h}, {self.T}, {self.S}, {self.d_k}), "
                f"causal={self.causal}{off}, block_q={self.block_q}, block_k={self.block_k}")

    @property
    def allowed(self) -> np.ndarray | None:
        return _allowed(self.T, self.S, self.causal, self.offset)


FORWARD_CASES: tuple[FlashCase, ...] = (
    FlashCase(2, 2, 16, 16, 4, True, 4, 4, seed=0),
    FlashCase(1, 2, 10, 13, 4, False, 4, 5, seed=1),
    FlashCase(1, 2, 12, 6, 4, True, 4, 4, offset=-6, seed=2),
    FlashCase(2, 1, 13, 13, 8, True, 4, 5, seed=3),
    FlashCase(1, 1, 7, 21, 3, True, 3, 8, offset=14, seed=4),
    FlashCase(1, 3, 5, 5, 2, False, 16, 16, seed=5),
    FlashCase(2, 2, 9, 17, 4, True, 2, 3, offset=8, seed=6),
)
"""The shapes flash_forward is judged on: each usual mistake fails on one of the first three
(the third has rows that see no key: offset = S - T < 0)."""


def flash_truth(case: FlashCase, seed_base: int = 0) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, np.ndarray]]:
    """((q, k, v), (out, lse) of one pass over the whole matrix) for a case."""
    q, = _randn((case.B, case.h, case.T, case.d_k), seed_base + case.seed, 1)
    k, v = _randn((case.B, case.h, case.S, case.d_k), seed_base + case.seed + 50, 2)
    out, lse, _ = _attend(q, k, v, case.allowed)
    return (q, k, v), (out, lse)


def planted_forward(mask: str = "global", ragged: str = "both", divide: str = "safe",
                    lse: str = "right", scale: bool = True, skip: bool = True) -> Callable:
    """The tiled forward with one usual mistake (the defaults make it right)."""
    def forward(q, k, v, causal=False, block_q=16, block_k=16, offset=0):
        B, h, T, d_k = q.shape
        S = k.shape[2]
        out, lse_all = np.zeros((B, h, T, v.shape[-1])), np.full((B, h, T), -np.inf)
        sc = 1.0 / math.sqrt(d_k) if scale else 1.0
        t_stop = T if ragged in ("both", "k") else T - T % block_q  # ragged: the tails kept
        s_stop = S if ragged in ("both", "q") else S - S % block_k
        for t0 in range(0, t_stop, block_q):
            t1 = min(t0 + block_q, T)
            m = np.full((B, h, t1 - t0, 1), -np.inf)
            ell, acc = np.zeros_like(m), np.zeros((B, h, t1 - t0, v.shape[-1]))
            for s0 in range(0, s_stop, block_k):
                s1 = min(s0 + block_k, S)
                if causal and skip and s0 > t1 - 1 + offset:
                    break  # above the diagonal (the tiles a kernel skips)
                scores = q[:, :, t0:t1] @ k[:, :, s0:s1].swapaxes(-1, -2) * sc
                if causal:
                    scores = np.where(_tile_allowed(t0, t1, s0, s1, offset, mask), scores, -np.inf)
                m, ell, acc = _update_ref(m, ell, acc, scores, v[:, :, s0:s1])
            if divide == "none":
                o = acc
            elif divide == "plain":
                o = acc / ell
            else:
                o = np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)
            with np.errstate(divide="ignore"):
                l_ = m[..., 0] if lse == "m" else (m + np.log(ell))[..., 0]
            out[:, :, t0:t1], lse_all[:, :, t0:t1] = o, l_
        return out, lse_all
    return forward


_LOCAL = ("the causal mask was built from the tile's own indices (a tril of block_q x block_k): that is "
          "right only on tiles that sit on the diagonal. Compare global positions: key s0 + j may be "
          "seen by query t0 + i when s0 + j <= t0 + i + offset")
_RAGGED = ("the last, shorter tile was dropped: when T (or S) is not a multiple of the block, "
           "range(0, T, block_q) with t1 = min(t0 + block_q, T) still covers the tail")

FORWARD_MISTAKES: dict[str, tuple[Callable, str]] = {
    "local_mask": (planted_forward(mask="local"), _LOCAL),
    "local_mask_all_tiles": (planted_forward(mask="local", skip=False), _LOCAL),
    "ragged_dropped": (planted_forward(ragged="none"), _RAGGED),
    "ragged_q_dropped": (planted_forward(ragged="k"), _RAGGED),
    "ragged_k_dropped": (planted_forward(ragged="q"), _RAGGED),
    "no_division": (planted_forward(divide="none"),
                    "the output was never divided by ell: acc is the unnormalised sum p v; out = acc / ell, "
                    "once, after the last key block"),
    "divide_by_zero": (planted_forward(divide="plain"),
                       "NaN on the rows that see no key (ell = 0 there): such a row's output is 0 and its "
                       "lse -inf, e.g. np.divide(acc, ell, out=np.zeros_like(acc), where=ell > 0)"),
    "lse_is_m": (planted_forward(lse="m"),
                 "lse came back as the running max m alone: the row's logsumexp is m + log(ell)"),
    "unscaled": (planted_forward(scale=False), "the scores are not divided by sqrt(d_k)"),
}
"""The planted forwards the diagnosis runs beside a student's: (function, what it shows)."""


_FORWARD_HINT = ("For each query block start from m = -inf, ell = 0, acc = 0; for each key block scale, "
                 "mask by global positions and call online_update; then out = acc / ell (0 where ell = 0), "
                 "lse = m + log(ell)")


def forward_diagnosis(fn: Callable, namespace: dict | None = None,
                      cases: Sequence[FlashCase] = FORWARD_CASES) -> Diagnosis:
    """fn(q, k, v, causal, block_q, block_k, offset) must equal one pass: (out, lse).

    With `namespace` (the student's globals), online_update there is the reference meanwhile,
    its calls counted: the forward must be built from it.
    """
    recorder = UpdateRecorder()
    swap = swapped_in(namespace, {"online_update": recorder}, needed=("online_update",)) \
        if namespace is not None else nullcontext()
    with swap:
        for case in cases:
            (q, k, v), want = flash_truth(case)
            shapes = (want[0].shape, want[1].shape)
            recorder.calls = 0
            call = f"flash_forward on {case}"
            args = (q, k, v, case.causal, case.block_q, case.block_k, case.offset)
            got, problem = _run(fn, *(a.copy() if isinstance(a, np.ndarray) else a for a in args))
            if problem is None:
                got, problem = _arrays(got, "flash_forward", ("out", "lse"), shapes)
            if problem:
                return Diagnosis("flash_forward", False, f"{call}: {problem}")
            if namespace is not None and recorder.calls == 0:
                return Diagnosis("flash_forward", False,
                                 f"{call}: never called online_update: build the forward from part 1's "
                                 f"online_update, one call per (query block, key block) tile (the test "
                                 f"swaps in the reference and counts the calls)", bug="no_update_calls")
            if all(_close(g, w) for g, w in zip(got, want, strict=True)):
                continue
            why = _planted(FORWARD_MISTAKES, args, "flash_forward", ("out", "lse"), shapes, got) or (
                f"{_first_difference(got, want, ('out', 'lse'))}; no known mistake fits. {_FORWARD_HINT}")
            return Diagnosis("flash_forward", False, f"{call}: {why}", bug=_bug_of(why))
    return Diagnosis("flash_forward", True,
                     f"flash_forward equals one pass over the whole matrix on {len(cases)} shapes "
                     f"(causal and not, ragged tiles, rows that see no key), built from online_update",
                     cases=tuple(str(c) for c in cases))


def check_forward(fn: Callable, namespace: dict | None = None,
                  cases: Sequence[FlashCase] = FORWARD_CASES) -> str:
    """`forward_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return forward_diagnosis(fn, namespace, cases).check()


# ---- part 3: the tiled backward ------------------------------------------------------------------
BACKWARD_CASES: tuple[FlashCase, ...] = (
    FlashCase(2, 2, 12, 12, 4, True, 4, 4, seed=10),
    FlashCase(1, 2, 10, 14, 4, False, 4, 5, seed=11),
    FlashCase(2, 1, 13, 13, 8, True, 4, 5, seed=12),
    FlashCase(1, 1, 7, 19, 3, True, 3, 8, offset=12, seed=13),
    FlashCase(1, 3, 5, 5, 2, False, 16, 16, seed=14),
    FlashCase(1, 2, 9, 9, 4, True, 2, 3, seed=15),
)
"""The shapes flash_backward is judged on: each usual mistake fails on one of the first two."""


def backward_inputs(case: FlashCase) -> tuple[tuple, tuple[np.ndarray, ...]]:
    """((q, k, v, out, lse, dout, causal, block_q, block_k, offset), the right (dq, dk, dv))."""
    (q, k, v), (out, lse) = flash_truth(case, seed_base=300)
    dout, = _randn(out.shape, 400 + case.seed, 1)
    want = _attend_backward(q, k, v, dout, case.allowed)
    return (q, k, v, out, lse, dout, case.causal, case.block_q, case.block_k, case.offset), want


def planted_backward(delta: str = "right", p_from: str = "lse", scale: bool = True,
                     overwrite: str = "", mask: str = "global") -> Callable:
    """The tiled backward (key blocks outside) with one usual mistake (the defaults make it right)."""
    def backward(q, k, v, out, lse, dout, causal=False, block_q=16, block_k=16, offset=0):
        T, d_k = q.shape[2], q.shape[3]
        S = k.shape[2]
        sc = 1.0 / math.sqrt(d_k)
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        rows = {"dout": dout.sum(axis=-1), "dout_sq": (dout * dout).sum(axis=-1)}.get(
            delta, (dout * out).sum(axis=-1))  # (B, h, T)
        base = np.where(np.isfinite(lse), lse, 0.0)
        for s0 in range(0, S, block_k):
            s1 = min(s0 + block_k, S)
            kj, vj = k[:, :, s0:s1], v[:, :, s0:s1]
            for t0 in range(0, T, block_q):
                t1 = min(t0 + block_q, T)
                scores = q[:, :, t0:t1] @ kj.swapaxes(-1, -2) * sc
                if causal:
                    scores = np.where(_tile_allowed(t0, t1, s0, s1, offset, mask), scores, -np.inf)
                if p_from == "tile_nan":  # a plain softmax over the tile: a row of -inf gives NaN
                    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
                    p = e / e.sum(axis=-1, keepdims=True)
                elif p_from == "tile":
                    top = scores.max(axis=-1, keepdims=True)
                    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
                    tot = e.sum(axis=-1, keepdims=True)
                    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
                else:
                    p = np.exp(scores - base[:, :, t0:t1, None])
                do = dout[:, :, t0:t1]
                dp = do @ vj.swapaxes(-1, -2)
                d_i = (p * dp).sum(axis=-1) if delta == "tile" else rows[:, :, t0:t1]
                ds = p * (dp - d_i[..., None]) * (sc if scale else 1.0)
                dv_i, dk_i = p.swapaxes(-1, -2) @ do, ds.swapaxes(-1, -2) @ q[:, :, t0:t1]
                if "v" in overwrite:
                    dv[:, :, s0:s1] = dv_i  # the last query block's share only
                else:
                    dv[:, :, s0:s1] += dv_i
                if "k" in overwrite:
                    dk[:, :, s0:s1] = dk_i
                else:
                    dk[:, :, s0:s1] += dk_i
                dq[:, :, t0:t1] += ds @ kj
        return dq, dk, dv
    return backward


_P_TILE = ("P was normalised over this tile's keys alone: recompute it with the row's logsumexp from the "
           "forward, P = exp(scores - lse), so the tile holds its share of the whole row")
_OVERWRITTEN = ("dk or dv was overwritten by each query block: a key receives gradient from every query "
                "block that sees it, so add (+=) over the query blocks")

BACKWARD_MISTAKES: dict[str, tuple[Callable, str]] = {
    "delta_from_dout": (planted_backward(delta="dout"),
                        "delta came from dout alone: it is rowsum(dout * out), one number per query row "
                        "(it equals rowsum(P * dP) over all the keys, which no single tile holds)"),
    "delta_dout_squared": (planted_backward(delta="dout_sq"),
                           "delta = rowsum(dout * dout): it pairs dout with out, the forward's "
                           "output, one number per query row (rowsum(P * dP) over all the keys)"),
    "delta_from_tile": (planted_backward(delta="tile"),
                        "delta came from this tile's P and dP only: it is the sum over ALL the keys of the "
                        "row, rowsum(P * dP) = rowsum(dout * out); compute it once from dout and out"),
    "p_from_tile": (planted_backward(p_from="tile"), _P_TILE),
    "p_from_tile_nan": (planted_backward(p_from="tile_nan"), _P_TILE),
    "unscaled_grads": (planted_backward(scale=False),
                       "dq and dk miss the 1/sqrt(d_k): the scores are q k^T / sqrt(d_k), so dS carries "
                       "that factor into dq = dS k and dk = dS^T q"),
    "overwritten": (planted_backward(overwrite="kv"), _OVERWRITTEN),
    "overwritten_dk": (planted_backward(overwrite="k"), _OVERWRITTEN),
    "overwritten_dv": (planted_backward(overwrite="v"), _OVERWRITTEN),
    "local_mask": (planted_backward(mask="local"), _LOCAL),
}
"""The planted backwards the diagnosis runs beside a student's: (function, what it shows)."""

_GRADS = ("dq", "dk", "dv")


def backward_diagnosis(fn: Callable, cases: Sequence[FlashCase] = BACKWARD_CASES) -> Diagnosis:
    """fn(q, k, v, out, lse, dout, causal, block_q, block_k, offset) must give (dq, dk, dv)."""
    for case in cases:
        args, want = backward_inputs(case)
        if d := _verdict("flash_backward", fn, args, want, _GRADS, BACKWARD_MISTAKES,
                         f"flash_backward on {case}",
                         "delta = rowsum(dout * out); per tile P = exp(scale q k^T - lse) (masked by global "
                         "positions), dv += P^T dout, dP = dout v^T, dS = P (dP - delta) scale, dq += dS k, "
                         "dk += dS^T q"):
            return d
    return Diagnosis("flash_backward", True,
                     f"flash_backward gives dq, dk and dv of attention on {len(cases)} shapes (causal "
                     f"and not, ragged tiles), from out and lse alone", cases=tuple(str(c) for c in cases))


def check_backward(fn: Callable, cases: Sequence[FlashCase] = BACKWARD_CASES) -> str:
    """`backward_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return backward_diagnosis(fn, cases).check()


# ---- part 4: the bytes of the materialised path --------------------------------------------------
BYTES_CASES: tuple[tuple[int, int, int, int], ...] = (
    (512, 2048, 128, 4), (1024, 1024, 64, 2), (1, 4096, 128, 2), (3, 5, 7, 8), (4096, 4096, 64, 1))
"""(T, S, d, itemsize) hbm_bytes is checked on: T != S and d != itemsize tell the slips apart."""


def _byte_slips(T: int, S: int, d: int, itemsize: int) -> dict[str, tuple[int, str]]:
    """The usual wrong counts for a case: name -> (bytes, what they mean)."""
    io = 2 * T * d + 2 * S * d
    return {
        "ts_once": (itemsize * (io + T * S), "the (T, S) matrix is moved four times, not once: the scores "
                    "written, read by the softmax, the weights written, read by P V"),
        "ts_twice": (itemsize * (io + 2 * T * S), "the (T, S) matrix is moved four times, not twice: the "
                     "scores written and read back, then the weights written and read back"),
        "ts_three": (itemsize * (io + 3 * T * S), "the (T, S) matrix is moved four times, not three: the "
                     "scores written and read back, then the weights written and read back"),
        "no_q_or_out": (itemsize * (io - T * d + 4 * T * S), "one T x d term is missing: q must be read "
                        "and the output written, T d elements each"),
        "no_k_or_v": (itemsize * (io - S * d + 4 * T * S), "one S x d term is missing: k and v must both "
                      "be read, S d elements each"),
        "no_qkv_out": (itemsize * 4 * T * S, "q, k, v read and the output written count too"),
        "no_itemsize": (io + 4 * T * S, "that counts elements, not bytes: multiply by itemsize"),
    }


def bytes_diagnosis(fn: Callable, cases: Sequence[tuple[int, int, int, int]] = BYTES_CASES) -> Diagnosis:
    """fn(T, S, d, itemsize) must give the materialised path's HBM bytes for one head."""
    for T, S, d, itemsize in cases:
        call = f"hbm_bytes({T}, {S}, {d}, {itemsize})"
        want = itemsize * (2 * T * d + 2 * S * d + 4 * T * S)
        got, problem = _run(fn, T, S, d, itemsize)
        if problem:
            return Diagnosis("hbm_bytes", False, f"{call} {problem}")
        try:
            value = float(np.asarray(_to_numpy(got), dtype=np.float64))
        except Exception:
            return Diagnosis("hbm_bytes", False, f"{call} must return one number of bytes; got {got!r}")
        if value == want:
            continue
        mine = int(value) if value.is_integer() else value
        why = next((f"{msg} [matches planted mistake '{name}']"
                    for name, (slip, msg) in _byte_slips(T, S, d, itemsize).items() if slip == value),
                   "no usual slip fits: read q and k (T d + S d), write the scores (T S), read them and "
                   "write the weights (2 T S), read the weights and v (T S + S d), write out (T d); "
                   "times itemsize")
        return Diagnosis("hbm_bytes", False, f"{call} returned {mine}, expected {want}: {why}",
                         bug=_bug_of(why))
    return Diagnosis("hbm_bytes", True,
                     f"hbm_bytes matches the materialised path on {len(cases)} shapes: itemsize "
                     f"(2 T d + 2 S d + 4 T S)", cases=tuple(str(c) for c in cases))


def check_bytes(fn: Callable, cases: Sequence[tuple[int, int, int, int]] = BYTES_CASES) -> str:
    """`bytes_diagnosis(...).check()`: the success line, or AssertionError naming the slip."""
    __tracebackhide__ = True
    return bytes_diagnosis(fn, cases).check()


ALLOWED: dict[str, tuple] = {
    "forward": (reference_online_update, UpdateRecorder),
}
"""What each later part's code may run: the earlier parts' references the test swaps in."""
