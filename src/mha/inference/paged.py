"""A paged KV cache: keys and values in fixed-size blocks, a block table per sequence (vLLM's design).

Shape legend: L layers, N blocks in the pool, h_kv key/value heads, bs = block_size slots per
block, d_k head width, B sequences in a batch, t_new new tokens per call, S keys a row reads.

The dense cache (`kv_cache.KVCache`) reserves max_len slots per sequence up front; most stay
empty when requests differ in length. A pool instead holds N blocks of bs slots for every layer,

    K, V       (L, N, h_kv, bs, d_k)   keys and values, one pool per layer
    positions  (N, bs) int64           each slot's token position, EMPTY (-1) where none
    refcounts  (N,)                    how many block tables hold each block
    tables     {seq_id: [block, ...]}  one block table per sequence, shared by all layers

and a sequence takes one more block only when its last one is full, so at most bs - 1 slots per
sequence go unused. Requests that start with the same prompt share its blocks (`fork`: reference
counts); a sequence that appends into a shared, partly filled block copies it first
(copy-on-write), so the other holder's keys never change.

Reading through the block table is a gather: K[layer][table] (B, n, h_kv, bs, d_k) laid out as
(B, h_kv, n * bs, d_k), the layout a dense cache returns, with each slot's position; unused
slots carry EMPTY, which the module's mask never attends (as pads), so RoPE (keys are rotated
before they are stored), GQA, windows (masked by positions; every block kept) and ragged
batches need nothing new in the attention.

Every layer of a model call reads the same tables, so the index arithmetic is done once per call,
on the host in numpy ints, and reused: a write plan (each real token's flat row in the pool and in
the chunk) and a gather plan (the (block, head) rows to copy, the slots each row wrote), each
stored under what it was computed from (the block tables, the lengths, which tokens are real). A
fork, free, reservation or copy-on-write changes the tables and so the key: nothing is invalidated
by hand. A layer's write is then one indexed copy for K, one for V and one for the positions; its
read is one indexed copy each, already in the dense cache's layout.

numpy and torch twins, same names and methods:
    BlockPool     / TorchBlockPool      the blocks, the tables, allocation, sharing, freeing
    PagedKVCache  / TorchPagedKVCache   one layer's view of a batch of sequences: the module's
                                        `cache=` (pool.batch(seq_ids) gives one per layer);
                                        update writes and gathers, gather only reads
    PoolExhausted                       a ValueError: the pool has fewer free blocks than needed
"""

from __future__ import annotations

import itertools
import math
import types
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from mha.inference.kv_cache import EMPTY, _host, _NumpyArrays, _TorchArrays, check_kv
from mha.validate import is_torch, require_int, require_shape, shape_of, torch

__all__ = ["EMPTY", "BlockPool", "PagedKVCache", "PoolExhausted", "TorchBlockPool",
           "TorchPagedKVCache"]


class PoolExhausted(ValueError):
    """The pool has fewer free blocks than a reservation needs (nothing was changed)."""


