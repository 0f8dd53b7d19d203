"""Serving many requests: continuous batching over a paged KV cache, and the static baseline.

A `Scheduler` holds requests that arrive over time, each a prompt and a number of tokens to
generate. At every `step` it

    (e) makes room: if the pool cannot take the tokens the running requests feed this step, it
        preempts the most recently admitted one (frees its blocks; it waits again, at the front,
        and is recomputed later from its prompt and the tokens it has so far, at the same positions)
    (a) admits waiting requests in arrival order while `max_batch` and the pool's blocks allow
    (b) prefills: up to `chunk` prompt tokens of each admitted request, one model call each; a
        request whose prompt is done takes its first token from that call's last logits
    (c) decodes every running request that has a token to feed in ONE batched model call
    (d) retires the requests that have all their tokens and frees their blocks

and writes a `StepRecord` into `timeline`. With `mixed=True`, (b) and (c) are one model call:
the prefill chunks and the decoding tokens, left-padded to the longest chunk (pads at position
-1, never stored). A model is anything with the interface
`model(tokens (B, T), positions (B, T), caches) -> logits (B, T, V)`: the numpy
`generate.NumpyTinyTransformer` with a `paged.BlockPool`, or the torch
`mha.training.train.TinyTransformer` with a `paged.TorchBlockPool`. Decoding is greedy, so every
request's tokens equal `generate(model, [prompt], n_new)` of that request alone.

`prefix=` stores a shared system prompt once: it is prefilled as its own sequence, and each request
whose prompt starts with it forks it (`pool.fork`: its blocks are shared, the partly filled last
one copied on the first write) and prefills only the rest.

`static_batching` is the baseline: requests in arrival order in batches of `batch_size`, each
batch decoded until its longest request finishes (`generate`, a dense cache, left padding).

Shape legend: B requests in a call, T tokens per request in a call, V vocabulary.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha.inference import generate
from mha.validate import require_bool, require_int, torch  # torch: lazy

PREFIX: Hashable = ("serving", "prefix")
"""The pool's sequence id of the shared prefix (request ids are ints, so it cannot clash)."""


class PreemptionWarning(RuntimeWarning):
    """A request was preempted: its blocks were freed and it will be recomputed later."""


@dataclass
class Request:
    """One request: a prompt (token ids), how many tokens to generate, the step it arrives at.

    The scheduler keeps its state here too: the tokens generated so far, how many of prompt +
    those the pool holds, and how often it was preempted.
    """

    rid: int
    prompt: list[int]
    n_new: int
    arrival: int = 0
    out: list[int] = field(default_factory=list)  # tokens generated so far
    cached: int = 0  # tokens of prompt + out whose keys and values the pool holds
    preemptions: int = 0  # times this request was preempted

    @property
    def tokens(self) -> list[int]:
        """prompt + the tokens generated so far: token i sits at position i."""
        return self.prompt + self.out

    @property
    def done(self) -> bool:
        """True once all n_new tokens are generated (the last one is never fed back)."""
        return len(self.out) == self.n_new

    @property
    def decoding(self) -> bool:
        """True when exactly one token, the latest generated, is left to feed: a decode step."""
        return bool(self.out) and self.cached == len(self.prompt) + len(self.out) - 1


@dataclass
class StepRecord:
    """What one scheduler step did (request ids; positions are where the tokens sit)."""

    step: int
    admitted: list[int] = field(default_factory=list)
    prefilled: list[tuple[int, int, int]] = field(default_factory=list)  # (rid, start, stop)
    decoded: list[int] = field(default_factory=list)  # rids of the one batched decode call
    decode_positions: list[int] = field(default_factory=list)  # the position each one fed
    retired: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)  # rids holding blocks after the model calls
    blocks_in_use: int = 0  # pool blocks in use after the model calls, before retiring
    tokens_held: int = 0  # tokens the pool holds then (its fullest point in the step)
    model_calls: int = 0


