"""Continuous batching over a paged KV cache (mha.inference.serving), against generating alone.

1. Every token the scheduler generates equals `generate(model, [prompt], n_new)` of that request
   alone (numpy and torch models; prompts, n_new, arrivals, chunk, block size, max_batch and pool
   sizes drawn with hypothesis, pools small enough to force preemption among them). Each run is
   audited from the model's side (a spy that writes down every call): every token fed sits at
   its own position in prompt + output, each step makes one call per prefill chunk and ONE
   decode call, decode positions never go back (not even across a preemption), no request is
   admitted before it arrives or beyond max_batch, and all blocks are free at the end.
2. Preemption: it happens, says so (a warning, the record, the progress bar), and the tokens are
   still equal.
3. Prefix sharing: fewer blocks, shared by reference count, copied on write, same tokens.
4. static_batching: the same tokens, one call per step of each batch's longest request.
5. Bad input: a clear error and the scheduler's state unchanged.
6. Mutation proofs: a test-local broken scheduler (positions restarted after a preemption,
   finished requests never freed, one decode call per request) is caught by the audit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mha.inference import generate, paged, serving
from mha.inference.serving import PREFIX, PreemptionWarning, Request, Scheduler
from mha.training import train

VOCAB = 11
quiet = pytest.mark.filterwarnings("ignore::mha.inference.serving.PreemptionWarning")


def tiny(seed: int = 0, window: int | None = None, rope: str | None = "half") -> tuple[Any, Any]:
    """An attention-only causal TinyTransformer (RoPE, GQA) and its float64 numpy twin."""
    model = train.TinyTransformer(vocab=VOCAB, T=64, d_model=16, n_heads=4, n_layers=2,
                                  causal=True, seed=seed, n_kv_heads=2, rope=rope, window=window)
    model.eval()
    return model, generate.NumpyTinyTransformer(model)


TORCH, NUMPY = tiny()


def host(a: Any) -> np.ndarray:
    """A numpy array or tensor as a numpy array."""
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def pool_for(model: Any, n_blocks: int, block_size: int) -> Any:
    """The pool twin that fits the model."""
    cls = paged.TorchBlockPool if isinstance(model, torch.nn.Module) else paged.BlockPool
    return cls.for_model(model, n_blocks, block_size)


def alone(model: Any, prompt: list[int], n_new: int) -> list[int]:
    """The reference: generate for this one request, nothing else in the batch."""
    return host(generate.generate(model, [prompt], n_new))[0].tolist()


class Spy:
    """The model, with every call written down: the sequences (from the caches), tokens, positions."""

    def __init__(self, model: Any):
        self.__dict__.update(model=model, calls=[])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["model"], name)

    def __call__(self, tokens: Any, positions: Any, caches: list) -> Any:
        """Record (seq_ids, tokens (B, T), positions (B, T)), then run the model."""
        self.calls.append((list(caches[0].seq_ids), host(tokens).tolist(), host(positions).tolist()))
        return self.model(tokens, positions, caches)


def drive(s: Scheduler, spy: Spy, limit: int = 2000) -> list[int]:
    """Step until done, as run() does -> the number of model calls each step made."""
    per_step = []
    while s.running or s.waiting:
        n = len(spy.calls)
        s.step()
        per_step.append(len(spy.calls) - n)
        assert len(per_step) < limit, f"no end after {limit} steps: blocks never freed?"
    return per_step


def audit(s: Scheduler, spy: Spy, per_step: list[int], max_batch: int) -> None:
    """What every correct run satisfies, checked from the model's calls and the timeline."""
    prefix = s.prefix
    for seq_ids, toks, poss in spy.calls:
        for sid, row, pos in zip(seq_ids, toks, poss, strict=True):
            pads = sum(p < 0 for p in pos)  # a mixed call left-pads the shorter rows
            assert all(p < 0 for p in pos[:pads]), f"sequence {sid}: pads not on the left, {pos}"
            row, pos = row[pads:], pos[pads:]
            assert pos == list(range(pos[0], pos[0] + len(pos))), (
                f"sequence {sid} was fed positions {pos}: expected consecutive positions")
            want = prefix if sid == PREFIX else s.requests[sid].tokens
            got = [want[p] for p in pos]
            assert row == got, (
                f"sequence {sid} was fed {row} at positions {pos}, but prompt + output holds "
                f"{got} there: a token at the wrong position (restarted after a preemption?)")
    for rec, calls in zip(s.timeline, per_step, strict=True):
        expected = bool(rec.prefilled or rec.decoded) if s.mixed else \
            len(rec.prefilled) + bool(rec.decoded)
        assert calls == expected, (
            f"step {rec.step} made {calls} model calls, expected {expected}: one per prefill "
            f"chunk (none apart when mixed) and ONE for all {len(rec.decoded)} decoding requests")
        assert len(rec.running) <= max_batch, f"step {rec.step} ran {rec.running} > max_batch"
        for rid in rec.admitted:
            assert rec.step >= s.requests[rid].arrival, f"request {rid} admitted before arrival"
    decodes: dict[int, list[int]] = {}
    for rec in s.timeline:
        for rid, p in zip(rec.decoded, rec.decode_positions, strict=True):
            decodes.setdefault(rid, []).append(p)
    for rid, ps in decodes.items():
        assert ps == sorted(set(ps)), (
            f"request {rid} decoded at positions {ps}: positions went back (restarted after a "
            f"preemption?)")
    assert s.pool.n_used == s.prefix_blocks, (
        f"{s.pool.n_used} blocks in use after every request finished, expected "
        f"{s.prefix_blocks} (the prefix's): a finished request never freed?")
    s.pool.check()
    s.close()
    assert s.pool.n_used == 0