class _Pool:
    """Shared logic of BlockPool and TorchBlockPool; subclasses only allocate and check array types."""

    _cache_type: type  # the twin's PagedKVCache

    def __init__(self, n_layers: int, n_blocks: int, block_size: int, n_kv_heads: int, d_k: int,
                 dtype=None, device=None, window: int | None = None):
        dtype = self._default_dtype() if dtype is None else dtype
        self.n_layers, self.n_blocks = require_int("n_layers", n_layers), require_int("n_blocks", n_blocks)
        self.block_size = require_int("block_size", block_size)
        self.n_kv_heads, self.d_k = require_int("n_kv_heads", n_kv_heads), require_int("d_k", d_k)
        self.window = None if window is None else require_int("window", window)
        self.dtype = self._dtype(dtype)
        shape = (self.n_layers, self.n_blocks, self.n_kv_heads, self.block_size, self.d_k)
        self.K = self._zeros(shape, self.dtype, device)  # (L, N, h_kv, bs, d_k)
        self.V = self._zeros(shape, self.dtype, device)  # (L, N, h_kv, bs, d_k)
        self.positions = self._zeros((self.n_blocks, self.block_size), "int64", device) + EMPTY  # (N, bs)
        self._refcounts = np.zeros(self.n_blocks, np.int64)  # (N,) host bookkeeping, as vLLM's
        self._free = list(range(self.n_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._tables: dict[Hashable, list[int]] = {}
        self._written: dict[Hashable, list[int]] = {}  # per sequence, tokens written per layer
        self._next: dict[Hashable, list[int]] = {}  # per sequence, 1 + largest position per layer
        self._freed: set = set()  # ids freed and not added again: "freed twice" says so
        # index plans (slots to write, blocks to gather), computed once per model call and reused by
        # every layer; keyed by everything they are computed from (the block tables included), so a
        # fork, free, reservation or copy-on-write changes the key: nothing to invalidate
        self._plans: dict[tuple, Any] = {}

    @classmethod
    def for_model(cls, model: Any, n_blocks: int, block_size: int) -> _Pool:
        """A pool sized to a model's attention layers (their n_kv_heads, d_k, dtype, window, device)."""
        layers = cls._attention_layers(model)
        first = layers[0]
        want = (first.n_kv_heads, first.d_k, first.dtype, first.options.window)
        for i, m in enumerate(layers):
            got = (m.n_kv_heads, m.d_k, m.dtype, m.options.window)
            if got != want:
                raise ValueError(f"every attention layer must share (n_kv_heads, d_k, dtype, window) "
                                 f"to share one pool: layer 0 has {want}, layer {i} has {got}")
        return cls(len(layers), n_blocks, block_size, want[0], want[1], want[2],
                   cls._device_of(first), want[3])

    def __repr__(self) -> str:
        ring = f", window={self.window}" if self.window is not None else ""
        return (f"{type(self).__name__}(n_layers={self.n_layers}, n_blocks={self.n_blocks}, "
                f"block_size={self.block_size}, n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, "
                f"dtype={self.dtype}{ring}; {len(self._tables)} sequences, {self.n_used} blocks used)")

    # ---- what the pool holds -------------------------------------------------------------
    @property
    def tables(self) -> types.MappingProxyType:
        """{seq_id: block table} as copies: read them, change them through the methods only."""
        return types.MappingProxyType({s: list(t) for s, t in self._tables.items()})

    @property
    def refcounts(self) -> np.ndarray:
        """(N,) how many block tables hold each block (a copy)."""
        return self._refcounts.copy()

    @property
    def free_blocks(self) -> list[int]:
        """The free list, next block handed out last (a copy)."""
        return list(self._free)

    @property
    def n_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def n_used(self) -> int:
        """Blocks some sequence holds."""
        return self.n_blocks - len(self._free)

    def length(self, seq_id: Hashable) -> int:
        """Tokens the sequence holds (the most any layer has written)."""
        return max(self._written[self._known(seq_id)])

    @property
    def tokens_held(self) -> int:
        """Slots holding a real token, each shared block counted once (what the memory stores)."""
        bs, tables = self.block_size, list(self._tables.values())
        sizes = np.array([len(t) for t in tables], np.int64)  # (n_seq,) blocks each table holds
        flat = np.fromiter(itertools.chain.from_iterable(tables), np.int64, int(sizes.sum()))  # (n,)
        if flat.size and 0 <= flat.min() and flat.max() < self.n_blocks:  # ids in range: one vectorised pass
            lengths = np.array([self.length(s) for s in self._tables], np.int64)  # (n_seq,)
            index = np.arange(flat.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # (n,) i of table[i]
            fill = np.zeros(self.n_blocks, np.int64)  # (N,) a block's fill: the most any holder wrote
            np.maximum.at(fill, flat, np.minimum(bs, np.repeat(lengths, sizes) - index * bs))
            return int(fill.sum())
        fill: dict[int, int] = {}
        for s, table in self._tables.items():
            n = self.length(s)
            for i, b in enumerate(table):
                fill[b] = max(fill.get(b, 0), min(self.block_size, n - i * self.block_size))
        return sum(max(f, 0) for f in fill.values())

    @property
    def slot_use(self) -> float:
        """tokens_held / (blocks in use * block_size): the fraction of reserved slots in use (0 if none)."""
        return self.tokens_held / (self.n_used * self.block_size) if self.n_used else 0.0

    @property
    def nbytes(self) -> int:
        """Memory of K and V together: 2 * L * N * h_kv * bs * d_k * itemsize (allocated, not used)."""
        return (2 * self.n_layers * self.n_blocks * self.n_kv_heads * self.block_size * self.d_k
                * self.dtype.itemsize)

    # ---- sequences -----------------------------------------------------------------------
    def add(self, seq_id: Hashable) -> None:
        """A new, empty sequence (no blocks until it gets tokens)."""
        self._hashable(seq_id)
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} is already in the pool; free it first or pick "
                             f"another id")
        self._tables[seq_id] = []
        self._written[seq_id] = [0] * self.n_layers
        self._next[seq_id] = [0] * self.n_layers
        self._freed.discard(seq_id)

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """child shares every block of parent (refcount + 1 each), its partly filled last block too."""
        self._known(parent)
        self._hashable(child)
        if child in self._tables:
            raise ValueError(f"fork's child {child!r} is already in the pool; pick a new id")
        self._tables[child] = list(self._tables[parent])
        self._written[child] = list(self._written[parent])
        self._next[child] = list(self._next[parent])
        for b in self._tables[child]:
            self._refcounts[b] += 1
        self._freed.discard(child)

    def free(self, seq_id: Hashable) -> None:
        """Drop the sequence: refcount - 1 on each of its blocks; blocks at 0 go back to the free list."""
        self._known(seq_id)
        for b in reversed(self._tables[seq_id]):  # reversed: its first block is handed out first again
            self._refcounts[b] -= 1
            if self._refcounts[b] == 0:
                self.positions[b] = EMPTY  # (bs,): a stale position can never be read as a token
                self._free.append(b)
        del self._tables[seq_id], self._written[seq_id], self._next[seq_id]
        self._freed.add(seq_id)

    def blocks_needed(self, seq_id: Hashable, n_new: int) -> int:
        """New blocks n_new more tokens need: the copy of a shared, partly filled last block included."""
        self._known(seq_id)
        n_new = require_int("n_new", n_new)
        return self._plan([(seq_id, self.length(seq_id), n_new)], check_size=False)[0]

    def blocks_needed_each(self, seq_ids: Sequence[Hashable], n_new: Sequence[int]) -> np.ndarray:
        """(len(seq_ids),) blocks_needed(s, n) of each pair, each counted alone; n = 0 needs none; one vectorised count."""
        if len(seq_ids) != len(n_new):
            raise ValueError(f"n_new must give one count per sequence: {len(seq_ids)} sequences, "
                             f"got {len(n_new)} counts")
        starts = [self.length(s) for s in seq_ids]  # length names an unknown sequence
        n = np.array([require_int("n_new", k, minimum=0) for k in n_new], np.int64)  # (B,)
        if (self._refcounts > 1).any():  # a shared block may need copying: count each as blocks_needed
            return np.array([self._plan([w], check_size=False)[0]
                             for w in zip(seq_ids, starts, n.tolist(), strict=True)], np.int64)
        bs = self.block_size
        held = np.array([len(self._tables[s]) for s in seq_ids], np.int64)  # (B,)
        total = -(-(np.array(starts, np.int64) + n) // bs)  # (B,) blocks each would span
        return np.where(n > 0, np.maximum(total - held, 0), 0)  # (B,) no block shared: no copies

    def reserve(self, seq_id: Hashable, n_new: int) -> None:
        """Allocate what n_new more tokens need (copy-on-write first); all or nothing (PoolExhausted)."""
        self._known(seq_id)
        n_new = require_int("n_new", n_new)
        self._reserve([(seq_id, self.length(seq_id), n_new)])

    def check_room(self, seq_ids: Sequence[Hashable], t_new: int) -> None:
        """Raise unless every sequence of seq_ids can take t_new more tokens (all together)."""
        t_new = require_int("t_new", t_new)
        self._plan([(s, self.length(self._known(s)), t_new) for s in seq_ids])

    def batch(self, seq_ids: Sequence[Hashable]) -> list[PagedKVCache]:
        """One cache per layer for this batch of sequences: the model's `caches` argument."""
        if isinstance(seq_ids, str | bytes) or not isinstance(seq_ids, Sequence) or not seq_ids:
            raise TypeError(f"seq_ids must be a non-empty list of sequence ids, got {seq_ids!r:.60}")
        for s in seq_ids:
            self._known(s)
        if len(set(seq_ids)) != len(seq_ids):
            twice = next(s for s in seq_ids if list(seq_ids).count(s) > 1)
            raise ValueError(f"seq_ids must name each sequence once, got {twice!r} twice")
        return [self._cache_type(self, layer, list(seq_ids)) for layer in range(self.n_layers)]

    def check(self) -> None:
        """Raise naming the block unless: each refcount = tables holding it, no table holds a free block."""
        count = np.zeros(self.n_blocks, np.int64)  # (N,)
        for s, table in self._tables.items():
            for b in table:
                if not 0 <= b < self.n_blocks:
                    raise RuntimeError(f"sequence {s!r}'s block table holds block {b}, outside "
                                       f"0..{self.n_blocks - 1}")
                count[b] += 1
        free = set(self._free)
        if len(free) != len(self._free):
            raise RuntimeError(f"the free list holds a block twice: {sorted(self._free)}")
        for s, table in self._tables.items():
            self._check_live(s, table, free)
        for b in range(self.n_blocks):
            if count[b] != self._refcounts[b]:
                raise RuntimeError(f"block {b} has refcount {self._refcounts[b]} but {count[b]} "
                                   f"block tables hold it")
            if (count[b] == 0) != (b in free):
                raise RuntimeError(f"block {b} is held by {count[b]} tables and is "
                                   f"{'' if b in free else 'not '}on the free list")

    # ---- inside -------------------------------------------------------------------------
    def _memo(self, key: tuple, make) -> Any:
        """The plan stored under key, made by make() the first time (a few kept: one call's worth)."""
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 16:  # the oldest goes: plans live for one call or two
                del self._plans[next(iter(self._plans))]
            plan = self._plans[key] = make()
        return plan

    def _table_array(self, tables: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
        """The tables as one host array (B, n_max), short rows padded with block 0, and whether each entry is real."""
        def make() -> tuple[np.ndarray, np.ndarray]:
            n_max = max(1, max(len(t) for t in tables))
            tab = np.zeros((len(tables), n_max), np.int64)  # (B, n_max)
            real = np.zeros((len(tables), n_max), bool)  # (B, n_max)
            for r, t in enumerate(tables):  # one slice per row, not per token
                tab[r, :len(t)] = t
                real[r, :len(t)] = True
            return tab, real
        return self._memo(("tables", tables), make)

    def _check_tables(self, seq_ids: Sequence[Hashable], tab: np.ndarray, real: np.ndarray) -> None:
        """_check_live on the entries of tab (B, n_max) where real, every row in one look-up; the first bad row raises.

        A pass is remembered under everything it read (the entries, the free list, the refcounts), so
        the other layers of a call skip it; any change to those checks again.
        """
        key = ("live", tab.shape, tab.tobytes(), real.tobytes(), tuple(self._free),
               self._refcounts.tobytes())
        if key in self._plans:
            return
        free = np.zeros(self.n_blocks, bool)  # (N,)
        free[self._free] = True
        held = tab[real]  # (n,) every block the rows hold
        if (free[held] | (self._refcounts[held] <= 0)).any():
            free_set = set(self._free)
            for s, row, r in zip(seq_ids, tab, real, strict=True):
                self._check_live(s, [int(b) for b in row[r]], free_set)
        self._memo(key, lambda: True)

    def _check_live(self, seq_id: Hashable, table: Sequence[int], free: set | None = None) -> None:
        """Raise naming the block and the sequence if its table points at a freed block."""
        free = set(self._free) if free is None else free
        for b in table:
            if b in free or self._refcounts[b] <= 0:
                raise RuntimeError(f"sequence {seq_id!r}'s block table points at block {b}, which is "
                                   f"free (refcount {self._refcounts[b]}): a block freed while "
                                   f"still in use")

    def _hashable(self, seq_id: Any) -> None:
        try:
            hash(seq_id)
        except TypeError:
            raise TypeError(f"a sequence id must be hashable (an int or a str), got "
                            f"{type(seq_id).__name__} {seq_id!r:.60}") from None

    def _known(self, seq_id: Any) -> Hashable:
        self._hashable(seq_id)
        if seq_id not in self._tables:
            why = "it was freed already" if seq_id in self._freed else "it was never added"
            raise ValueError(f"sequence {seq_id!r} is not in the pool ({why}); it holds "
                             f"{', '.join(map(repr, list(self._tables)[:8])) or 'no sequence'}")
        return seq_id

    def _plan(self, writes: list[tuple[Hashable, int, int]], check_size: bool = True) -> list[int]:
        """Blocks each write (seq_id, start slot, n tokens) needs, copies included; raise if they don't fit.

        Sequential, on a copy of the refcounts: of two rows sharing a block, the first copies it
        and the second then holds it alone.
        """
        refs = {}
        needs = []
        for seq_id, start, n in writes:
            if n == 0:  # a row of pads only: nothing to store, nothing to copy
                needs.append(0)
                continue
            table, bs = self._tables[seq_id], self.block_size
            stop = start + n
            total = math.ceil(stop / bs)
            if check_size and total > self.n_blocks:
                raise ValueError(f"sequence {seq_id!r} would hold {stop} tokens, {total} blocks of "
                                 f"{bs}, but the whole pool has {self.n_blocks} blocks: the request "
                                 f"is longer than the pool can ever hold")
            copies = 0
            for i in range(start // bs, min(len(table), total)):  # held blocks this write touches
                b = table[i]
                if refs.get(b, self._refcounts[b]) > 1:
                    refs[b] = refs.get(b, self._refcounts[b]) - 1
                    copies += 1
            needs.append(copies + max(0, total - len(table)))
        if check_size and sum(needs) > len(self._free):
            raise PoolExhausted(f"the pool is exhausted: {sum(needs)} blocks needed, {len(self._free)} "
                                f"free (of {self.n_blocks}); free a sequence or wait")
        return needs

    def _reserve(self, writes: list[tuple[Hashable, int, int]]) -> None:
        """Make room for each write (seq_id, start slot, n): copy shared blocks it touches, add blocks."""
        self._plan(writes)  # raises before anything changes
        bs = self.block_size
        for seq_id, start, n in writes:
            if n == 0:
                continue
            table, total = self._tables[seq_id], math.ceil((start + n) / bs)
            for i in range(start // bs, min(len(table), total)):
                old = table[i]
                if self._refcounts[old] > 1:  # copy-on-write: every layer's keys, values, positions
                    new = self._free.pop()
                    self.K[:, new], self.V[:, new] = self.K[:, old], self.V[:, old]  # (L, h_kv, bs, d_k)
                    self.positions[new] = self.positions[old]  # (bs,)
                    self._refcounts[old] -= 1
                    self._refcounts[new] = 1
                    table[i] = new
            while len(table) < total:
                new = self._free.pop()
                self.positions[new] = EMPTY  # (bs,)
                self._refcounts[new] = 1
                table.append(new)


class BlockPool(_NumpyArrays, _Pool):
    """numpy blocks K, V (L, N, h_kv, bs, d_k), their positions (N, bs), the tables and refcounts."""

    _noun = "pool"

    @staticmethod
    def _attention_layers(model: Any) -> list:
        layers = getattr(model, "attention_layers", None)
        if layers is None or _is_torch_model(model):
            raise TypeError(f"BlockPool.for_model needs a NumpyTinyTransformer (a torch model takes "
                            f"TorchBlockPool), got {type(model).__name__}")
        return list(layers)

    @staticmethod
    def _device_of(module: Any) -> None:
        return None

    def _index(self, a: np.ndarray) -> np.ndarray:
        return a

    @staticmethod
    def _take(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return a.take(rows, axis=0)

    @staticmethod
    def _put(a: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        a[rows] = values

    @staticmethod
    def _int64(a: np.ndarray) -> np.ndarray:
        return a.astype(np.int64)



def _is_torch_model(model: Any) -> bool:
    """True for a torch nn.Module (its parameters are tensors)."""
    return hasattr(model, "parameters") and hasattr(model, "named_modules")


class TorchBlockPool(_TorchArrays, _Pool):
    """torch blocks K, V (L, N, h_kv, bs, d_k) on one device, positions (N, bs), tables and refcounts."""

    _noun = "pool"

    @staticmethod
    def _attention_layers(model: Any) -> list:
        if not _is_torch_model(model) or not hasattr(model, "blocks"):
            raise TypeError(f"TorchBlockPool.for_model needs a torch TinyTransformer (a numpy model "
                            f"takes BlockPool), got {type(model).__name__}")
        return [b.attn for b in model.blocks]

    @staticmethod
    def _device_of(module: Any):
        return module.out_proj.weight.device

    @property
    def device(self):
        """Where K, V and positions live."""
        return self.K.device

    def _index(self, a: np.ndarray):
        return torch.as_tensor(a, device=self.K.device)

    @staticmethod
    def _take(a, rows):
        return a.index_select(0, rows)

    @staticmethod
    def _put(a, rows, values) -> None:
        a.index_copy_(0, rows, values)

    @staticmethod
    def _int64(a):
        return a.to(torch.int64)


    @property
    def nbytes(self) -> int:
        """Memory of K and V together: 2 * L * N * h_kv * bs * d_k * itemsize (allocated, not used)."""
        return 2 * self.K.numel() * self.K.element_size()


class _PagedCache:
    """One layer's view of a batch of sequences in a pool; what the module's `cache=` receives."""

    paged = True  # compose.check_cache: no `mask=`, room is reserved exactly by update

    def __init__(self, pool: _Pool, layer: int, seq_ids: list[Hashable]):
        self.pool, self.layer, self.seq_ids = pool, layer, seq_ids
        self.B, self.n_heads, self.d_k = len(seq_ids), pool.n_kv_heads, pool.d_k
        self.dtype, self.window = pool.dtype, pool.window

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(layer={self.layer}, seq_ids={self.seq_ids}, "
                f"lengths={self.lengths()})")

    def lengths(self) -> list[int]:
        """Tokens each row holds in this layer."""
        return self._per_row(self.pool._written)

    def _per_row(self, counters: dict[Hashable, list[int]]) -> list[int]:
        """This layer's entry of counters for each row; a sequence no longer in the pool raises as _known."""
        try:
            return [counters[s][self.layer] for s in self.seq_ids]
        except KeyError:
            for s in self.seq_ids:
                self.pool._known(s)  # names the sequence and why it is gone
            raise

    def __len__(self) -> int:
        return max(self.lengths())

    def _next_host(self) -> np.ndarray:
        """(B,) host int64: one past the largest position each sequence holds in this layer."""
        return np.array(self._per_row(self.pool._next), np.int64)

    def next_positions(self):
        """(B,) the position each sequence's next token takes: one past the largest it holds (0 if empty)."""
        return self.pool._index(self._next_host())  # (B,)

    def check_room(self, t_new: int) -> None:
        """Raise unless the pool can take t_new more tokens in every row (pads counted as tokens)."""
        t_new = require_int("t_new", t_new)
        self.pool._plan([(s, w, t_new) for s, w in zip(self.seq_ids, self.lengths(), strict=True)])

    @staticmethod
    def _plan_key(kind: str, tables: tuple[tuple[int, ...], ...], *rest: Any) -> tuple:
        """What a plan is computed from: the block tables included, so no table change can reuse a stale one."""
        return (kind, tables, *rest)

    def _table_key(self) -> tuple[tuple[int, ...], ...]:
        """The rows' block tables as a hashable key (a few microseconds for a batch)."""
        return tuple(tuple(self.pool._tables[s]) for s in self.seq_ids)

    def update(self, k, v, positions):
        """Store k, v (B, h_kv, t_new, d_k) at positions (B, t_new); return (K, V, key positions) to read.

        Each row's real tokens (position >= 0; pads are not stored) go after its sequence's
        tokens in this layer, blocks reserved (copy-on-write included) all or nothing before the
        first write; then each row's blocks are gathered through its block table (`gather`):
        K, V (B, h_kv, S, d_k), k_pos (B, S), S the longest row, EMPTY in unused slots.
        """
        pool = self.pool
        t_new = self._check_chunk(k, v)
        positions, host = self._check_positions(positions, t_new)
        real = host >= 0  # (B, t_new) host: which tokens are stored
        written = self.lengths()
        tables = self._table_key()
        # a table that points at a freed block: refused before any write (all rows in one look-up)
        pool._check_tables(self.seq_ids, *pool._table_array(tables))
        counts = real.sum(1)  # (B,)
        pool._reserve([(s, w, int(c)) for s, w, c in zip(self.seq_ids, written, counts, strict=True)])
        self._write(k, v, positions, real, written)
        return self._gather(check=False)  # the tables were checked above; reserving adds free blocks only

    def _write(self, k, v, positions, real: np.ndarray, written: list[int]) -> None:
        """Write each row's real tokens at its next slots, in this layer's K, V and the positions."""
        pool = self.pool
        if not real.any():
            return
        tables = self._table_key()
        key = self._plan_key("write", tables, tuple(written), real.shape, real.tobytes())
        to, frm, to_pos, frm_pos = pool._memo(key, lambda: self._write_plan(tables, real, written))
        B, h, t_new, d = shape_of(k)
        # flat rows: the pool's (N, h_kv, bs, d_k) -> (N h_kv bs, d_k), a view; the chunk's
        # (B, h_kv, t_new, d_k) -> (B h_kv t_new, d_k); one row per real token and head
        for pool_kv, new in ((pool.K, k), (pool.V, v)):
            pool._put(pool_kv[self.layer].reshape(-1, d), to, pool._take(new.reshape(B * h * t_new, d), frm))
        # positions (N, bs) -> (N bs,), a view; the chunk's (B, t_new) -> (B t_new,)
        pool._put(pool.positions.reshape(-1), to_pos, pool._int64(pool._take(positions.reshape(-1), frm_pos)))
        counts = real.sum(1).tolist()  # (B,) as Python ints
        tops = (np.where(real, _host(positions), -1).max(1) + 1).tolist()  # (B,) one past each row's largest
        for b, s in enumerate(self.seq_ids):  # host bookkeeping, one entry per row
            if counts[b]:
                pool._written[s][self.layer] = written[b] + counts[b]
                pool._next[s][self.layer] = max(pool._next[s][self.layer], tops[b])

    def _write_plan(self, tables: tuple[tuple[int, ...], ...], real: np.ndarray,
                    written: list[int]) -> tuple:
        """Flat rows each real token goes to and comes from: (n h_kv,) twice for K, V, (n,) twice for positions."""
        bs, h = self.pool.block_size, self.n_heads
        t_new = real.shape[1]
        tab, _ = self.pool._table_array(tables)  # (B, n_max)
        rows, cols = np.nonzero(real)  # (n,) each: row-major, so each row's tokens stay in order
        counts = real.sum(1)  # (B,)
        starts = np.cumsum(counts) - counts  # (B,) first entry of each row in rows/cols
        slots = np.asarray(written, np.int64)[rows] + np.arange(rows.size) - starts[rows]  # (n,)
        blocks, offsets = tab[rows, slots // bs], slots % bs  # (n,) each
        heads = np.arange(h)[None, :]  # (1, h_kv)
        # (block, head, offset) in (N, h_kv, bs) and (row, head, col) in (B, h_kv, t_new), flattened:
        # (n, 1) with (1, h_kv) -> (n, h_kv) -> (n h_kv,)
        to = ((blocks[:, None] * h + heads) * bs + offsets[:, None]).reshape(-1)
        frm = ((rows[:, None] * h + heads) * t_new + cols[:, None]).reshape(-1)
        to_pos, frm_pos = blocks * bs + offsets, rows * t_new + cols  # (n,) each
        return tuple(self.pool._index(a) for a in (to, frm, to_pos, frm_pos))

    def gather(self):
        """What the rows hold, read through their block tables: K, V (B, h_kv, S, d_k), k_pos (B, S).

        S is the longest row; a shorter row's unused slots hold EMPTY positions (never attended).
        A table that points at a freed block is refused, naming the block and the sequence.
        """
        return self._gather(check=True)

    def _gather(self, check: bool):
        """gather(), the live check of the tables optional (update has just made it)."""
        pool = self.pool
        lengths = self.lengths()
        tables = self._table_key()
        key = self._plan_key("gather", tables, tuple(lengths))
        plan = pool._memo(key, lambda: self._gather_plan(tables, lengths))
        blocks, rows, held, held_host, S, n = plan
        if check:
            pool._check_tables(self.seq_ids, pool._table_array(tables)[0], held_host)
        bs, N = pool.block_size, pool.n_blocks
        # one row per (block, head): (N, h_kv, bs, d_k) -> (N h_kv, bs, d_k), a view; rows (B h_kv n,)
        # picks them in (B, h_kv, n) order, so one copy lands in the layout a dense cache returns
        K = pool._take(pool.K[self.layer].reshape(N * self.n_heads, bs, self.d_k), rows)  # (B h n, bs, d_k)
        V = pool._take(pool.V[self.layer].reshape(N * self.n_heads, bs, self.d_k), rows)  # (B h n, bs, d_k)
        # the blocks side by side: (B h_kv n, bs, d_k) -> (B, h_kv, n bs, d_k), no copy
        K = K.reshape(self.B, self.n_heads, n * bs, self.d_k)
        V = V.reshape(self.B, self.n_heads, n * bs, self.d_k)
        pos = pool._take(pool.positions, blocks).reshape(self.B, n * bs)  # (B n, bs) -> (B, n bs)
        pos = self._where(held, pos)  # (B, n bs)
        return K[:, :, :S], V[:, :, :S], pos[:, :S]  # (B, h_kv, S, d_k) twice, (B, S)

    def _gather_plan(self, tables: tuple[tuple[int, ...], ...], lengths: list[int]) -> tuple:
        """Blocks (B n,), (block, head) rows (B h_kv n,), slots written (B, n bs) on the device; entries read (host), S, n."""
        pool, bs = self.pool, self.pool.block_size
        S = max(max(lengths), 1)
        n = math.ceil(S / bs)  # blocks of the longest row
        tab, _ = pool._table_array(tables)  # (B, n_max)
        table = np.zeros((self.B, n), np.int64)  # (B, n): short rows padded with block 0, masked
        m = min(n, tab.shape[1])
        table[:, :m] = tab[:, :m]
        n_held = -(-np.asarray(lengths, np.int64) // bs)  # (B,) blocks each row has written into
        held_host = np.arange(n)[None, :] < n_held[:, None]  # (B, n): the table entries read
        table[~held_host] = 0
        lengths_col = np.asarray(lengths, np.int64)[:, None]  # (B, 1)
        held = np.arange(n * bs)[None, :] < lengths_col  # (B, n bs): slots this layer wrote
        held_full = np.zeros(tab.shape, bool)  # (B, n_max): held_host placed in the full table
        held_full[:, :m] = held_host[:, :m]
        # block b's head j is row b h_kv + j of (N h_kv, bs, d_k): (B, 1, n) + (1, h_kv, 1) -> (B, h_kv, n)
        rows = table[:, None, :] * self.n_heads + np.arange(self.n_heads)[None, :, None]
        return (pool._index(table.reshape(-1)), pool._index(rows.reshape(-1)), pool._index(held),
                held_full, S, n)

    def _where(self, held: np.ndarray, pos):
        """pos where held, EMPTY elsewhere."""
        held = self.pool._index(held)
        return torch.where(held, pos, EMPTY) if is_torch(pos) else np.where(held, pos, EMPTY)

    def _check_chunk(self, k, v) -> int:
        """Check k, v against the pool (array type, dtype, shape); return t_new."""
        expected = (("B", self.B), ("h_kv", self.n_heads), ("t_new", None), ("d_k", self.d_k))
        return check_kv(k, v, expected, self.dtype, self.pool._check_array, "pool")

    def _check_positions(self, positions, t_new: int) -> tuple[Any, np.ndarray]:
        """positions (B, t_new) whole numbers, the real ones after every position the row holds; with a host copy."""
        self.pool._check_array("positions", positions)
        require_shape("positions", positions, (("B", self.B), ("t_new", t_new)))
        if "int" not in str(positions.dtype):
            raise TypeError(f"positions must hold whole numbers, got dtype {positions.dtype}")
        host = _host(positions)  # (B, t_new)
        last = self._next_host() - 1  # (B,): the latest position each row holds
        clash = (host >= 0) & (host <= last[:, None])  # (B, t_new); pads exempt
        if clash.any():
            b, t = (int(i) for i in np.argwhere(clash)[0])
            raise ValueError(f"positions must come after the cached ones: sequence "
                             f"{self.seq_ids[b]!r} (row {b}) holds up to position {int(last[b])}, "
                             f"and the chunk has {int(host[b, t])}")
        return positions, host


class PagedKVCache(_PagedCache):
    """numpy: one layer of a BlockPool for a batch of sequences (the module's `cache=`)."""

    def __init__(self, pool: BlockPool, layer: int, seq_ids: list[Hashable]):
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        super().__init__(pool, layer, seq_ids)


class TorchPagedKVCache(_PagedCache):
    """torch: one layer of a TorchBlockPool for a batch of sequences (the module's `cache=`)."""

    def __init__(self, pool: TorchBlockPool, layer: int, seq_ids: list[Hashable]):
        if not isinstance(pool, TorchBlockPool):
            raise TypeError(f"pool must be a TorchBlockPool, got {type(pool).__name__}")
        super().__init__(pool, layer, seq_ids)

    def update(self, k, v, positions):
        """Store k, v (B, h_kv, t_new, d_k) at positions (B, t_new); return K, V, k_pos as the numpy twin."""
        with torch.no_grad():  # decoding is inference: the pool must not grow an autograd graph
            return super().update(k, v, positions)


BlockPool._cache_type = PagedKVCache
TorchBlockPool._cache_type = TorchPagedKVCache