class Scheduler:
    """Continuous batching over a paged KV cache: admit, prefill in chunks, decode in one call, retire.

    refill=False admits only into an empty batch (static batching on the same kernels);
    mixed=True feeds the prefill chunks in the decode call too, left-padded (positions -1 on
    pads, never stored): one model call per step, as vLLM's chunked prefill batches them.
    """

    def __init__(self, model: Any, pool: Any, max_batch: int = 8, chunk: int = 16,
                 prefix: Sequence[int] | None = None, refill: bool = True, mixed: bool = False):
        self.max_batch = require_int("max_batch", max_batch)
        self.mixed = require_bool("mixed", mixed)
        self.chunk = require_int("chunk", chunk)
        self.refill = require_bool("refill", refill)
        self.torch = generate._is_torch_model(model)
        _check_pool(model, pool, self.torch)
        if pool.n_used != 0:
            raise ValueError(f"pool must be empty when the scheduler starts, it holds "
                             f"{pool.n_used} blocks in use; free its sequences or build a new pool")
        self.model, self.pool = model, pool
        self.vocab = int(model.vocab)
        table = getattr(model, "T", None) if getattr(model, "pos", None) is not None else None
        self.table = table  # a learned position table: positions must stay below it
        self.prefix: list[int] = []
        self._prefix_next: int | None = None  # the token the prefix's last logits pick
        if prefix is not None:
            self.prefix = generate.check_prompts([prefix], self.vocab)[0]
            need = math.ceil(len(self.prefix) / pool.block_size)
            if need > pool.n_blocks:
                raise ValueError(f"prefix of {len(self.prefix)} tokens needs {need} blocks of "
                                 f"{pool.block_size}, the pool has {pool.n_blocks}")
            self._check_table(len(self.prefix), "prefix")
        self.requests: dict[int, Request] = {}
        self._queue: list[Request] = []  # arrived or not, sorted by (arrival, rid)
        self._preempted: deque[Request] = deque()  # waiting at the front of the queue
        self.running: list[Request] = []  # in admission order: the last is preempted first
        self.finished: dict[int, list[int]] = {}
        self.timeline: list[StepRecord] = []
        self.clock = 0
        self.model_calls = 0
        self.preemptions = 0
        if self.prefix:
            self._prefill_prefix()

    # ---- requests -----------------------------------------------------------------------------
    def add(self, prompt: Sequence[int], n_new: int, arrival: int = 0) -> int:
        """Queue a request -> its id; refused (state unchanged) if it could never fit the pool."""
        prompt = generate.check_prompts([prompt], self.vocab)[0]
        n_new = require_int("n_new", n_new)
        arrival = require_int("arrival", arrival, minimum=0)
        fed = len(prompt) + n_new - 1  # the last new token is never fed back
        self._check_table(fed, "prompt + n_new - 1")
        own, free = self._blocks_alone(prompt, fed), self.pool.n_blocks - self.prefix_blocks
        if own > free:
            raise ValueError(f"request needs {own} blocks of {self.pool.block_size} for its "
                             f"{len(prompt)} prompt tokens + {n_new} new ones, more than the "
                             f"whole pool can give it ({free} of {self.pool.n_blocks} blocks"
                             f"{', the prefix holds the rest' if self.prefix else ''})")
        rid = len(self.requests)
        req = Request(rid, prompt, n_new, arrival)
        self.requests[rid] = req
        at = next((i for i, r in enumerate(self._queue) if (r.arrival, r.rid) > (arrival, rid)),
                  len(self._queue))
        self._queue.insert(at, req)
        return rid

    @property
    def waiting(self) -> list[Request]:
        """Requests not running and not finished, in the order they will be admitted."""
        return list(self._preempted) + self._queue

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> StepRecord:
        """One scheduling step: make room, admit, prefill, decode in one call, retire."""
        rec = StepRecord(step=self.clock)
        calls = self.model_calls
        planned = self._make_room(rec)  # (e): blocks the running requests need this step
        if not rec.preempted:
            self._admit(rec, planned)  # (a)
        decoders = [r for r in self.running if r.decoding]  # before prefill: one call per step
        prefilling = [r for r in self.running if not r.decoding]
        if self.mixed:  # (b) and (c) together: every row in ONE call
            rows = [self._chunk(r) for r in prefilling if not self._prefix_token(r)]
            rows += [self._chunk(r) for r in decoders]
            if rows:
                self._feed_rows(rows, rec)
        else:
            for req in prefilling:
                self._prefill(req, rec)  # (b)
            if decoders:
                self._decode(decoders, rec)  # (c)
        rec.running = [r.rid for r in self.running]
        rec.blocks_in_use, rec.tokens_held = self.pool.n_used, self.pool.tokens_held
        self._retire(rec)  # (d)
        rec.model_calls = self.model_calls - calls
        self.timeline.append(rec)
        self.clock += 1
        return rec

    def run(self, progress: bool = True) -> dict[int, list[int]]:
        """Step until every request has its tokens -> {rid: generated tokens}."""
        progress = require_bool("progress", progress)
        from mha.training.train import progress_bar  # tqdm, a notebook-friendly bar

        total = sum(r.n_new for r in self.requests.values())
        done = sum(len(r.out) for r in self.requests.values())
        bar = progress_bar(None, "serving", progress, total=total)
        bar.update(done)
        while self.running or self._preempted or self._queue:
            if not self.running and not self._preempted and self._queue[0].arrival > self.clock:
                self.clock = self._queue[0].arrival  # nothing to do until the next arrival
            self.step()
            now = sum(len(r.out) for r in self.requests.values())
            bar.update(now - done)
            done = now
            bar.set_postfix(running=len(self.running), waiting=len(self.waiting),
                            blocks=f"{self.pool.n_used}/{self.pool.n_blocks}",
                            preemptions=self.preemptions, refresh=False)
        bar.close()
        return {rid: list(self.finished[rid]) for rid in sorted(self.finished)}

    # ---- the parts of a step ------------------------------------------------------------------
    def _feed(self, req: Request) -> int:
        """Tokens `req` feeds this step: 1 when decoding, else the next prefill chunk."""
        return 1 if req.decoding else min(self.chunk, len(req.prompt) + len(req.out) - req.cached)

    def _retire(self, rec: StepRecord) -> None:
        """Free the blocks of every request that has all its tokens; keep its output."""
        for req in [r for r in self.running if r.done]:
            self.pool.free(req.rid)
            self.running.remove(req)
            self.finished[req.rid] = list(req.out)
            rec.retired.append(req.rid)

    def _make_room(self, rec: StepRecord) -> int:
        """Preempt the most recently admitted requests until the step's tokens fit -> blocks planned."""
        while True:
            feeds = [self._feed(r) for r in self.running]  # 0: nothing to feed, no blocks
            planned = int(self.pool.blocks_needed_each([r.rid for r in self.running], feeds).sum())
            if planned <= self.pool.n_free:
                return planned
            if len(self.running) <= 1:  # add() refuses what cannot fit alone: a bug if reached
                raise RuntimeError(f"step {self.clock}: {planned} blocks needed, "
                                   f"{self.pool.n_free} free, nothing left to preempt")
            victim = self.running.pop()
            self.pool.free(victim.rid)
            victim.cached, victim.preemptions = 0, victim.preemptions + 1
            self._preempted.appendleft(victim)  # older victims end up in front
            self.preemptions += 1
            rec.preempted.append(victim.rid)
            warnings.warn(f"step {self.clock}: preempted request {victim.rid} ({planned} blocks "
                          f"needed, {self.pool.n_free} free); it will be recomputed from its "
                          f"{len(victim.tokens)} tokens", PreemptionWarning, stacklevel=3)

    def _admit(self, rec: StepRecord, planned: int) -> None:
        """Admit waiting requests in order while max_batch and the free blocks allow."""
        if not self.refill and self.running:
            return  # static batching: a batch runs until its last request is done
        while len(self.running) < self.max_batch:
            source = self._preempted if self._preempted else self._queue
            if not source or source[0].arrival > self.clock:
                return
            req = source[0]
            self._start(req)
            need = self.pool.blocks_needed(req.rid, self._feed(req)) if self._feed(req) else 0
            if planned + need > self.pool.n_free:
                self.pool.free(req.rid)  # it waits: the pool is as it was
                return
            planned += need
            if source is self._preempted:
                self._preempted.popleft()
            else:
                self._queue.pop(0)
            self.running.append(req)
            rec.admitted.append(req.rid)

    def _start(self, req: Request) -> None:
        """Open the request's sequence in the pool: a fork of the prefix if its prompt starts with it."""
        if self.prefix and req.prompt[:len(self.prefix)] == self.prefix:
            self.pool.fork(PREFIX, req.rid)  # shares every prefix block, refcount + 1
            req.cached = len(self.prefix)
        else:
            self.pool.add(req.rid)
            req.cached = 0

    def _chunk(self, req: Request) -> tuple[Request, int, int]:
        """(req, start, stop): the positions req feeds this step."""
        return req, req.cached, req.cached + self._feed(req)

    def _prefix_token(self, req: Request) -> bool:
        """A prompt that is the prefix itself: its first token is what the prefix's logits picked."""
        if self._feed(req):
            return False
        req.out.append(self._prefix_next)
        return True

    def _prefill(self, req: Request, rec: StepRecord) -> None:
        """Feed the next chunk of req's prompt (+ tokens so far, after a preemption): one call."""
        if not self._prefix_token(req):
            self._feed_rows([self._chunk(req)], rec)

    def _decode(self, reqs: list[Request], rec: StepRecord) -> None:
        """Feed each request's latest token at its next position, all in ONE model call."""
        self._feed_rows([self._chunk(r) for r in reqs], rec)

    def _feed_rows(self, rows: list[tuple[Request, int, int]], rec: StepRecord) -> None:
        """ONE model call for rows (req, start, stop), left-padded: each row ends in its last token."""
        T = max(stop - start for _, start, stop in rows)
        pads = [T - (stop - start) for _, start, stop in rows]
        tokens = [[generate.PAD] * n + r.tokens[start:stop]
                  for n, (r, start, stop) in zip(pads, rows, strict=True)]  # (B, T)
        positions = [[-1] * n + list(range(start, stop))
                     for n, (_, start, stop) in zip(pads, rows, strict=True)]  # (B, T): -1 on pads
        logits = self._call(tokens, positions, [r.rid for r, _, _ in rows])  # (B, T, V)
        nxt = logits[:, -1].argmax(-1).tolist()  # (B,) greedy: each row's last column is real
        for (req, start, stop), token in zip(rows, nxt, strict=True):
            if req.decoding:
                rec.decoded.append(req.rid)
                rec.decode_positions.append(start)
            else:
                rec.prefilled.append((req.rid, start, stop))
            req.cached = stop
            if stop == len(req.tokens):  # all fed: the last logits pick the next token
                req.out.append(int(token))

    def _call(self, tokens: list[list[int]], positions: list[list[int]], seq_ids: list) -> Any:
        """model(tokens (B, T), positions (B, T), the pool's caches for seq_ids) -> logits (B, T, V)."""
        tok = np.asarray(tokens, dtype=np.int64)  # (B, T)
        pos = np.asarray(positions, dtype=np.int64)  # (B, T)
        caches = self.pool.batch(seq_ids)
        self.model_calls += 1
        if not self.torch:
            return self.model(tok, pos, caches)  # (B, T, V)
        device = _device(self.model)
        with torch.no_grad():
            return self.model(torch.from_numpy(tok).to(device), torch.from_numpy(pos).to(device),
                              caches)  # (B, T, V)

    def _prefill_prefix(self) -> None:
        """Prefill the shared prefix once, as its own sequence; keep the token its logits pick."""
        self.pool.add(PREFIX)
        P = len(self.prefix)
        logits = self._call([self.prefix], [list(range(P))], [PREFIX])  # (1, P, V)
        self._prefix_next = int(logits[0, -1].argmax())

    @property
    def prefix_blocks(self) -> int:
        """Blocks the shared prefix holds until `close` (0 without a prefix)."""
        return math.ceil(len(self.prefix) / self.pool.block_size)

    def close(self) -> None:
        """Free the prefix's blocks once every request is done: the pool is then empty."""
        if self.running or self._preempted or self._queue:
            raise ValueError(f"close needs every request done; {len(self.running)} running and "
                             f"{len(self.waiting)} waiting")
        if self.prefix and PREFIX in self.pool.tables:
            self.pool.free(PREFIX)

    def _blocks_alone(self, prompt: list[int], fed: int) -> int:
        """Blocks a request feeding `fed` tokens takes beyond the prefix's (full shared blocks are free)."""
        own = math.ceil(fed / self.pool.block_size)
        if self.prefix and prompt[:len(self.prefix)] == self.prefix:
            own -= len(self.prefix) // self.pool.block_size  # the full prefix blocks are shared
        return own

    def _check_table(self, n: int, what: str) -> None:
        """Refuse positions past a learned position table (RoPE models have none)."""
        if self.table is not None and n > self.table:
            raise ValueError(f"{what} reaches position {n - 1}, but the model's learned position "
                             f"table has rows 0..{self.table - 1}; a model with rope= runs at any "
                             f"length")