def serve(model: Any, cases: list[tuple[list[int], int, int]], block_size: int, n_blocks: int,
          max_batch: int, chunk: int, prefix: list[int] | None = None, cls: type = Scheduler,
          mixed: bool = False) -> Scheduler:
    """Run cases [(prompt, n_new, arrival)] through a scheduler, audit it, check tokens -> it."""
    spy = Spy(model)
    s = cls(spy, pool_for(model, n_blocks, block_size), max_batch=max_batch, chunk=chunk,
            prefix=prefix, mixed=mixed)
    rids = [s.add(p, n, a) for p, n, a in cases]
    per_step = drive(s, spy)
    for rid, (p, n, _) in zip(rids, cases, strict=True):
        want = alone(model, p, n)
        assert s.finished[rid] == want, (
            f"request {rid} (prompt {p}, n_new {n}) got {s.finished[rid]}, generating alone "
            f"gives {want}")
    audit(s, spy, per_step, max_batch)
    return s


def note(s: Scheduler) -> None:
    """Tell hypothesis whether this run preempted (--hypothesis-show-statistics: both are drawn)."""
    event(f"preempted: {s.preemptions > 0}")


@st.composite
def workloads(draw: Any, max_requests: int = 5) -> dict:
    """Requests, block size, pool size (down to what the largest request needs alone), batch, chunk."""
    bs = draw(st.integers(1, 5), label="block_size")
    n = draw(st.integers(1, max_requests), label="requests")
    cases = [(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), label="prompt"),
              draw(st.integers(1, 7), label="n_new"), draw(st.integers(0, 3), label="arrival"))
             for _ in range(n)]
    alone_max = max(math.ceil((len(p) + k - 1) / bs) for p, k, _ in cases)
    total = sum(math.ceil((len(p) + k - 1) / bs) for p, k, _ in cases)
    tight = draw(st.booleans(), label="tight pool")  # half the draws: a pool that preempts
    n_blocks = draw(st.integers(alone_max, alone_max + 1 if tight else max(alone_max, total)),
                    label="n_blocks")
    return dict(cases=cases, block_size=bs, n_blocks=n_blocks,
                max_batch=draw(st.integers(1, 4), label="max_batch"),
                chunk=draw(st.integers(1, 6), label="chunk"),
                mixed=draw(st.booleans(), label="mixed: prefill rides in the decode call"))


