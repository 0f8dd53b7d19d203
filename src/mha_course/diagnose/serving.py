"""Say what is wrong with a student's paged KV cache and scheduler (18_serving.ipynb, A9), as
`mha_course.diagnose.flash` does for FlashAttention.

    check_lookup(locate, gather)      # where token i lives (block, offset); a sequence's rows, gathered
    check_append(append_token)        # one token appended: a new block when full, copy-on-write first
    check_step(schedule_step)         # one scheduler step: admit, one batched call, retire, preempt
    check_saved(prefix_bytes_saved)   # the bytes prefix sharing saves for n requests
    (each has a *_diagnosis twin that returns the Diagnosis object instead of raising)

How it decides. Every verdict rests on behaviour, on drawn pools and request streams, against an
independent reference written here (never the library's `mha.inference.paged` or `serving`, and
never the code under test). Block ids are the student's to choose: an append is judged by what
reads back through the tables (the sequence's rows, every other sequence's blocks untouched), by
the reference counts against the tables that hold each block and by the free list, not by which
block it took. A scheduler step is judged by the state it returns (running and waiting requests in
order, their tokens, the free block count, the finished ids) and by the calls it makes: one batched
`model` call that feeds each request its uncached tokens at the position where its cache ends, and
one `free` for each request whose blocks it gives back. Where a value is wrong, the planted
versions of the usual mistakes (`LOOKUP_MISTAKES`, `APPEND_MISTAKES`, `STEP_MISTAKES`,
`_saved_slips`) run on the same inputs and the one that behaves the same is named.

Shapes: a pool is (n_blocks, block_size, ...) (one layer's keys or values); a table is the list of
block ids of one sequence, in order; token i of a sequence sits in block table[i // block_size] at
offset i % block_size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha_course.diagnose import Diagnosis, _to_numpy
from mha_course.diagnose import run_student as _run


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks that hold n_tokens: the last one may be partly filled (ceil division)."""
    return -(-n_tokens // block_size)


def _bug_of(why: str) -> str | None:
    """'name' from a message ending in "[matches planted mistake 'name']", else None."""
    return why.rsplit("'", 2)[-2] if "planted mistake '" in why else None


def _ints(x: Any) -> list[int] | None:
    """A sequence of whole numbers (list, tuple, array) as Python ints, or None."""
    try:
        a = np.asarray(_to_numpy(x))
        if a.ndim != 1 or (a.size and not np.all(np.equal(np.mod(a.astype(np.float64), 1), 0))):
            return None
        return [int(v) for v in a]
    except Exception:
        return None


def _int(x: Any) -> int | None:
    """A whole number (int, np.int64, 3.0) as a Python int, or None."""
    try:
        v = float(np.asarray(_to_numpy(x)))
        return int(v) if v.is_integer() else None
    except Exception:
        return None


# ---- part 1: where token i lives, and a sequence gathered through its table -------------------
@dataclass(frozen=True)
class LookupCase:
    """A pool of random rows and one sequence's table (blocks out of order), `length` tokens."""

    n_blocks: int = 9
    block_size: int = 4
    width: tuple[int, ...] = (3,)
    n_table: int = 3
    partial: int = 2  # tokens in the last block (block_size: full)
    seed: int = 0

    @property
    def length(self) -> int:
        return (self.n_table - 1) * self.block_size + self.partial

    def __str__(self) -> str:
        return (f"pool ({self.n_blocks}, {self.block_size}, {', '.join(map(str, self.width))}), "
                f"a table of {self.n_table} blocks, {self.length} tokens")

    def inputs(self) -> tuple[np.ndarray, list[int]]:
        """(pool, table): the table's blocks drawn without repeats, never in sorted order."""
        rng = np.random.default_rng(self.seed)
        pool = rng.standard_normal((self.n_blocks, self.block_size) + self.width)
        table = [int(b) for b in rng.permutation(self.n_blocks)[:self.n_table]]
        if table == sorted(table) and len(table) > 1:
            table = table[::-1]
        if table[0] == 0 and len(table) > 1:
            table = table[1:] + table[:1]
        return pool, table


LOOKUP_CASES: tuple[LookupCase, ...] = (
    LookupCase(), LookupCase(6, 3, (2,), 2, 3, seed=1), LookupCase(12, 5, (2, 3), 4, 1, seed=2),
    LookupCase(4, 1, (2,), 3, 1, seed=3), LookupCase(20, 16, (4,), 5, 7, seed=4),
    LookupCase(7, 8, (), 1, 5, seed=5))
"""The tables lookup is judged on: each usual mistake fails on the first one."""


def reference_locate(table: Sequence[int], i: int, block_size: int) -> tuple[int, int]:
    """Token i of the sequence: (its block, its offset in the block)."""
    return int(table[i // block_size]), i % block_size


def reference_gather(pool: np.ndarray, table: Sequence[int], length: int) -> np.ndarray:
    """The sequence's `length` rows, block after block through its table: (length, ...)."""
    bs = pool.shape[1]
    rows = [pool[table[i // bs], i % bs] for i in range(length)]
    return np.stack(rows) if rows else np.zeros((0,) + pool.shape[2:], pool.dtype)


def _locate_logical(table, i, bs):
    return i // bs, i % bs


def _locate_plus_one(table, i, bs):
    return table[i // bs], i % bs + 1


def _locate_one_based(table, i, bs):
    return table[(i - 1) // bs], (i - 1) % bs


def _gather_whole(pool, table, length):
    return pool[list(table)].reshape((-1,) + pool.shape[2:])  # (n_table * bs, ...)


def _gather_sorted(pool, table, length):
    return pool[sorted(table)].reshape((-1,) + pool.shape[2:])[:length]


def _gather_contiguous(pool, table, length):
    return pool[:len(table)].reshape((-1,) + pool.shape[2:])[:length]


def _gather_one_short(pool, table, length):
    return pool[list(table)].reshape((-1,) + pool.shape[2:])[:length - 1]


LOOKUP_MISTAKES: dict[str, tuple[Callable, str]] = {
    "logical_block": (_locate_logical,
                      "that is the sequence's own block number i // block_size, not where it lives: "
                      "look it up in the table, table[i // block_size]"),
    "offset_plus_one": (_locate_plus_one,
                        "the offset is one too far: token i sits at i % block_size (0 to "
                        "block_size - 1) in its block"),
    "one_based": (_locate_one_based,
                  "token i was counted from 1: the first token, i = 0, sits in table[0] at offset 0"),
    "whole_blocks": (_gather_whole,
                     "every slot of the last block came back, also the ones not filled yet: take the "
                     "first `length` rows (the last block holds length - (blocks - 1) * block_size)"),
    "sorted_blocks": (_gather_sorted,
                      "the blocks came back in the order of their ids: read them in the table's "
                      "order, which is the sequence's order"),
    "contiguous": (_gather_contiguous,
                   "the first blocks of the pool came back, not the table's: a sequence's blocks "
                   "can be anywhere in the pool; read pool[table[j]] for each j"),
    "one_short": (_gather_one_short,
                  "one row short: the last block's fill count is off by one; a sequence of `length` "
                  "tokens has `length` rows"),
}
"""The planted lookups the diagnosis runs beside a student's: (function, what it shows)."""


def _located(fn: Callable, table: list[int], length: int, bs: int) -> tuple[list | None, str | None]:
    """[(block, offset) for each i] from fn, or a problem in words."""
    out = []
    for i in range(length):
        got, problem = _run(fn, list(table), i, bs)
        if problem:
            return None, f"locate(table, {i}, {bs}) {problem}"
        pair = _ints(got)
        if pair is None or len(pair) != 2:
            return None, f"locate(table, {i}, {bs}) must return (block, offset), two whole numbers; " \
                         f"got {got!r}"
        out.append(tuple(pair))
    return out, None


def lookup_diagnosis(locate: Callable, gather: Callable,
                     cases: Sequence[LookupCase] = LOOKUP_CASES) -> Diagnosis:
    """locate(table, i, block_size) -> (block, offset); gather(pool, table, length) -> (length, ...)."""
    for case in cases:
        pool, table = case.inputs()
        bs, L = case.block_size, case.length
        call = f"on {case}, table {table}"
        want = [reference_locate(table, i, bs) for i in range(L)]
        got, problem = _located(locate, table, L, bs)
        if problem:
            return Diagnosis("locate", False, f"{call}: {problem}")
        if got != want:
            i = next(j for j, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
            why = next((f"{msg} [matches planted mistake '{name}']"
                        for name, (fn, msg) in list(LOOKUP_MISTAKES.items())[:3]
                        if _located(fn, table, L, bs)[0] == got),
                       "no usual mistake fits: token i lives in block table[i // block_size] at "
                       "offset i % block_size")
            return Diagnosis("locate", False, f"locate {call}: token {i} gave {got[i]}, expected "
                                              f"{want[i]}: {why}", bug=_bug_of(why))
        want_rows = reference_gather(pool, table, L)
        out, problem = _run(gather, pool.copy(), list(table), L)
        if problem:
            return Diagnosis("gather", False, f"gather {call}: {problem}")
        try:
            rows = np.asarray(_to_numpy(out), dtype=np.float64)
        except Exception as e:
            return Diagnosis("gather", False, f"gather {call} must return an array of rows "
                                              f"({type(e).__name__}: {e})")
        if rows.shape == want_rows.shape and np.array_equal(rows, want_rows):
            continue
        why = None
        for name, (fn, msg) in list(LOOKUP_MISTAKES.items())[3:]:
            theirs, bad = _run(fn, pool.copy(), list(table), L)
            if not bad and np.shape(theirs) == rows.shape and np.array_equal(theirs, rows):
                why = f"{msg} [matches planted mistake '{name}']"
                break
        if why is None and rows.shape != want_rows.shape:
            why = f"returned shape {rows.shape}, expected {want_rows.shape} (length, ...)"
        elif why is None:
            r = int(np.argwhere((rows != want_rows).reshape(L, -1).any(axis=1))[0, 0])
            why = (f"row {r} (block {table[r // bs]}, offset {r % bs}) differs; no usual mistake "
                   f"fits: row i is pool[table[i // block_size], i % block_size]")
        return Diagnosis("gather", False, f"gather {call}: {why}", bug=_bug_of(why))
    return Diagnosis("lookup", True,
                     f"locate and gather read {len(cases)} sequences through their tables (blocks out "
                     f"of order, a partly filled last block, one-token blocks)",
                     cases=tuple(str(c) for c in cases))


def check_lookup(locate: Callable, gather: Callable, cases: Sequence[LookupCase] = LOOKUP_CASES) -> str:
    """`lookup_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return lookup_diagnosis(locate, gather, cases).check()


# ---- part 2: append one token, copy-on-write ---------------------------------------------------
def reference_append(K: np.ndarray, V: np.ndarray, refcounts: np.ndarray, free: list[int],
                     table: Sequence[int], length: int, k: np.ndarray, v: np.ndarray
                     ) -> tuple[list[int], int]:
    """Write token `length` of the sequence: a new block when the last is full (or there is none),
    a private copy first when the last is shared and partly filled. -> (table, length + 1)."""
    bs = K.shape[1]
    table = list(table)
    slot = length % bs
    if slot == 0:  # no block yet, or the last one is full
        b = free.pop()
        refcounts[b] = 1
        table.append(b)
    elif refcounts[table[-1]] > 1:  # shared and partly filled: copy-on-write
        old, b = table[-1], free.pop()
        K[b], V[b] = K[old], V[old]
        refcounts[old] -= 1
        refcounts[b] = 1
        table[-1] = b
    K[table[-1], slot], V[table[-1], slot] = k, v
    return table, length + 1


@dataclass(frozen=True)
class AppendCase:
    """A pool with a few sequences, some sharing blocks (forked); one of them takes a token."""

    kind: str  # "empty", "partial", "full", "shared_partial", "shared_full", "drawn"
    block_size: int = 4
    width: tuple[int, ...] = (3,)
    n_blocks: int = 16
    seed: int = 0

    def __str__(self) -> str:
        what = {"empty": "a new sequence (no block yet)",
                "partial": "a sequence whose last block is partly filled, not shared",
                "full": "a sequence whose last block is full",
                "shared_partial": "a forked sequence whose partly filled last block is shared",
                "shared_full": "a forked sequence whose full last block is shared",
                "drawn": "a drawn pool of forked and grown sequences"}[self.kind]
        return f"{what} (block_size {self.block_size}, {self.n_blocks} blocks, seed {self.seed})"


@dataclass
class World:
    """A pool and its sequences: what an append is given and judged against."""

    K: np.ndarray
    V: np.ndarray
    refcounts: np.ndarray
    free: list[int]
    tables: dict[str, tuple[list[int], int]]  # name -> (table, length)
    target: str

    def copy(self) -> World:
        return copy.deepcopy(self)


def _world(case: AppendCase) -> World:
    """Build the case's pool with the reference: appends and forks from an empty pool."""
    rng = np.random.default_rng(case.seed)
    bs = case.block_size
    shape = (case.n_blocks, bs) + case.width
    K, V = rng.standard_normal(shape), rng.standard_normal(shape)  # stale rows in free blocks
    w = World(K, V, np.zeros(case.n_blocks, dtype=np.int64), list(range(case.n_blocks))[::-1], {}, "")

    def grow(name: str, n: int) -> None:
        table, length = w.tables.get(name, ([], 0))
        for _ in range(n):
            table, length = reference_append(w.K, w.V, w.refcounts, w.free, table, length,
                                             rng.standard_normal(case.width),
                                             rng.standard_normal(case.width))
        w.tables[name] = (table, length)

    def fork(parent: str, child: str) -> None:
        table, length = w.tables[parent]
        for b in table:
            w.refcounts[b] += 1
        w.tables[child] = (list(table), length)

    grow("a", bs + 1)  # another sequence, so the pool is not all one sequence's
    if case.kind == "empty":
        w.tables["t"] = ([], 0)
    elif case.kind in ("partial", "full"):
        grow("t", 2 * bs + (bs // 2 + 1 if case.kind == "partial" else 0))
    elif case.kind in ("shared_partial", "shared_full"):
        grow("p", bs + (bs // 2 + 1 if case.kind == "shared_partial" else 0))
        fork("p", "t")
        fork("p", "u")  # three hold the prefix: refcount 3, one copy leaves 2
    else:
        grow("p", int(rng.integers(1, 3 * bs)))
        for name in ("q", "r", "t"):
            fork(str(rng.choice(sorted(w.tables))), name)
            grow(name, int(rng.integers(0, bs + 1)))
        grow("p", int(rng.integers(0, bs)))
        fork("t", "s")
    w.target = "t"
    return w


APPEND_CASES: tuple[AppendCase, ...] = (
    AppendCase("shared_partial"), AppendCase("full", seed=1), AppendCase("empty", seed=2),
    AppendCase("partial", seed=3), AppendCase("shared_full", seed=4),
    AppendCase("shared_partial", 3, (2, 2), 20, seed=5), AppendCase("full", 1, (2,), 12, seed=6),
    *(AppendCase("drawn", int(bs), (2,), 40, seed=10 + s) for s, bs in enumerate((2, 3, 4, 5, 3, 2))))
"""The pools append_token is judged on: each usual mistake fails on one of the first three."""


Problem = tuple[Any, str]  # (a code comparable across allocations, what it means in words)


def _append_problems(w: World, after: World, out: Any, k: np.ndarray, v: np.ndarray
                     ) -> tuple[list[Problem] | None, str | None]:
    """What is wrong with `after` (the pool once the append ran) and `out` (its return): problems
    in codes and words; or (None, why) when the return cannot be read at all."""
    bs = w.K.shape[1]
    table0, L = w.tables[w.target]
    if not isinstance(out, tuple | list) or len(out) != 2:
        return None, f"append_token must return (table, length); got {type(out).__name__}"
    table, length = _ints(out[0]), _int(out[1])
    if table is None or length is None:
        return None, f"append_token must return (table, length): a list of block ids and a whole " \
                     f"number; got {out!r}"
    n_blocks = len(w.refcounts)
    if any(not 0 <= b < n_blocks for b in table):
        return None, f"the table {table} names a block outside the pool (0 to {n_blocks - 1})"
    problems: list[Problem] = []
    if length != L + 1:
        problems.append((("length", length - L), f"returned length {length}; the sequence held {L} "
                                                  f"tokens and now holds {L + 1}"))
    others = {n: t for n, t in w.tables.items() if n != w.target}
    if len(table) < blocks_for(L + 1, bs):
        problems.append((("short", len(table)), f"the table {table} has {len(table) * bs} slots for "
                                                 f"{L + 1} tokens: the new token needs a new block"))
    else:
        old_rows = reference_gather(w.K, table0, L), reference_gather(w.V, table0, L)
        wrong = []
        for pool, old, new in ((after.K, old_rows[0], k), (after.V, old_rows[1], v)):
            got = reference_gather(pool, table, L + 1)
            want = np.concatenate([old, new[None]]) if L else new[None]
            wrong.append(~np.isclose(got, want).reshape(L + 1, -1).all(axis=1))
        bad = np.flatnonzero(wrong[0] | wrong[1])
        if bad.size:
            if bad.tolist() == [L]:
                words = (f"the new token does not read back through the table: token {L} belongs in "
                         f"block table[{L // bs}] at offset {L % bs}")
            else:
                words = (f"tokens {[int(i) for i in bad if i < L]} of the sequence no longer read back "
                         f"through its table (they were there before the append)")
            problems.append((("rows", tuple(int(i) for i in bad)), words))
    held = {b for t, _ in others.values() for b in t}
    changed = sorted(b for b in held if not (np.array_equal(after.K[b], w.K[b])
                                             and np.array_equal(after.V[b], w.V[b])))
    if changed:
        problems.append((("shared_written", len(changed)),
                         f"block {changed[0]} changed, and another sequence holds it (refcount "
                         f"{int(w.refcounts[changed[0]])}): a shared block is copied before a write"))
    counts = np.zeros(n_blocks, dtype=np.int64)
    for t in [t for t, _ in others.values()] + [table]:
        for b in set(t):
            counts[b] += 1
    try:
        rc = np.asarray(_to_numpy(after.refcounts), dtype=np.int64).reshape(n_blocks)
    except Exception:
        return None, "refcounts must stay an array of one count per block"
    diff = rc - counts
    if diff.any():
        b = int(np.flatnonzero(diff)[0])
        problems.append((("refcount", tuple(sorted(int(d) for d in diff if d))),
                         f"block {b} has refcount {int(rc[b])}, but {int(counts[b])} table(s) hold it"))
    free = _ints(after.free) if isinstance(after.free, list) else None
    if free is None:
        return None, f"free must stay a list of block ids; it is {after.free!r}"
    in_use = sorted(set(free) & {b for b in range(n_blocks) if counts[b]})
    missing = sorted({b for b in range(n_blocks) if not counts[b]} - set(free))
    if in_use or missing or len(free) != len(set(free)):
        words = (f"block {in_use[0]} is on the free list, but a table holds it: it would be handed "
                 f"out again while in use" if in_use else
                 f"block {missing[0]} is held by no table but is not on the free list" if missing else
                 "the free list holds a block twice")
        problems.append((("free", len(in_use), len(missing), len(free) - len(set(free))), words))
    used = len({b for t, _ in others.values() for b in t} | set(table))
    expected = len(held | set(table0)) + (1 if L % bs == 0 or w.refcounts[table0[-1]] > 1 else 0)
    if used != expected:
        problems.append((("blocks", used - expected),
                         f"{used} blocks are in use, {expected} expected: a new block only when the last "
                         f"is full (or there is none) or shared and partly filled"))
    return problems, None


def _append_run(fn: Callable, w: World, k: np.ndarray, v: np.ndarray
                ) -> tuple[list[Problem] | None, str | None]:
    """Run fn on a copy of the world; its problems, or why they cannot be told."""
    after = w.copy()
    table, length = after.tables[w.target]
    out, problem = _run(fn, after.K, after.V, after.refcounts, after.free, list(table), length,
                        k.copy(), v.copy())
    if problem:
        return None, problem
    return _append_problems(w, after, out, k, v)


def _a_no_cow(K, V, refcounts, free, table, length, k, v):
    bs = K.shape[1]
    table = list(table)
    if length % bs == 0:
        b = free.pop()
        refcounts[b] = 1
        table.append(b)
    K[table[-1], length % bs], V[table[-1], length % bs] = k, v
    return table, length + 1


def _a_cow(copy_rows: bool = True, decref: bool = True, newref: bool = True, pop: bool = True,
           release: bool = False):
    def append(K, V, refcounts, free, table, length, k, v):
        bs = K.shape[1]
        table = list(table)
        slot = length % bs
        b = free[-1]
        if slot == 0:
            if pop:
                free.pop()
            refcounts[b] = 1 if newref else refcounts[b]
            table.append(b)
        elif refcounts[table[-1]] > 1:
            old = table[-1]
            if pop:
                free.pop()
            if copy_rows:
                K[b], V[b] = K[old], V[old]
            if release:  # the refcount ignored: freed while other tables still hold it
                refcounts[old] = 0
                free.append(old)
            elif decref:
                refcounts[old] -= 1
            refcounts[b] = 1 if newref else refcounts[b]
            table[-1] = b
        K[table[-1], slot], V[table[-1], slot] = k, v
        return table, length + 1
    return append


def _a_fill(slip: str):
    """The solution with a slip in the fill count: "early" (a new block when the token about to be
    written is the block's last) or "offset" (the slot one too far)."""
    def append(K, V, refcounts, free, table, length, k, v):
        bs = K.shape[1]
        table = list(table)
        slot = (length + 1) % bs if slip == "offset" else length % bs
        if ((length + 1) % bs == 0 or not table) if slip == "early" else slot == 0:
            b = free.pop()
            refcounts[b] = 1
            table.append(b)
        elif refcounts[table[-1]] > 1:
            old, b = table[-1], free.pop()
            K[b], V[b] = K[old], V[old]
            refcounts[old] -= 1
            refcounts[b] = 1
            table[-1] = b
        K[table[-1], slot], V[table[-1], slot] = k, v
        return table, length + 1
    return append


def _a_always_new(K, V, refcounts, free, table, length, k, v):
    bs = K.shape[1]
    table = list(table)
    b = free.pop()
    refcounts[b] = 1
    if length % bs:
        K[b], V[b] = K[table[-1]], V[table[-1]]
        refcounts[table[-1]] -= 1
        table[-1] = b
    else:
        table.append(b)
    K[b, length % bs], V[b, length % bs] = k, v
    return table, length + 1


APPEND_MISTAKES: dict[str, tuple[Callable, str]] = {
    "cow_skipped": (_a_no_cow,
                    "the token was written into a block another sequence shares: when the last block is "
                    "shared (refcount > 1) and partly filled, copy it to a free block first "
                    "(copy-on-write), then write into the copy"),
    "cow_no_copy": (_a_cow(copy_rows=False),
                    "copy-on-write took a new block but did not copy the shared block's tokens into it: "
                    "copy K and V of the old block first, then write the new token"),
    "cow_no_decref": (_a_cow(decref=False),
                      "after the copy the old block's refcount was not lowered: this sequence no longer "
                      "holds it, so its refcount drops by 1 (or it is never freed)"),
    "freed_while_shared": (_a_cow(release=True),
                           "the shared block was freed (refcount 0, back on the free list) while other "
                           "sequences still hold it: this sequence only lets go of it, refcount - 1; it "
                           "is free when no table holds it"),
    "new_block_no_ref": (_a_cow(newref=False),
                         "a block taken from the free list was not given refcount 1: the sequence holds "
                         "it, and a block with refcount 0 is free to be taken again"),
    "free_not_popped": (_a_cow(pop=False),
                        "a block was used but left on the free list: take it off (free.pop()), or the "
                        "next append takes it again"),
    "fill_off_by_one": (_a_fill("early"),
                        "the last block's fill count is off by one: it is full when it holds block_size "
                        "tokens, length % block_size == 0, and only then does token `length` start a "
                        "new block (at offset 0)"),
    "always_new_block": (_a_always_new,
                         "a new block on every append: only when the last is full, or shared and "
                         "partly filled (then copied), does a token need one"),
}
"""The planted appends the diagnosis runs beside a student's: (function, what it shows)."""


_APPEND_HINT = ("slot = length % block_size; if slot == 0 take a free block (refcount 1); elif the last "
                "block's refcount > 1 copy it to a free block (refcount 1, the old one's - 1); then write "
                "k, v at (table[-1], slot)")


def append_diagnosis(fn: Callable, cases: Sequence[AppendCase] = APPEND_CASES) -> Diagnosis:
    """fn(K, V, refcounts, free, table, length, k, v) -> (table, length + 1), the pool updated."""
    for case in cases:
        w = _world(case)
        rng = np.random.default_rng(1000 + case.seed)
        k, v = rng.standard_normal(case.width), rng.standard_normal(case.width)
        table, length = w.tables[w.target]
        call = f"append_token on {case}: table {table}, length {length}"
        problems, why = _append_run(fn, w, k, v)
        if why:
            return Diagnosis("append_token", False, f"{call}: {why}")
        if not problems:
            continue
        codes = sorted(str(c) for c, _ in problems)
        named = next((f"{msg} [matches planted mistake '{name}']"
                      for name, (planted, msg) in APPEND_MISTAKES.items()
                      if (p := _append_run(planted, w, k, v))[0] is not None
                      and sorted(str(c) for c, _ in p[0]) == codes), None)
        words = "; ".join(text for _, text in problems)
        why = f"{words}. Likely cause: {named}" if named else \
            f"{words}; no usual mistake fits. {_APPEND_HINT}"
        return Diagnosis("append_token", False, f"{call}: {why}", bug=_bug_of(why))
    return Diagnosis("append_token", True,
                     f"append_token keeps {len(cases)} pools right (a first block, a full last block, "
                     f"copy-on-write of a shared one, refcounts and the free list)",
                     cases=tuple(str(c) for c in cases))


def check_append(fn: Callable, cases: Sequence[AppendCase] = APPEND_CASES) -> str:
    """`append_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return append_diagnosis(fn, cases).check()


# ---- part 3: one scheduler step -----------------------------------------------------------------
VOCAB = 97


def next_token(tokens: Sequence[int]) -> int:
    """The stand-in model's greedy next token: a hash of the whole sequence, each token at its
    position, so a token fed at the wrong position or left out changes what comes next."""
    h = 17
    for p, t in enumerate(tokens):
        h = (h * 31 + (int(t) + 1) * (2 * p + 3)) % 1_000_003
    return h % VOCAB


class ServingModel:
    """The stand-in model and its block pool, every call written down.

    model(batch) takes [(rid, tokens, start), ...]: the tokens of request rid not yet in its cache,
    the first at position `start`, and returns the next token of each (a list, in the batch's order).
    It keeps what each request's cache holds; free(rid) drops it (the request's blocks go back).
    """

    def __init__(self, held: Mapping[int, Sequence[int]] | None = None):
        self.held: dict[int, list[int]] = {int(r): list(t) for r, t in (held or {}).items()}
        self.calls: list[list[tuple[int, tuple[int, ...], int]]] = []
        self.freed: list[int] = []
        self.problems: list[str] = []

    def __call__(self, batch: Any) -> list[int]:
        """The next token of each entry, after feeding its tokens at its positions."""
        entries = []
        for entry in batch:
            rid, tokens, start = entry
            rid, tokens, start = int(rid), _ints(tokens), int(start)
            if tokens is None:
                raise TypeError(f"model: the tokens of request {rid} must be a list of token ids")
            entries.append((rid, tuple(tokens), start))
        self.calls.append(entries)
        seen = [rid for rid, _, _ in entries]
        if len(seen) != len(set(seen)):
            self.problems.append(f"one call fed request {max(seen, key=seen.count)} twice")
        out = []
        for rid, tokens, start in entries:
            held = self.held.setdefault(rid, [])
            if start != len(held):
                self.problems.append(f"request {rid} was fed at position {start}, but its cache holds "
                                     f"{len(held)} tokens (positions 0 to {len(held) - 1}): its next "
                                     f"token goes at position {len(held)}")
            held[:] = held[:start] + list(tokens)
            out.append(next_token(held))
        return out

    def free(self, rid: Any) -> None:
        """Give request rid's blocks back: its cache is empty from now on."""
        rid = int(rid)
        self.freed.append(rid)
        if rid not in self.held:
            self.problems.append(f"free({rid}): request {rid} holds no blocks (freed twice?)")
        self.held.pop(rid, None)


def _grow(r: Mapping, bs: int) -> int:
    """Blocks a running request needs for its next token (its cache holds all tokens but the last)."""
    n = len(r["tokens"])
    return blocks_for(n, bs) - blocks_for(n - 1, bs)


def reference_step(running: list[dict], waiting: list[dict], n_free: int, block_size: int,
                   max_batch: int, model: Callable, free: Callable
                   ) -> tuple[list[dict], list[dict], int, list[int]]:
    """One step of continuous batching, FCFS, preempting the newest: (running, waiting, n_free,
    finished)."""
    running, waiting = list(running), list(waiting)
    # 1) room for every running request's next token; when short, preempt the newest (recompute later)
    need = sum(_grow(r, block_size) for r in running)
    while need > n_free:
        r = running.pop()
        need -= _grow(r, block_size)
        free(r["rid"])
        n_free += blocks_for(len(r["tokens"]) - 1, block_size)
        waiting.insert(0, r)
    n_free -= need
    # 2) admit in arrival order while the batch and the blocks allow
    admitted = []
    while waiting and len(running) + len(admitted) < max_batch \
            and blocks_for(len(waiting[0]["tokens"]), block_size) <= n_free:
        r = waiting.pop(0)
        n_free -= blocks_for(len(r["tokens"]), block_size)
        admitted.append(r)
    # 3) one call: the newest token of each running request, every token of each admitted one
    batch = [(r["rid"], r["tokens"][-1:], len(r["tokens"]) - 1) for r in running]
    batch += [(r["rid"], list(r["tokens"]), 0) for r in admitted]
    running += admitted
    if batch:
        for r, t in zip(running, model(batch), strict=True):
            r["tokens"] = r["tokens"] + [int(t)]
    # 4) retire the finished, their blocks back
    finished = [r["rid"] for r in running if len(r["tokens"]) == r["n_prompt"] + r["n_new"]]
    for r in running:
        if r["rid"] in finished:
            free(r["rid"])
            n_free += blocks_for(len(r["tokens"]) - 1, block_size)
    running = [r for r in running if r["rid"] not in finished]
    return running, waiting, n_free, finished


def planted_step(**slip: bool) -> Callable:
    """reference_step with one usual mistake (no flag: right)."""
    def step(running, waiting, n_free, block_size, max_batch, model, free):
        bs = block_size
        running, waiting = list(running), list(waiting)

        def grow(r):
            n = len(r["tokens"])
            if slip.get("fill_off_by_one"):
                return 1 if n % bs == 0 else 0
            return blocks_for(n, bs) - blocks_for(n - 1, bs)

        def held(r):
            return blocks_for(len(r["tokens"]) - (0 if slip.get("credit_off_by_one") else 1), bs)

        need = sum(grow(r) for r in running)
        preempted = []
        while need > n_free and not slip.get("no_preempt"):
            r = running.pop(0) if slip.get("preempt_oldest") else running.pop()
            need -= grow(r)
            free(r["rid"])
            n_free += held(r)
            if slip.get("restart"):
                r = {**r, "tokens": r["tokens"][:r["n_prompt"]]}
            preempted.append(r)
        if slip.get("preempted_to_back"):
            waiting += preempted[::-1]
        else:
            waiting[:0] = preempted[::-1]
        n_free -= need
        admitted = []
        i = 0
        while i < len(waiting) and (len(running) + len(admitted) < max_batch or slip.get("over_batch")):
            if blocks_for(len(waiting[i]["tokens"]), bs) <= n_free:
                r = waiting.pop(i)
                n_free -= blocks_for(len(r["tokens"]), bs)
                admitted.append(r)
            elif slip.get("skip_ahead"):
                i += 1
            else:
                break
        last = len if slip.get("decode_position_off_by_one") else (lambda t: len(t) - 1)
        batch = [(r["rid"], r["tokens"][-1:], last(r["tokens"])) for r in running]
        batch += [(r["rid"], list(r["tokens"][:r["n_prompt"]] if slip.get("prompt_only") else r["tokens"]),
                   0) for r in admitted]
        running += admitted
        if batch:
            nxt = [model([e])[0] for e in batch] if slip.get("separate_calls") else model(batch)
            for r, t in zip(running, nxt, strict=True):
                r["tokens"] = r["tokens"] + [int(t)]
        extra = 1 if slip.get("one_token_too_many") else 0
        finished = [r["rid"] for r in running if len(r["tokens"]) == r["n_prompt"] + r["n_new"] + extra]
        for r in running:
            if r["rid"] in finished and not slip.get("never_freed"):
                free(r["rid"])
                n_free += 0 if slip.get("freed_not_counted") else held(r)
        running = [r for r in running if r["rid"] not in finished]
        return running, waiting, n_free, finished
    return step


STEP_MISTAKES: dict[str, tuple[Callable, str]] = {
    "never_freed": (planted_step(never_freed=True),
                    "a finished request was never freed: call free(rid) and add its blocks back to "
                    "n_free when it retires, or the pool runs dry"),
    "freed_not_counted": (planted_step(freed_not_counted=True),
                          "free(rid) was called for a finished request but n_free did not grow: add back "
                          "the blocks it held, blocks_for(len(tokens) - 1)"),
    "credit_off_by_one": (planted_step(credit_off_by_one=True),
                          "the blocks given back are off by one token: a request's cache holds every token "
                          "but the newest (not fed yet), blocks_for(len(tokens) - 1)"),
    "fill_off_by_one": (planted_step(fill_off_by_one=True),
                        "the last block's fill count is off by one: a running request holds len(tokens) "
                        "- 1 tokens; its newest token needs a new block when (len(tokens) - 1) % "
                        "block_size == 0"),
    "restart": (planted_step(restart=True),
                "positions restarted after preemption: the preempted request lost the tokens it had "
                "generated; it keeps them, and recompute feeds them again so it continues where it was"),
    "prompt_only": (planted_step(prompt_only=True),
                    "an admitted request that was preempted before was fed only its prompt: feed all its "
                    "tokens, prompt and generated, from position 0, so it continues where it was"),
    "preempt_oldest": (planted_step(preempt_oldest=True),
                       "the oldest running request was preempted: preempt the most recently admitted "
                       "(the last of `running`); the oldest has the most work to lose"),
    "no_preempt": (planted_step(no_preempt=True),
                   "the blocks ran out and no request was preempted: n_free went below 0"),
    "preempted_to_back": (planted_step(preempted_to_back=True),
                          "the preempted request went to the back of the queue: it goes back to the "
                          "front of `waiting` (it arrived before the requests still waiting)"),
    "over_batch": (planted_step(over_batch=True),
                   "more requests run than max_batch allows: admit only while len(running) < max_batch"),
    "skip_ahead": (planted_step(skip_ahead=True),
                   "a later request was admitted while an earlier one waited for blocks: admit in "
                   "arrival order and stop at the first that does not fit"),
    "decode_position_off_by_one": (planted_step(decode_position_off_by_one=True),
                                   "the newest token was fed one position too far: it goes at position "
                                   "len(tokens) - 1, right after the cached ones"),
    "separate_calls": (planted_step(separate_calls=True),
                       "one model call per request: decode every running request (and prefill the "
                       "admitted ones) in ONE batched call"),
    "one_token_too_many": (planted_step(one_token_too_many=True),
                           "a request ran one step too long: it is finished when it has n_new new "
                           "tokens, len(tokens) == n_prompt + n_new"),
}
"""The planted steps the diagnosis runs beside a student's: (function, what it shows)."""


@dataclass(frozen=True)
class StepCase:
    """A stream of drawn requests served step by step: block size, pool, batch, seed."""

    n_requests: int = 6
    block_size: int = 4
    n_blocks: int = 12
    max_batch: int = 3
    seed: int = 0
    spread: int = 3  # arrivals drawn over the first `spread` steps

    def __str__(self) -> str:
        return (f"{self.n_requests} requests, block_size {self.block_size}, {self.n_blocks} blocks, "
                f"max_batch {self.max_batch}, seed {self.seed}")

    def requests(self) -> list[tuple[int, dict]]:
        """(arrival step, request) in arrival order; each fits the pool on its own."""
        rng = np.random.default_rng(self.seed)
        out = []
        for rid in range(self.n_requests):
            n_prompt = int(rng.integers(1, 3 * self.block_size + 1))
            n_new = int(rng.integers(1, 2 * self.block_size + 2))
            while blocks_for(n_prompt + n_new, self.block_size) > self.n_blocks:
                n_new = max(1, n_new - 1)
                n_prompt = max(1, n_prompt - 1)
            out.append((int(rng.integers(0, self.spread)),
                        {"rid": rid, "tokens": [int(t) for t in rng.integers(0, VOCAB, n_prompt)],
                         "n_prompt": n_prompt, "n_new": n_new}))
        return sorted(out, key=lambda a: a[0])


STEP_CASES: tuple[StepCase, ...] = (
    StepCase(6, 4, 12, 3, seed=0), StepCase(5, 2, 9, 4, seed=1, spread=1),
    StepCase(7, 3, 30, 2, seed=2), StepCase(8, 4, 10, 8, seed=3, spread=6),
    StepCase(4, 1, 14, 4, seed=4), StepCase(10, 5, 16, 4, seed=5, spread=8),
    StepCase(6, 2, 12, 6, seed=6, spread=2))
"""The request streams schedule_step is judged on: each usual mistake fails on one of the first four."""

_MAX_STEPS = 400


def _view(r: Any) -> tuple | None:
    """A request as (rid, tokens, n_prompt, n_new), whatever mapping it comes as; None if unreadable."""
    try:
        tokens = _ints(r["tokens"])
        rid, n_prompt, n_new = _int(r["rid"]), _int(r["n_prompt"]), _int(r["n_new"])
    except Exception:
        return None
    if tokens is None or None in (rid, n_prompt, n_new):
        return None
    return rid, tuple(tokens), n_prompt, n_new


@dataclass(frozen=True)
class Outcome:
    """All a step shows: the state it returns and the calls it made."""

    running: tuple
    waiting: tuple
    n_free: int
    finished: tuple[int, ...]
    calls: tuple  # each call: its entries sorted by rid (the order within a batch is free)
    freed: tuple[int, ...]
    problems: tuple[str, ...]


def _outcome(fn: Callable, state: tuple[list, list, int], case: StepCase
             ) -> tuple[Outcome | None, str | None]:
    """Run one step of fn on a deep copy of the state, with a fresh model holding the caches."""
    running, waiting, n_free = copy.deepcopy(state)
    model = ServingModel({r["rid"]: r["tokens"][:-1] for r in running})
    out, problem = _run(fn, running, waiting, n_free, case.block_size, case.max_batch, model,
                        model.free)
    if problem:
        return None, f"schedule_step {problem}" + (f" ({model.problems[0]})" if model.problems else "")
    if not isinstance(out, tuple | list) or len(out) != 4:
        return None, ("schedule_step must return (running, waiting, n_free, finished); got "
                      f"{type(out).__name__}")
    run_, wait_, free_, fin_ = out
    views = []
    for what, reqs in (("running", run_), ("waiting", wait_)):
        try:
            v = [_view(r) for r in reqs]
        except TypeError:
            v = [None]
        if None in v:
            return None, f"schedule_step returned {what} that is not a list of requests (dicts " \
                         f"with rid, tokens, n_prompt, n_new)"
        views.append(tuple(v))
    n, fin = _int(free_), _ints(fin_) if not isinstance(fin_, set | frozenset) else _ints(sorted(fin_))
    if n is None or fin is None:
        return None, f"schedule_step must return n_free (a whole number) and finished (a list of " \
                     f"request ids); got {free_!r} and {fin_!r}"
    calls = tuple(tuple(sorted(c)) for c in model.calls)
    return Outcome(views[0], views[1], n, tuple(sorted(fin)), calls, tuple(sorted(model.freed)),
                   tuple(model.problems)), None


def _ids(reqs: tuple) -> list[int]:
    return [r[0] for r in reqs]


def _step_difference(got: Outcome, want: Outcome) -> str:
    """The first way the student's step differs from the right one, in words."""
    if got.problems:
        return got.problems[0]
    if len(got.calls) != len(want.calls):
        return f"{len(got.calls)} model calls, expected {len(want.calls)} (one batched call a step " \
               f"when any request runs)"
    if got.calls != want.calls:
        g, w = (dict((e[0], e) for c in x.calls for e in c) for x in (got, want))
        rid = next((r for r in sorted(set(g) | set(w)) if g.get(r) != w.get(r)), None)
        if rid not in g:
            return f"request {rid} was not fed to the model; it should be: {w[rid]} (rid, tokens, start)"
        if rid not in w:
            return f"request {rid} was fed ({g[rid]}) but should not run in this step"
        return f"request {rid} was fed {g[rid]} (rid, tokens, start); expected {w[rid]}"
    if got.freed != want.freed:
        return f"free was called for {list(got.freed)}; expected {list(want.freed)} (each request " \
               f"that retires or is preempted, once)"
    for what in ("running", "waiting"):
        g, w = getattr(got, what), getattr(want, what)
        if _ids(g) != _ids(w):
            return f"{what} holds requests {_ids(g)}; expected {_ids(w)}"
        for a, b in zip(g, w, strict=True):
            if a != b:
                return f"request {a[0]} in {what} has tokens {list(a[1])}; expected {list(b[1])}"
    if got.finished != want.finished:
        return f"finished {list(got.finished)}; expected {list(want.finished)}"
    return f"n_free is {got.n_free}; expected {want.n_free}"


def _describe(state: tuple[list, list, int]) -> str:
    running, waiting, n_free = state
    def brief(r):
        return f"{r['rid']}: {len(r['tokens'])} tokens ({r['n_prompt']} + {len(r['tokens']) - r['n_prompt']}" \
               f" of {r['n_new']} new)"
    return (f"running [{'; '.join(brief(r) for r in running)}], waiting "
            f"[{'; '.join(brief(r) for r in waiting)}], n_free {n_free}")


_STEP_HINT = ("1) each running request needs a block for its newest token when (len(tokens) - 1) % "
              "block_size == 0; while short, preempt the last of running (free it, its blocks back, "
              "to the front of waiting); 2) admit from the front of waiting while len(running) < "
              "max_batch and blocks_for(len(tokens)) fit; 3) one model call: (rid, [newest], "
              "len(tokens) - 1) for running, (rid, tokens, 0) for admitted; append each next token; "
              "4) retire when len(tokens) == n_prompt + n_new: free(rid), blocks back")


def step_diagnosis(fn: Callable, cases: Sequence[StepCase] = STEP_CASES) -> Diagnosis:
    """fn(running, waiting, n_free, block_size, max_batch, model, free) -> (running, waiting, n_free,
    finished), served step by step from the reference's state and compared at every step."""
    steps = 0
    for case in cases:
        arrivals = case.requests()
        running: list[dict] = []
        waiting: list[dict] = []
        n_free = case.n_blocks
        t = 0
        while arrivals or running or waiting:
            while arrivals and arrivals[0][0] <= t:
                waiting.append(arrivals.pop(0)[1])
            state = (running, waiting, n_free)
            want, _ = _outcome(reference_step, state, case)
            got, problem = _outcome(fn, state, case)
            call = f"schedule_step on {case}, step {t} ({_describe(state)})"
            if problem:
                return Diagnosis("schedule_step", False, f"{call}: {problem}")
            if got != want:
                named = next((f"{msg} [matches planted mistake '{name}']"
                              for name, (planted, msg) in STEP_MISTAKES.items()
                              if _outcome(planted, state, case)[0] == got), None)
                diff = _step_difference(got, want)
                why = f"{diff}. Likely cause: {named}" if named else \
                    f"{diff}; no usual mistake fits. {_STEP_HINT}"
                return Diagnosis("schedule_step", False, f"{call}: {why}", bug=_bug_of(why))
            running, waiting, n_free = copy.deepcopy(state)
            model = ServingModel({r["rid"]: r["tokens"][:-1] for r in running})
            running, waiting, n_free, _ = reference_step(running, waiting, n_free, case.block_size,
                                                         case.max_batch, model, model.free)
            t += 1
            steps += 1
            if t > _MAX_STEPS:
                raise RuntimeError(f"the reference did not finish {case}")
    return Diagnosis("schedule_step", True,
                     f"schedule_step served {len(cases)} request streams ({steps} steps) like the "
                     f"reference: admissions, one batched call, retirements and preemptions, with the "
                     f"right calls", cases=tuple(str(c) for c in cases))


def check_step(fn: Callable, cases: Sequence[StepCase] = STEP_CASES) -> str:
    """`step_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return step_diagnosis(fn, cases).check()


# ---- part 4: the bytes prefix sharing saves -----------------------------------------------------
SAVED_CASES: tuple[tuple[int, ...], ...] = (
    (32, 256 + 5, 16, 3, 4, 64, 4), (8, 100, 16, 2, 2, 32, 2), (4, 7, 16, 1, 1, 8, 2),
    (2, 64, 8, 5, 3, 16, 1), (17, 1000, 32, 12, 8, 128, 2))
"""(n_requests, prefix_len, block_size, n_layers, n_kv_heads, d_k, itemsize) prefix_bytes_saved is
checked on: a partly filled last block, n_layers != n_kv_heads, itemsize != 1 tell the slips apart."""


def reference_saved(n_requests: int, prefix_len: int, block_size: int, n_layers: int,
                    n_kv_heads: int, d_k: int, itemsize: int) -> int:
    """Bytes saved once each of n requests sharing a prefix has written its own first token: the
    prefix's full blocks are stored once instead of n times (the partly filled one is copied)."""
    block = 2 * n_layers * n_kv_heads * block_size * d_k * itemsize  # K and V, every layer
    return (n_requests - 1) * (prefix_len // block_size) * block


def _saved_slips(n: int, P: int, bs: int, n_layers: int, h: int, d_k: int, item: int
                 ) -> dict[str, tuple[int, str]]:
    """The usual wrong counts: name -> (bytes, what they mean)."""
    block = 2 * n_layers * h * bs * d_k * item
    full = P // bs
    return {
        "partial_shared": ((n - 1) * blocks_for(P, bs) * block,
                           "the partly filled last block of the prefix was counted as shared: each "
                           "request's first own token copies it (copy-on-write), so only the prefix's "
                           "full blocks, prefix_len // block_size, stay shared"),
        "tokens_not_blocks": ((n - 1) * P * block // bs,
                              "that counts the prefix's tokens, not its blocks: memory is given in whole "
                              "blocks, and the partly filled one is copied by each request"),
        "n_not_n_minus_1": (n * full * block,
                            "n copies saved, but one copy is still stored: sharing saves n - 1"),
        "k_only": ((n - 1) * full * block // 2, "K and V are both cached: 2 tensors a slot"),
        "one_layer": ((n - 1) * full * block // n_layers, "every layer has its own cache: times n_layers"),
        "no_itemsize": ((n - 1) * full * block // item, "that counts elements, not bytes: times itemsize"),
    }


def saved_diagnosis(fn: Callable, cases: Sequence[tuple[int, ...]] = SAVED_CASES) -> Diagnosis:
    """fn(n_requests, prefix_len, block_size, n_layers, n_kv_heads, d_k, itemsize) -> bytes saved."""
    for args in cases:
        call = f"prefix_bytes_saved{args}"
        want = reference_saved(*args)
        got, problem = _run(fn, *args)
        if problem:
            return Diagnosis("prefix_bytes_saved", False, f"{call} {problem}")
        try:
            value = float(np.asarray(_to_numpy(got), dtype=np.float64))
        except Exception:
            return Diagnosis("prefix_bytes_saved", False, f"{call} must return one number of bytes; "
                                                          f"got {got!r}")
        if value == want:
            continue
        mine = int(value) if value.is_integer() else value
        why = next((f"{msg} [matches planted mistake '{name}']"
                    for name, (slip, msg) in _saved_slips(*args).items() if slip == value),
                   "no usual slip fits: (n_requests - 1) * (prefix_len // block_size) blocks, each "
                   "2 * n_layers * n_kv_heads * block_size * d_k * itemsize bytes")
        return Diagnosis("prefix_bytes_saved", False, f"{call} returned {mine}, expected {want}: {why}",
                         bug=_bug_of(why))
    return Diagnosis("prefix_bytes_saved", True,
                     f"prefix_bytes_saved matches on {len(cases)} cases: (n - 1) full prefix blocks, "
                     f"K and V of every layer", cases=tuple(str(c) for c in cases))


def check_saved(fn: Callable, cases: Sequence[tuple[int, ...]] = SAVED_CASES) -> str:
    """`saved_diagnosis(...).check()`: the success line, or AssertionError naming the slip."""
    __tracebackhide__ = True
    return saved_diagnosis(fn, cases).check()
