"""mha_course.diagnose.serving names each usual paged-cache and scheduler mistake, calls correct code
correct, and names nothing it can't tell.

Contracts:
  * correct code in several styles passes every check (lists or arrays, another free block taken,
    the library's own pool wrapped to the assignment's signature, the batch in another order);
  * each mistake A9's hidden tests name is named, by behaviour: the lookup, the append (its planted
    versions), the scheduler step (its planted versions) and the bytes (each usual slip);
  * student code that raises, returns None or the wrong shape is reported, not raised;
  * the verdicts' own references are right: drawn appends and forks read back as the library's
    BlockPool holds them, and a drawn request stream served step by step gives every request the
    tokens it gets alone, with every block back at the end.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha.inference import paged
from mha_course.diagnose import serving as ds


# ---- part 1: where a token lives -------------------------------------------------------------------
def locate_as_array(table, i, block_size):
    return np.array([table[i // block_size], i % block_size])


def gather_row_by_row(pool, table, length):
    bs = pool.shape[1]
    return [pool[table[i // bs]][i % bs].tolist() for i in range(length)]  # nested lists


@pytest.mark.parametrize("locate, gather", [(ds.reference_locate, ds.reference_gather),
                                            (locate_as_array, gather_row_by_row)])
def test_correct_lookups_pass(locate, gather):
    d = ds.lookup_diagnosis(locate, gather)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(ds.LOOKUP_MISTAKES))
def test_each_planted_lookup_is_named(name):
    fn = ds.LOOKUP_MISTAKES[name][0]
    d = ds.lookup_diagnosis(fn, ds.reference_gather) if name in ("logical_block", "offset_plus_one",
                                                                  "one_based") \
        else ds.lookup_diagnosis(ds.reference_locate, fn)
    assert not d.ok and d.bug == name, d.message


@pytest.mark.parametrize("locate, gather, words", [
    (lambda t, i, bs: None, ds.reference_gather, "must return (block, offset)"),
    (lambda t, i, bs: 1 / 0, ds.reference_gather, "raised ZeroDivisionError"),
    (ds.reference_locate, lambda p, t, n: p[0, :1], "returned shape"),
    (ds.reference_locate, lambda p, t, n: "rows", "must return an array of rows"),
])
def test_broken_lookups_are_reported_not_raised(locate, gather, words):
    d = ds.lookup_diagnosis(locate, gather)
    assert not d.ok and words in d.message, d.message


def test_an_unwritten_part_says_so():
    def todo(*args):
        raise NotImplementedError()
    for d in (ds.lookup_diagnosis(todo, todo), ds.append_diagnosis(todo), ds.step_diagnosis(todo),
              ds.saved_diagnosis(todo)):
        assert not d.ok and "not written yet" in d.message, d.message


# ---- part 2: append with copy-on-write ---------------------------------------------------------------
def append_from_the_front(K, V, refcounts, free, table, length, k, v):
    """Another right style: blocks from the front of the free list, the table mutated, arrays back."""
    bs = K.shape[1]
    if length == len(table) * bs:
        b = free.pop(0)
        refcounts[b] += 1
        table.append(b)
    elif refcounts[table[-1]] != 1:
        b = free.pop(0)
        K[b, :length % bs], V[b, :length % bs] = K[table[-1], :length % bs], V[table[-1], :length % bs]
        refcounts[table[-1]] -= 1
        refcounts[b] = 1
        table[-1] = b
    K[table[-1], length % bs] = k
    V[table[-1], length % bs] = v
    return np.asarray(table), np.int64(length + 1)


def append_with_the_library(K, V, refcounts, free, table, length, k, v):
    """The library's BlockPool doing the bookkeeping over the same arrays (its reserve: copy-on-write)."""
    pool = paged.BlockPool(1, K.shape[0], K.shape[1], 1, 1)
    pool._refcounts, pool._free = refcounts, free
    pool._tables, pool._written, pool._next = {0: list(table)}, {0: [length]}, {0: [length]}
    pool.K, pool.V = K[None, :, None], V[None, :, None]  # (1, N, 1, bs, ...): views of the arrays
    pool.reserve(0, 1)
    t = list(pool.tables[0])
    K[t[-1], length % K.shape[1]], V[t[-1], length % K.shape[1]] = k, v
    return t, length + 1


@pytest.mark.parametrize("fn", [ds.reference_append, append_from_the_front, append_with_the_library])
def test_correct_appends_pass(fn):
    d = ds.append_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(ds.APPEND_MISTAKES))
def test_each_planted_append_is_named(name):
    d = ds.append_diagnosis(ds.APPEND_MISTAKES[name][0])
    assert not d.ok and d.bug == name, d.message


def test_an_offset_one_slot_too_far_is_a_fill_count_slip():
    d = ds.append_diagnosis(ds._a_fill("offset"))
    assert not d.ok and d.bug == "fill_off_by_one", d.message