# ---- 1. every token equals generating alone ---------------------------------------------------
@quiet
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_numpy_scheduler_gives_each_request_the_tokens_it_gets_alone(w):
    note(serve(NUMPY, **w))


@quiet
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(max_requests=4))
def test_torch_scheduler_gives_each_request_the_tokens_it_gets_alone(w):
    note(serve(TORCH, **w))


@quiet
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(max_requests=4), window=st.integers(1, 6), seed=st.integers(1, 3))
def test_a_sliding_window_model_serves_the_same_tokens(w, window, seed):
    """A window is masked by positions over kept blocks: the scheduler needs nothing new."""
    note(serve(tiny(seed, window=window)[1], **w))


@quiet
def test_a_learned_position_table_model_serves_the_same_tokens_and_refuses_past_its_table():
    torch_model, twin = tiny(rope=None)
    cases = [([1, 2, 3], 5, 0), ([4] * 9, 3, 1), ([5, 6], 8, 0)]
    serve(twin, cases, block_size=2, n_blocks=8, max_batch=3, chunk=4)
    s = Scheduler(twin, pool_for(twin, 200, 4))
    with pytest.raises(ValueError, match="learned position table"):
        s.add([1] * 60, 6)  # positions 0..64 > the table's 0..63


# ---- 2. preemption ----------------------------------------------------------------------------
PREEMPTING = dict(cases=[([1, 2, 3, 4, 5], 6, 0), ([6, 7, 8, 9, 10], 6, 0), ([2, 4, 6], 7, 0)],
                  block_size=2, n_blocks=6, max_batch=3, chunk=4)


@pytest.mark.parametrize("model", [NUMPY, TORCH], ids=["numpy", "torch"])
def test_preemption_happens_says_so_and_the_tokens_are_still_equal(model):
    with pytest.warns(PreemptionWarning, match=r"preempted request \d+ .* recomputed"):
        s = serve(model, **PREEMPTING)
    assert s.preemptions > 0
    victims = [rid for rec in s.timeline for rid in rec.preempted]
    assert len(victims) == s.preemptions
    for rid in victims:  # recomputed from position 0, then decoding goes on past where it was
        req = s.requests[rid]
        assert req.preemptions > 0
        starts = [start for rec in s.timeline for r, start, _ in rec.prefilled if r == rid]
        assert starts.count(0) == req.preemptions + 1, (rid, starts)


def test_the_progress_bar_shows_running_waiting_blocks_and_preemptions(capsys):
    s = Scheduler(NUMPY, pool_for(NUMPY, PREEMPTING["n_blocks"], 2), max_batch=3, chunk=4)
    for p, n, a in PREEMPTING["cases"]:
        s.add(p, n, a)
    with pytest.warns(PreemptionWarning):
        out = s.run(progress=True)
    err = capsys.readouterr().err
    for word in ("running=", "waiting=", "blocks=", f"preemptions={s.preemptions}"):
        assert word in err, f"the bar's postfix has no {word!r}: {err[-300:]!r}"
    assert sorted(out) == [0, 1, 2] and s.pool.n_used == 0


def test_the_most_recently_admitted_request_is_preempted_first_and_waits_in_front():
    s = Scheduler(NUMPY, pool_for(NUMPY, 4, 2), max_batch=2, chunk=8)
    a, b = s.add([1, 2, 3], 5), s.add([4, 5, 6], 5)
    c = s.add([7], 1, arrival=0)
    with pytest.warns(PreemptionWarning):
        while not any(rec.preempted for rec in s.timeline):
            s.step()
    assert s.timeline[-1].preempted == [b], "expected the later-admitted request to go"
    assert [r.rid for r in s.waiting][:2] == [b, c], "a preempted request waits in front"
    assert [r.rid for r in s.running] == [a]