def _device(model: Any) -> Any:
    """The device of a torch model's parameters."""
    return next(model.parameters()).device


def _check_pool(model: Any, pool: Any, is_torch_model: bool) -> None:
    """Raise, naming expected vs got, unless the pool was sized for this model's attention layers."""
    from mha.inference import paged

    want = paged.TorchBlockPool if is_torch_model else paged.BlockPool
    if not isinstance(pool, want):
        raise TypeError(f"pool must be a {want.__name__} for a {type(model).__name__} model, got "
                        f"{type(pool).__name__}")
    ref = want.for_model(model, 1, pool.block_size)
    for name in ("n_layers", "n_kv_heads", "d_k", "dtype", "window"):
        got, expected = getattr(pool, name), getattr(ref, name)
        if got != expected:
            raise ValueError(f"pool must match the model: {name} = {expected} (as "
                             f"BlockPool.for_model builds it), got {got}")
    if is_torch_model and pool.K.device != _device(model):
        raise ValueError(f"pool is on {pool.K.device} but the model is on {_device(model)}")


def static_batching(model: Any, requests: Sequence[Request],
                    batch_size: int) -> tuple[dict[int, list[int]], int]:
    """The baseline: batches in arrival order, each decoded until its longest request is done.

    Returns ({rid: tokens}, model calls): a batch whose longest request wants n tokens costs n
    calls (a prefill of the left-padded prompts, then n - 1 one-token steps over the whole batch,
    finished rows included), `generate` with a dense cache.
    """
    batch_size = require_int("batch_size", batch_size)
    if isinstance(requests, Request) or not isinstance(requests, Sequence) or not requests:
        raise TypeError(f"requests must be a non-empty list of Request, got "
                        f"{type(requests).__name__}")
    bad = next((r for r in requests if not isinstance(r, Request)), None)
    if bad is not None:
        raise TypeError(f"requests must hold Request objects, got {type(bad).__name__} {bad!r:.60}")
    order = sorted(requests, key=lambda r: (r.arrival, r.rid))
    outputs, calls = {}, 0
    for i in range(0, len(order), batch_size):
        batch = order[i:i + batch_size]
        n = max(r.n_new for r in batch)
        toks = generate.generate(model, [r.prompt for r in batch], n)  # (B, n)
        rows = toks.tolist()
        for r, row in zip(batch, rows, strict=True):
            outputs[r.rid] = [int(t) for t in row[:r.n_new]]
        calls += n  # one prefill and n - 1 decode calls
    return outputs, calls