@pytest.mark.parametrize("wrong, words", [
    (lambda *a: None, "must return (table, length)"),
    (lambda K, V, rc, free, t, n, k, v: (t, "n"), "a list of block ids and a whole number"),
    (lambda K, V, rc, free, t, n, k, v: ([99], n + 1), "outside the pool"),
    (lambda *a: [][0], "raised IndexError"),
])
def test_broken_appends_are_reported_not_raised(wrong, words):
    d = ds.append_diagnosis(wrong)
    assert not d.ok and words in d.message, d.message


@settings(max_examples=25, deadline=None)
@given(bs=st.integers(1, 5), ops=st.lists(st.tuples(st.sampled_from(["append", "fork"]),
                                                   st.integers(0, 3)), min_size=1, max_size=30))
def test_the_reference_append_reads_back_as_the_librarys_pool(bs, ops):
    """Drawn appends and forks: the verdicts' reference and mha.inference.paged hold the same tokens."""
    n_blocks, width = 64, 2
    rng = np.random.default_rng(bs)
    K, V = np.zeros((n_blocks, bs, width)), np.zeros((n_blocks, bs, width))
    rc, free = np.zeros(n_blocks, np.int64), list(range(n_blocks))[::-1]
    tables: dict[int, tuple[list[int], int]] = {0: ([], 0)}
    lib = paged.BlockPool(1, n_blocks, bs, 1, width)
    lib.add(0)
    for op, which in ops:
        seq = sorted(tables)[which % len(tables)]
        if op == "fork":
            new = len(tables)
            table, length = tables[seq]
            for b in table:
                rc[b] += 1
            tables[new] = (list(table), length)
            lib.fork(seq, new)
            continue
        k, v = rng.standard_normal(width), rng.standard_normal(width)
        tables[seq] = ds.reference_append(K, V, rc, free, *tables[seq], k, v)
        cache = lib.batch([seq])[0]
        cache.update(k[None, None, None], v[None, None, None], np.array([[tables[seq][1] - 1]]))
    lib.check()
    for seq, (table, length) in tables.items():
        assert lib.length(seq) == length
        want = lib.K[0, lib.tables[seq], 0].reshape(-1, width)[:length]  # (length, width)
        np.testing.assert_array_equal(ds.reference_gather(K, table, length), want)
    counts = np.bincount([b for t, _ in tables.values() for b in t], minlength=n_blocks)
    np.testing.assert_array_equal(rc, counts)
    assert sorted(free) == [b for b in range(n_blocks) if counts[b] == 0]


# ---- part 3: one scheduler step ----------------------------------------------------------------------
def step_in_another_order(running, waiting, n_free, block_size, max_batch, model, free):
    """Another right style: new dicts, the batch admitted-first, finished as a set, tokens as arrays."""
    out = ds.reference_step([dict(r) for r in running], [dict(r) for r in waiting], n_free, block_size,
                            max_batch, lambda batch: model(batch[::-1])[::-1], free)
    run, wait, n, fin = out
    return ([{**r, "tokens": np.array(r["tokens"])} for r in run], tuple(wait), np.int64(n), set(fin))


@pytest.mark.parametrize("fn", [ds.reference_step, ds.planted_step(), step_in_another_order])
def test_correct_steps_pass(fn):
    d = ds.step_diagnosis(fn)
    assert d.ok, d.message


@pytest.mark.parametrize("name", list(ds.STEP_MISTAKES))
def test_each_planted_step_is_named(name):
    d = ds.step_diagnosis(ds.STEP_MISTAKES[name][0])
    assert not d.ok and d.bug == name, d.message


@pytest.mark.parametrize("wrong, words", [
    (lambda *a: None, "must return (running, waiting, n_free, finished)"),
    (lambda r, w, n, bs, mb, model, free: ([1], w, n, []), "not a list of requests"),
    (lambda r, w, n, bs, mb, model, free: (r, w, "many", []), "n_free (a whole number)"),
    (lambda r, w, n, bs, mb, model, free: model([(0, "ab", 0)]), "raised TypeError: model: the tokens"),
])
def test_broken_steps_are_reported_not_raised(wrong, words):
    d = ds.step_diagnosis(wrong)
    assert not d.ok and words in d.message, d.message


def test_the_stand_in_model_records_what_it_is_fed():
    model = ds.ServingModel({7: [1, 2, 3]})
    assert model([(7, [4], 3), (8, [5, 6], 0)]) == [ds.next_token([1, 2, 3, 4]), ds.next_token([5, 6])]
    assert not model.problems
    model([(7, [9], 6)])
    assert "fed at position 6, but its cache holds 4 tokens" in model.problems[0]
    model.free(8)
    model.free(8)
    assert model.freed == [8, 8] and "freed twice" in model.problems[-1]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), bs=st.integers(1, 5), extra=st.integers(0, 12),
       max_batch=st.integers(1, 6), n=st.integers(1, 8))