# ---- 3. prefix sharing ------------------------------------------------------------------------
@quiet
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_requests_sharing_a_prefix_get_the_tokens_they_get_alone(data):
    bs = data.draw(st.integers(1, 4), label="block_size")
    prefix = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=9), label="prefix")
    cases = []
    for _ in range(data.draw(st.integers(1, 4), label="requests")):
        rest = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=4))
        shared = data.draw(st.booleans(), label="starts with the prefix")
        prompt = prefix + rest if shared or not rest else rest
        cases.append((prompt, data.draw(st.integers(1, 6)), data.draw(st.integers(0, 2))))
    need = max(math.ceil((len(p) + n - 1) / bs) for p, n, _ in cases) + math.ceil(len(prefix) / bs)
    n_blocks = data.draw(st.integers(need, need + 2) | st.integers(need, need + 12), label="n_blocks")
    model = data.draw(st.sampled_from([NUMPY, TORCH]), label="model")
    note(serve(model, cases, bs, n_blocks, data.draw(st.integers(1, 4)),
               data.draw(st.integers(1, 5)), prefix=prefix, mixed=data.draw(st.booleans())))


def test_a_shared_prefix_takes_fewer_blocks_by_reference_count_and_is_copied_on_write():
    prefix, bs = list(range(1, 11)), 4  # 10 tokens: 2 full blocks and a partly filled third
    cases = [(prefix + [i], 3, 0) for i in range(4)]
    shared = serve(NUMPY, cases, bs, 40, 4, 16, prefix=prefix)
    unshared = serve(NUMPY, cases, bs, 40, 4, 16)
    peak = [max(r.blocks_in_use for r in s.timeline) for s in (shared, unshared)]
    # alone each request holds 10 + 1 + 2 = 13 tokens: 4 blocks; shared, 2 full prefix blocks
    # are held once, and each request copies the third on its first write (its own 2 blocks)
    assert peak == [3 + 4 * 2, 4 * 4], peak
    s = Scheduler(NUMPY, pool_for(NUMPY, 40, bs), max_batch=4, prefix=prefix)
    for p, n, a in cases:
        s.add(p, n, a)
    s.step()
    pre = s.pool.tables[PREFIX]
    refs = s.pool.refcounts
    assert list(refs[pre[:2]]) == [5, 5], "the full prefix blocks: the prefix and 4 requests"
    assert refs[pre[2]] == 1, "the partly filled block: each request wrote into its own copy"
    for rid in range(4):
        table = s.pool.tables[rid]
        assert table[:2] == pre[:2] and table[2] != pre[2]


# ---- 4. the static baseline -------------------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_static_batching_gives_the_same_tokens_and_waits_for_each_batchs_longest(data):
    n = data.draw(st.integers(1, 6), label="requests")
    reqs = [Request(i, data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=7)),
                    data.draw(st.integers(1, 6)), data.draw(st.integers(0, 3))) for i in range(n)]
    size = data.draw(st.integers(1, 4), label="batch_size")
    model = data.draw(st.sampled_from([NUMPY, TORCH]), label="model")
    out, calls = serving.static_batching(model, reqs, size)
    for r in reqs:
        assert out[r.rid] == alone(model, r.prompt, r.n_new), r
    order = sorted(reqs, key=lambda r: (r.arrival, r.rid))
    assert calls == sum(max(r.n_new for r in order[i:i + size]) for i in range(0, n, size))


def test_without_refill_a_batch_is_admitted_only_into_an_empty_scheduler():
    """refill=False: static batching on the paged kernels, the same tokens."""
    cases = [([1, 2], 2, 0), ([3], 6, 0), ([4, 5, 6], 3, 0), ([7], 1, 0), ([8, 9], 4, 0)]
    s = Scheduler(NUMPY, pool_for(NUMPY, 20, 2), max_batch=2, refill=False)
    for p, n, a in cases:
        s.add(p, n, a)
    out = s.run(progress=False)
    for rid, (p, n, _) in enumerate(cases):
        assert out[rid] == alone(NUMPY, p, n)
    running_before = []
    for rec in s.timeline:
        if rec.admitted:
            assert not running_before, f"step {rec.step} admitted {rec.admitted} beside {running_before}"
        running_before = [r for r in rec.running if r not in rec.retired]
    assert [rec.admitted for rec in s.timeline if rec.admitted] == [[0, 1], [2, 3], [4]]


# ---- 5. bad input: a clear error, nothing changed ---------------------------------------------
def state(s: Scheduler) -> tuple:
    """What a refused call must leave as it was."""
    return (len(s.requests), [r.rid for r in s.waiting], [r.rid for r in s.running], s.clock,
            s.pool.n_used, dict(s.pool.tables))


@pytest.mark.parametrize("args, error, match", [
    (("hello", 3), TypeError, "text"),
    (([1.0, 2.0], 3), TypeError, "float id would be truncated"),
    (([], 3), ValueError, "empty"),
    (([1, VOCAB], 3), ValueError, f"ids in 0..{VOCAB - 1}"),
    (([True, 1], 3), TypeError, "token ids"),
    (([1, 2], 0), ValueError, "n_new must be >= 1"),
    (([1, 2], 2.0), TypeError, "n_new must be an int"),
    (([1, 2], 2, -1), ValueError, "arrival must be >= 0"),
    (([1] * 20, 30), ValueError, "more than the whole pool"),
])
def test_add_refuses_bad_requests_and_changes_nothing(args, error, match):
    s = Scheduler(NUMPY, pool_for(NUMPY, 6, 4), prefix=[1, 2])
    s.add([3, 4], 2)
    s.step()
    before = state(s)
    with pytest.raises(error, match=match):
        s.add(*args)
    assert state(s) == before


def test_the_scheduler_refuses_a_pool_that_does_not_fit_the_model():
    with pytest.raises(TypeError, match="TorchBlockPool for a TinyTransformer"):
        Scheduler(TORCH, pool_for(NUMPY, 4, 2))
    with pytest.raises(TypeError, match="BlockPool for a NumpyTinyTransformer"):
        Scheduler(NUMPY, pool_for(TORCH, 4, 2))
    with pytest.raises(ValueError, match="n_kv_heads = 2 .* got 4"):
        Scheduler(NUMPY, paged.BlockPool(2, 4, 2, 4, 4))
    with pytest.raises(ValueError, match="n_layers = 2 .* got 3"):
        Scheduler(NUMPY, paged.BlockPool(3, 4, 2, 2, 4))
    with pytest.raises(ValueError, match="dtype = float64 .* got float32"):
        Scheduler(NUMPY, paged.BlockPool(2, 4, 2, 2, 4, dtype=np.float32))
    with pytest.raises(ValueError, match="window = 3 .* got None"):
        Scheduler(tiny(window=3)[1], pool_for(NUMPY, 4, 2))
    busy = pool_for(NUMPY, 4, 2)
    busy.add("other")
    busy.reserve("other", 3)
    with pytest.raises(ValueError, match="pool must be empty"):
        Scheduler(NUMPY, busy)
    for kw, error in ((dict(max_batch=0), ValueError), (dict(chunk=1.5), TypeError),
                      (dict(prefix="abc"), TypeError), (dict(prefix=[99]), ValueError),
                      (dict(prefix=[1] * 9), ValueError)):
        with pytest.raises(error):
            Scheduler(NUMPY, pool_for(NUMPY, 4, 2), **kw)