def test_the_reference_step_gives_each_request_its_tokens_alone(seed, bs, extra, max_batch, n):
    """Any stream, any pool that fits the longest request: every request ends with the tokens it
    gets served alone, the free count never goes below 0, and every block is back at the end."""
    case = ds.StepCase(n, bs, 3 * bs + 2 + extra, max_batch, seed=seed, spread=4)
    arrivals = case.requests()
    alone = {}
    for _, r in arrivals:
        tokens = list(r["tokens"])
        for _ in range(r["n_new"]):
            tokens.append(ds.next_token(tokens))
        alone[r["rid"]] = tokens
    running, waiting, n_free, t, done = [], [], case.n_blocks, 0, {}
    while arrivals or running or waiting:
        while arrivals and arrivals[0][0] <= t:
            waiting.append(arrivals.pop(0)[1])
        model = ds.ServingModel({r["rid"]: r["tokens"][:-1] for r in running})
        running, waiting, n_free, fin = ds.reference_step(running, waiting, n_free, bs, max_batch,
                                                          model, model.free)
        assert not model.problems, model.problems
        assert n_free >= 0 and len(model.calls) <= 1 and len(running) <= max_batch
        done.update({r: None for r in fin})
        for r in running:
            done[r["rid"]] = r["tokens"]
        t += 1
        assert t < 500
    assert n_free == case.n_blocks
    assert sorted(done) == sorted(alone)


def test_the_stream_ends_with_each_requests_tokens_alone():
    """The same, token for token, on the graded streams (the dicts kept to the end)."""
    for case in ds.STEP_CASES:
        arrivals = case.requests()
        requests = [r for _, r in arrivals]
        running, waiting, n_free, t = [], [], case.n_blocks, 0
        while arrivals or running or waiting:
            while arrivals and arrivals[0][0] <= t:
                waiting.append(arrivals.pop(0)[1])
            model = ds.ServingModel({r["rid"]: r["tokens"][:-1] for r in running})
            running, waiting, n_free, _ = ds.reference_step(running, waiting, n_free, case.block_size,
                                                            case.max_batch, model, model.free)
            t += 1
        for r in requests:  # reference_step rebinds each dict's tokens: the request dicts hold them
            tokens = r["tokens"][:r["n_prompt"]]
            for _ in range(r["n_new"]):
                tokens = tokens + [ds.next_token(tokens)]
            assert r["tokens"] == tokens, (case, r["rid"])


def test_the_graded_streams_preempt():
    """The streams exercise what the planted steps get wrong: a preemption, a re-admission."""
    preempted = 0
    for case in ds.STEP_CASES[:4]:
        arrivals, running, waiting, n_free, t = case.requests(), [], [], case.n_blocks, 0
        while arrivals or running or waiting:
            while arrivals and arrivals[0][0] <= t:
                waiting.append(arrivals.pop(0)[1])
            model = ds.ServingModel({r["rid"]: r["tokens"][:-1] for r in running})
            running, waiting, n_free, _ = ds.reference_step(running, waiting, n_free, case.block_size,
                                                            case.max_batch, model, model.free)
            preempted += sum(1 for r in waiting if len(r["tokens"]) > r["n_prompt"])
            t += 1
    assert preempted > 0


# ---- part 4: the bytes -------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    ds.reference_saved,
    lambda n, P, bs, L, h, d, i: float((n - 1) * (P // bs) * 2 * L * h * bs * d * i),
    lambda n, P, bs, L, h, d, i: np.int64(n - 1) * (P - P % bs) * 2 * L * h * d * i,
])
def test_correct_bytes_pass(fn):
    d = ds.saved_diagnosis(fn)
    assert d.ok, d.message


def test_the_bytes_are_what_the_librarys_pool_allocates():
    """(n - 1) * (P // bs) blocks of a BlockPool: its nbytes, for the first case."""
    n, P, bs, L, h, d_k, item = ds.SAVED_CASES[1]
    lib = paged.BlockPool(L, (n - 1) * (P // bs), bs, h, d_k, dtype={2: np.float16, 4: np.float32}[item])
    assert ds.reference_saved(*ds.SAVED_CASES[1]) == lib.nbytes


@pytest.mark.parametrize("name", list(ds._saved_slips(*ds.SAVED_CASES[0])))
def test_each_byte_slip_is_named(name):
    d = ds.saved_diagnosis(lambda *a: ds._saved_slips(*a)[name][0])
    assert not d.ok and d.bug == name, d.message


def test_bytes_that_are_not_a_number_are_reported():
    d = ds.saved_diagnosis(lambda *a: "many")
    assert not d.ok and "one number of bytes" in d.message, d.message