def test_static_batching_refuses_bad_input():
    with pytest.raises(TypeError, match="list of Request"):
        serving.static_batching(NUMPY, Request(0, [1], 1), 2)
    with pytest.raises(TypeError, match="Request objects"):
        serving.static_batching(NUMPY, [([1, 2], 3)], 2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        serving.static_batching(NUMPY, [Request(0, [1], 1)], 0)


def test_close_refuses_while_requests_remain_and_then_empties_the_pool():
    s = Scheduler(NUMPY, pool_for(NUMPY, 8, 2), prefix=[1, 2, 3])
    s.add([1, 2, 3, 4], 2)
    with pytest.raises(ValueError, match="close needs every request done"):
        s.close()
    s.run(progress=False)
    assert s.pool.n_used == s.prefix_blocks == 2
    s.close()
    assert s.pool.n_used == 0


# ---- 6. mutation proofs: each broken scheduler is caught ---------------------------------------
class RestartsAfterPreemption(Scheduler):
    """Bug: a preempted request starts over from its prompt (positions restart at len(prompt))."""

    def _make_room(self, rec: serving.StepRecord) -> int:
        planned = super()._make_room(rec)
        for rid in rec.preempted:
            self.requests[rid].out.clear()
        return planned


class NeverFreesFinished(Scheduler):
    """Bug: a finished request leaves the batch but its blocks are never freed."""

    def _retire(self, rec: serving.StepRecord) -> None:
        for req in [r for r in self.running if r.done]:
            self.running.remove(req)
            self.finished[req.rid] = list(req.out)
            rec.retired.append(req.rid)


class DecodesOnePerCall(Scheduler):
    """Bug: every decoding request gets its own model call (correct tokens, no batching)."""

    def _decode(self, reqs: list[Request], rec: serving.StepRecord) -> None:
        for r in reqs:
            super()._decode([r], rec)


@quiet
@pytest.mark.parametrize("mutant, caught_by", [
    (RestartsAfterPreemption, "positions went back"),
    (NeverFreesFinished, "never freed"),
    (DecodesOnePerCall, "ONE for all"),
])
def test_the_audit_catches_each_broken_scheduler(mutant, caught_by):
    serve(NUMPY, **PREEMPTING)  # the correct scheduler passes this very run
    with pytest.raises(AssertionError, match=caught_by):
        serve(NUMPY, **PREEMPTING, cls=mutant)


# ---- 7. the room check: one count over the running requests per step ----------------------------
class CountingBlockPool(paged.BlockPool):
    """A BlockPool that counts its room checks: blocks_needed (one sequence), blocks_needed_each (many)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.counts = {"one": 0, "each": 0}

    def blocks_needed(self, seq_id: Any, n_new: int) -> int:
        self.counts["one"] += 1
        return super().blocks_needed(seq_id, n_new)

    def blocks_needed_each(self, seq_ids: Any, n_new: Any) -> np.ndarray:
        self.counts["each"] += 1
        return super().blocks_needed_each(seq_ids, n_new)


class RoomPerRequest(Scheduler):
    """Slow, not wrong: the room check asks the pool once per running request (the tokens are equal)."""

    def _make_room(self, rec: serving.StepRecord) -> int:
        sum(self.pool.blocks_needed(r.rid, self._feed(r)) for r in self.running if self._feed(r))
        return super()._make_room(rec)


def room_checks(cls: type) -> None:
    """Each step counts the running requests' blocks in one pool call (one more per preemption)."""
    pool = CountingBlockPool.for_model(NUMPY, PREEMPTING["n_blocks"], PREEMPTING["block_size"])
    s = cls(NUMPY, pool, max_batch=PREEMPTING["max_batch"], chunk=PREEMPTING["chunk"])
    for p, n, a in PREEMPTING["cases"]:
        s.add(p, n, a)
    while s.running or s.waiting:
        pool.counts.update(one=0, each=0)
        rec = s.step()
        assert pool.counts["each"] == 1 + len(rec.preempted), (rec.step, pool.counts)
        assert pool.counts["one"] <= len(rec.admitted) + 1, (
            f"step {rec.step}: {pool.counts['one']} one-sequence room checks for "
            f"{len(rec.admitted)} admissions: the running requests counted one call each")
    assert s.finished == {rid: alone(NUMPY, p, n) for rid, (p, n, _) in enumerate(PREEMPTING["cases"])}


@quiet
def test_the_room_check_is_one_count_per_step_and_a_per_request_loop_is_caught():
    room_checks(Scheduler)
    with pytest.raises(AssertionError, match="counted one call each"):
        room_checks(RoomPerRequest)
