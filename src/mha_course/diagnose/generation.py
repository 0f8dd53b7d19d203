"""Say what is wrong with a student's generation code (17_generation.ipynb, A6), as `mha_course.diagnose`
does for the forward.

    check_positions(left_padded_positions)            # positions of a left-padded batch
    check_generation(greedy_generate, model, tokens, positions, n_new)   # greedy decoding, cached
    check_ring(RingCache)                             # a rolling window cache of `window` slots
    check_cache_bytes(kv_cache_bytes)                 # what the caches of a GQA model hold
    (each has a *_diagnosis twin that returns the Diagnosis object instead of raising)

How it decides. Positions: the student's array goes through the judge of 17_generation.ipynb's Try-it,
`mha_course.tryit.generation.judge_padded_positions`, which names the usual mistakes it matches (a pad
is any negative position, as the lesson's table says). Generation: the model is wrapped in a
`Recorder` that writes down every call (tokens, the positions the model will use, which caches),
so the verdict rests on values: the new tokens must equal the reference's (`mha.inference.generate.generate`),
and the calls must feed every token exactly once, at its position, into caches made once by
`model.new_caches`; where they do not, the first call that differs names the mistake (position
restarted at 0, off by one, counted from the padded width, the whole sequence fed again, no cache,
argmax over the batch axis). Ring cache: a windowed `MultiHeadAttention` decodes a left-padded
batch through the student's cache, and its outputs must equal the module's full forward with
the window's band mask; where they differ, the planted rings (`RING_MISTAKES`) run on the same
calls and the one that matches is named; a cache whose arrays keep growing after `window` tokens
is named too. Cache bytes: the formula of `mha.inference.generate.cache_bytes_formula`, and each usual
slip computed beside it.

Shape legend: B batch, T prompt columns, V vocabulary, h_kv key/value heads, d_k head width.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha.inference.generate import (
    cache_bytes_formula as _bytes_formula,  # bound at import: a grader's
)
from mha.inference.generate import (
    generate as _generate,  # diagnose.refusing(generate, ...) cannot reach them
)
from mha.inference.kv_cache import KVCache
from mha.modules import compose
from mha.validate import shape_of
from mha_course.diagnose import Diagnosis, _to_numpy
from mha_course.diagnose import run_student as _run
from mha_course.tryit import NotYet, words_of
from mha_course.tryit.generation import judge_padded_positions


def _ints(out: Any, what: str) -> tuple[np.ndarray | None, str | None]:
    """The student's value as an int64 array (whole-number floats are fine), or a problem."""
    if out is None:
        return None, f"{what} returned None: did you forget the `return`?"
    try:
        arr = np.asarray(_to_numpy(out))
    except Exception as e:  # ragged lists and the like
        return None, f"{what} returned something that is not an array ({type(e).__name__}: {e})"
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        return None, f"{what} must return whole numbers, got dtype {arr.dtype}"
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.round(arr)):
            return None, f"{what} must return whole numbers, got {arr.dtype} values such as {arr.flat[0]!r}"
    return arr.astype(np.int64), None


# ---- part 1: positions of a left-padded batch ----------------------------------------------------
POSITION_CASES: tuple[tuple[tuple[int, ...], int], ...] = (
    ((2, 5, 3), 5), ((1, 4), 6), ((3,), 3), ((4, 1, 4, 2), 4), ((7, 2, 5), 9), ((1, 1), 1))
"""(lengths, T) the positions are checked on; the first tells every usual mistake apart."""


def positions_diagnosis(fn: Callable, cases: Sequence[tuple[Sequence[int], int]] = POSITION_CASES,
                        as_array: bool = False) -> Diagnosis:
    """Run fn(lengths, T) on each case; the first wrong one is judged by judge_padded_positions."""
    for lengths, T in cases:
        arg = np.array(lengths) if as_array else list(lengths)
        call = f"left_padded_positions({list(lengths)}, T={T})"
        out, problem = _run(fn, arg, T)
        if problem is None:
            got, problem = _ints(out, call)
            if problem is None:
                try:
                    judge_padded_positions(got, lengths, T)
                except NotYet as e:
                    problem = words_of(str(e))  # either edition's prefix
                    problem = f"{call}: {problem}\n  yours {got.tolist()}"
                else:
                    continue
        else:
            problem = f"{call} {problem}"
        return Diagnosis("left_padded_positions", False, problem)
    return Diagnosis("left_padded_positions", True,
                     f"left_padded_positions matches on {len(cases)} batch(es): each sequence counts "
                     f"0, 1, ... from its own first token, every pad is -1",
                     cases=tuple(f"{list(c)}, T={t}" for c, t in cases))


def check_positions(fn: Callable, cases: Sequence[tuple[Sequence[int], int]] = POSITION_CASES,
                    as_array: bool = False) -> str:
    """`positions_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return positions_diagnosis(fn, cases, as_array).check()


# ---- part 2: greedy decoding with the cache -------------------------------------------------------
def tiny_model(seed: int = 0, vocab: int = 23, d_model: int = 32, n_heads: int = 4,
               n_kv_heads: int = 2, n_layers: int = 2, window: int | None = None):
    """An untrained causal TinyTransformer (RoPE, GQA) as its numpy twin: greedy tokens are deterministic."""
    from mha.inference import generate  # torch: only when a model is asked for
    from mha.training import train

    torch_model = train.TinyTransformer(vocab=vocab, T=64, d_model=d_model, n_heads=n_heads,
                                        n_layers=n_layers, causal=True, seed=seed,
                                        n_kv_heads=n_kv_heads, rope="half", window=window)
    return generate.NumpyTinyTransformer(torch_model)


@dataclass
class Call:
    """One call of the model: what it was fed, where, and into which caches."""

    tokens: np.ndarray  # (B', t) as given
    positions: np.ndarray | None  # (B, t): the positions the model uses (None if it could not tell)
    caches: tuple[int, ...] | None  # ids of the caches passed, None without
    error: str | None = None  # what the model raised on this call


class Recorder:
    """The model, with every call and every `new_caches` written down (for the diagnosis)."""

    def __init__(self, model: Any):
        self.model, self.calls, self.made = model, [], []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["model"], name)  # vocab, T, attention_layers, ...

    def new_caches(self, B: int, max_len: int) -> list:
        """The model's caches, remembered."""
        caches = self.model.new_caches(B, max_len)
        self.made.append((B, max_len, tuple(id(c) for c in caches)))
        return caches

    def __call__(self, tokens: Any, positions: Any = None, caches: Any = None) -> np.ndarray:
        """The model's logits; the call is recorded first (even one the model then refuses)."""
        tok = np.array(_to_numpy(tokens), copy=True)
        where = None
        try:  # the positions the model will use: given, 0..T-1, or after the cache
            B, t = tok.shape
            first = caches[0] if caches else None
            where = np.broadcast_to(compose.query_positions(
                None if positions is None else np.asarray(positions), B, t, first, tok), (B, t)).copy()
        except Exception:  # the model raises its own, clearer error below
            pass
        call = Call(tok, where, None if caches is None else tuple(id(c) for c in caches))
        self.calls.append(call)
        try:
            logits = self.model(tokens, positions, caches)
        except Exception as e:
            call.error = f"{type(e).__name__}: {e}"
            raise
        return logits


def _fed(calls: list[Call]) -> tuple[np.ndarray, np.ndarray] | None:
    """Tokens and positions fed in all calls, column after column, or None if the rows disagree."""
    try:
        return (np.concatenate([c.tokens for c in calls], 1),
                np.concatenate([c.positions for c in calls], 1))
    except Exception:
        return None


def _position_slip(got: np.ndarray, want: np.ndarray, start: int, first: bool) -> str:
    """What a call's wrong positions (B, t) show, given the right ones and the column they start at."""
    t = got.shape[1]
    if first:
        if np.array_equal(got, np.broadcast_to(np.arange(t), got.shape)):
            return ("the prefill used positions 0..T-1 (or none) for every prompt: pass the padded "
                    "positions you were given, so the pads are -1 and each prompt counts from 0")
        return ("the prefill must use the positions you were given (pads -1, each prompt from 0); "
                f"yours {got.tolist()}")
    if not got.any():
        return ("the new token's position restarted at 0: it comes after the prompt, at one past "
                "each sequence's last position (positions[:, -1:] + 1, then + 1 per step)")
    if np.array_equal(got, want - 1):
        return ("off by one: the new token took the position of the token before it; it goes one "
                "past each sequence's last position (positions[:, -1:] + 1)")
    if np.array_equal(got, want + 1):
        return "off by one: the new token is one position too far (it skipped a position)"
    if np.array_equal(got, np.broadcast_to(start + np.arange(t), got.shape)):
        return ("the positions count the columns (the padded width T), not each sequence's own "
                "length: a prompt of length L, left-padded, has its next token at position L, not T")
    if t == 1 and len(set(got[:, 0].tolist())) == 1 and len(set(want[:, 0].tolist())) > 1:
        return (f"every sequence got position {int(got[0, 0])}: each has its own next position, "
                f"one past its own last one (positions[:, -1:] + 1 is (B, 1))")
    b, c = (int(i) for i in np.argwhere(got != want)[0])
    return (f"sequence {b} got position {int(got[b, c])} for its token in column {start + c}, "
            f"expected {int(want[b, c])}")


def _calls_problem(calls: list[Call], made: list, B: int, T: int, n_new: int, vocab: int,
                   tokens: np.ndarray, positions: np.ndarray, new: np.ndarray | None) -> str | None:
    """The first thing the model calls do wrong, or None. `new`: the student's tokens, if (B, n_new)."""
    if not calls:
        return "never called the model it was given (use the `model` argument, not a global)"
    wide = next((c for c in calls if c.tokens.ndim == 2 and c.tokens.shape[0] != B), None)
    if wide is not None:
        why = (" That is the vocabulary size: the argmax ran over the batch axis. Take it over "
               "the vocabulary, the last axis: logits[:, -1].argmax(-1) gives (B,)"
               if wide.tokens.shape[0] == vocab else "")
        return f"fed the model tokens of shape {wide.tokens.shape}: it needs (B={B}, t).{why}"
    if all(c.caches is None for c in calls):
        sizes = ", ".join(str(c.tokens.shape[1]) for c in calls[:4])
        return (f"never used the cache: the model ran {len(calls)} time(s) without caches, on "
                f"{sizes}{', ...' if len(calls) > 4 else ''} tokens. Make the caches once "
                f"(model.new_caches(B, T + n_new)), prefill the prompts into them, then feed only "
                f"the new token, (B, 1), at each step")
    if calls[0].caches is None:
        return ("the prefill ran without the caches, so the prompts' keys never reached them: pass "
                "the caches to the first call too")
    bare = [i for i, c in enumerate(calls) if c.caches is None]
    if bare:
        sizes = ", ".join(str(calls[i].tokens.shape[1]) for i in bare[:4])
        return (f"the steps never used the cache: {len(bare)} call(s) of the model after the "
                f"prefill ran without the caches, on {sizes}{', ...' if len(bare) > 4 else ''} "
                f"tokens. Pass the same caches to every call, and feed only the new token, (B, 1)")
    if len({c.caches for c in calls}) > 1:
        return ("the calls used different caches: make them once with model.new_caches, before "
                "the prefill, and pass the same ones to every call")
    if not any(ids == calls[0].caches for *_, ids in made):
        return "use caches made by model.new_caches(B, max_len)"
    seq_pos = np.concatenate([positions, positions[:, -1:] + 1 + np.arange(n_new)], 1)  # (B, T+n_new)
    seq_tok = None if new is None else np.concatenate([tokens, new], 1)
    start = 0
    for i, c in enumerate(calls):
        t = c.tokens.shape[1]
        if c.positions is None:
            return f"call {i + 1} of the model raised {c.error}" if c.error else \
                f"call {i + 1} of the model: tokens must be (B={B}, t) ids"
        again = i > 0 and start >= T and t > 1 and bool((c.positions[:, 0] <= seq_pos[:, start - 1]).any())
        if again or start + t > T + n_new:
            return (f"call {i + 1} fed {t} tokens after {start} were already in the cache: the "
                    f"whole sequence went into the cache again (duplicate keys). The cache keeps "
                    f"what it was fed; after the prefill, feed only the new token, (B, 1), at each step")
        want = seq_pos[:, start:start + t]
        if not np.array_equal(c.positions, want):
            return _position_slip(c.positions, want, start, first=i == 0)
        if seq_tok is not None and not np.array_equal(c.tokens, seq_tok[:, start:start + t]):
            what = "the prompts" if start < T else f"the token chosen at step {start - T + 1}"
            return (f"call {i + 1} fed tokens {c.tokens.tolist()}; expected {what}, "
                    f"{seq_tok[:, start:start + t].tolist()}: feed each step the token just chosen")
        if c.error:
            return f"call {i + 1} of the model raised {c.error}"
        start += t
    if start < T + n_new - 1 and new is not None:
        return (f"the model was fed {start} tokens in all; generating {n_new} after a prompt of "
                f"{T} columns feeds {T + n_new - 1} (the prompt, then each new token but the last)")
    return None


def generation_diagnosis(fn: Callable, model: Any, tokens: np.ndarray, positions: np.ndarray,
                         n_new: int) -> Diagnosis:
    """Run fn(model, tokens, positions, n_new) on a recording model and judge tokens and calls."""
    tokens, positions = np.asarray(tokens), np.asarray(positions)
    B, T = tokens.shape
    prompts = [[int(x) for x, p in zip(row, pos, strict=True) if p >= 0]
               for row, pos in zip(tokens, positions, strict=True)]
    want = np.asarray(_generate(model, prompts, n_new))  # (B, n_new)
    rec = Recorder(model)
    case = f"[case: B={B}, prompt lengths {[len(p) for p in prompts]}, T={T}, n_new={n_new}]"
    out, raised = _run(fn, rec, tokens.copy(), positions.copy(), n_new)
    if raised and "NotImplementedError" in raised:
        return Diagnosis("greedy_generate", False, f"greedy_generate {raised}")
    new, bad = (None, None) if raised else _ints(out, "greedy_generate")
    shape = None
    if new is not None and new.shape != want.shape:
        shape = f"greedy_generate must return the new tokens, (B, n_new) = {want.shape}; got {new.shape}"
        if new.shape == want.shape[::-1]:
            shape += ": stack the steps along axis 1 (np.stack(new, axis=1))"
        elif new.shape[:1] == (model.vocab,) or model.vocab in new.shape:
            shape += (": the argmax ran over the wrong axis; take it over the vocabulary, the last "
                      "axis: logits[:, -1].argmax(-1) is (B,)")
        elif new.shape == (B, T + n_new):
            shape += ": return only the n_new new tokens, not the prompt with them"
        new = None
    problem = _calls_problem(rec.calls, rec.made, B, T, n_new, model.vocab, tokens, positions, new)
    if raised:
        return Diagnosis("greedy_generate", False, f"greedy_generate {raised} {case}" +
                         (f"\nLikely cause: {problem}" if problem else ""))
    if bad or shape:
        return Diagnosis("greedy_generate", False, f"{bad or shape} {case}" +
                         (f"\nLikely cause: {problem}" if problem else ""))
    right = np.array_equal(new, want)
    if problem:
        lead = ("the tokens are right, but " if right else
                f"the tokens differ from greedy decoding (yours {new.tolist()}, expected "
                f"{want.tolist()}); ")
        return Diagnosis("greedy_generate", False, f"greedy_generate {case}: {lead}{problem}")
    if not right:
        b, s = (int(i) for i in np.argwhere(new != want)[0])
        return Diagnosis("greedy_generate", False,
                         f"greedy_generate {case}: sequence {b} step {s} chose token {int(new[b, s])}, "
                         f"greedy decoding chooses {int(want[b, s])} (the calls of the model look "
                         f"right: take the argmax of the LAST column's logits, logits[:, -1], over "
                         f"the vocabulary)")
    fed = sum(c.tokens.shape[1] for c in rec.calls)
    return Diagnosis("greedy_generate", True,
                     f"greedy_generate {case}: the tokens of greedy decoding, with {len(rec.calls)} "
                     f"call(s) of the model feeding {fed} token columns, each once, at its position, "
                     f"into one set of caches")


def check_generation(fn: Callable, model: Any, tokens: np.ndarray, positions: np.ndarray,
                     n_new: int) -> str:
    """`generation_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return generation_diagnosis(fn, model, tokens, positions, n_new).check()


# ---- part 3: a rolling window cache ---------------------------------------------------------------
class _GoodRing:
    """The ring the planted ones differ from: the window slots and the chunk are read, then written."""

    def __init__(self, B: int, n_heads: int, window: int, d_k: int):
        self.window, self.seen = window, 0
        self.K = np.zeros((B, n_heads, window, d_k))  # (B, h_kv, window, d_k)
        self.V = np.zeros((B, n_heads, window, d_k))
        self.pos = np.full((B, window), -1)  # (B, window): -1 = empty

    def _read(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> tuple:
        """The ring as it is, then the chunk: what the chunk's queries read."""
        return (np.concatenate([self.K, k], 2), np.concatenate([self.V, v], 2),
                np.concatenate([self.pos, positions], 1))  # (B, h_kv, window + t_new, d_k), (B, ...)

    def _write(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray, first: int,
               slots: np.ndarray) -> None:
        """Chunk columns first.. into these slots."""
        self.K[:, :, slots], self.V[:, :, slots] = k[:, :, first:], v[:, :, first:]
        self.pos[:, slots] = positions[:, first:]

    def update(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> tuple:
        t = k.shape[2]
        out = self._read(k, v, positions)
        first = max(0, t - self.window)
        self._write(k, v, positions, first, (self.seen + np.arange(first, t)) % self.window)
        self.seen += t
        return out


class _KeepsOldest(_GoodRing):
    """Once the ring is full nothing is written: it keeps the first window keys, not the last."""

    def update(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> tuple:
        t = k.shape[2]
        out = self._read(k, v, positions)
        n = max(0, min(t, self.window - self.seen))
        self._write(k[:, :, :n], v[:, :, :n], positions[:, :n], 0, self.seen + np.arange(n))
        self.seen += t
        return out


class _WritesBeforeReading(_GoodRing):
    """The chunk overwrites the ring before its queries read it: early queries lose their keys."""

    def update(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> tuple:
        super().update(k, v, positions)
        return self.K.copy(), self.V.copy(), self.pos.copy()


class _PositionsInArrivalOrder(_GoodRing):
    """K and V in ring-slot order, positions kept in arrival order: they disagree once it wraps."""

    def __init__(self, B: int, n_heads: int, window: int, d_k: int):
        super().__init__(B, n_heads, window, d_k)
        self.arrived = np.full((B, window), -1)  # (B, window), oldest first

    def update(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> tuple:
        filled = min(self.seen, self.window)
        K, V, _ = super().update(k, v, positions)  # K, V: the ring's slots, then the chunk
        pos = np.concatenate([self.arrived, positions], 1)  # positions: oldest first, not by slot
        newest = np.concatenate([self.arrived[:, :filled], positions], 1)[:, -self.window:]
        self.arrived = np.full_like(self.arrived, -1)
        self.arrived[:, :newest.shape[1]] = newest  # equals the slot order until the ring wraps
        return K, V, pos


class _CountsPositions(_GoodRing):
    """Positions made up by counting tokens (seen, seen + 1, ...), not the ones it was given."""

    def update(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> tuple:
        counted = np.broadcast_to(self.seen + np.arange(k.shape[2]), positions.shape).copy()
        return super().update(k, v, counted)  # (B, t): the same count for every row


RING_MISTAKES: dict[str, tuple[type, str]] = {
    "ignores_positions": (_CountsPositions,
        "your ring makes the keys' positions up by counting tokens (0, 1, 2, ...) instead of "
        "keeping the positions it is given: in a left-padded batch the pads are -1 and each "
        "prompt counts from its own first token, so counted positions are wrong for every row "
        "but the longest. Store positions[:, j] with its key and return those"),
    "keeps_oldest": (_KeepsOldest,
        "your cache keeps the OLDEST keys: once its window slots are full it stops writing. A "
        "query reads the last `window` keys, so each new key must overwrite the oldest slot, "
        "slot = (tokens seen) % window"),
    "writes_before_reading": (_WritesBeforeReading,
        "the chunk was written into the ring before its queries read it: the first queries of a "
        "chunk need keys up to window - 1 back, which the chunk's own writes overwrote. Return "
        "the ring as it was followed by the chunk (window + t_new keys), then keep the newest "
        "window"),
    "positions_in_arrival_order": (_PositionsInArrivalOrder,
        "the keys come back in ring-slot order but their positions in arrival order: once the "
        "ring wraps, slot j no longer holds the j-th oldest key, so keys get the wrong positions "
        "(and the wrong band of the window). Keep each slot's own position, written with its key"),
}
"""The planted rings the diagnosis runs beside a student's: (class, what it shows)."""


class RingProblem(AssertionError):
    """A student's ring returned something the attention cannot read."""


class _Through(KVCache):
    """A windowed KVCache to the module's checks, with the student's ring doing the work inside."""

    def __init__(self, ring: Any, B: int, n_heads: int, max_len: int, d_k: int, window: int):
        super().__init__(B, n_heads, max_len, d_k, window=window)
        self.ring, self.bytes = ring, []

    def update(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> tuple:
        """Hand the chunk to the student's update; check and return its (K, V, key positions)."""
        t = shape_of(k)[2]
        try:
            out = self.ring.update(k.copy(), v.copy(), np.array(positions))
        except NotImplementedError:
            raise RingProblem("RingCache.update is not written yet (it raises NotImplementedError)") from None
        except RingProblem:
            raise
        except Exception as e:
            hint = (" Likely cause: a slot index past the ring; wrap it, slot = (tokens seen) % window"
                    if isinstance(e, IndexError) else "")
            raise RingProblem(f"RingCache.update raised {type(e).__name__}: {e}.{hint}") from e
        self.length += t
        self.bytes.append(held_bytes(self.ring))
        return _read_back(out, self.B, self.n_heads, self.d_k)


def _read_back(out: Any, B: int, h: int, d_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The student's (K, V, key positions) as arrays the attention reads, or RingProblem saying why."""
    if out is None:
        raise RingProblem("RingCache.update returned None: return (K, V, key_positions)")
    if not isinstance(out, tuple | list) or len(out) != 3:
        raise RingProblem(f"RingCache.update must return three things, (K, V, key_positions); got "
                          f"{type(out).__name__}" + (f" of {len(out)}" if isinstance(out, tuple | list) else ""))
    K, V = (np.asarray(_to_numpy(a), dtype=np.float64) for a in out[:2])
    for name, a in (("K", K), ("V", V)):
        if a.ndim != 4 or a.shape[0] != B or a.shape[1] != h or a.shape[3] != d_k:
            raise RingProblem(f"RingCache.update returned {name} of shape {a.shape}; it must be "
                              f"(B={B}, n_heads={h}, S, d_k={d_k}), S the keys to read")
    if K.shape != V.shape:
        raise RingProblem(f"K {K.shape} and V {V.shape} must have the same shape")
    pos, problem = _ints(out[2], "RingCache.update's key_positions")
    if problem:
        raise RingProblem(problem)
    S = K.shape[2]
    if pos.shape not in ((B, S), (S,)):  # (S,): the same positions for every sequence
        raise RingProblem(f"key_positions must be (B={B}, S={S}), one position per key returned, "
                          f"got shape {pos.shape}")
    return K, V, np.broadcast_to(pos, (B, S))


def held_bytes(obj: Any, depth: int = 3) -> int:
    """Bytes of the numpy arrays an object keeps (in attributes, lists, tuples, dicts), `depth` deep."""
    seen: set[int] = set()

    def walk(o: Any, d: int) -> int:
        if id(o) in seen:
            return 0
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            return o.nbytes
        if d == 0 or isinstance(o, str | bytes | type):
            return 0
        if isinstance(o, dict):
            items = list(o.values())
        elif isinstance(o, list | tuple | set | frozenset | collections.deque):
            items = list(o)
        elif hasattr(o, "__dict__"):
            items = list(vars(o).values())
        else:
            return 0
        return sum(walk(i, d - 1) for i in items)

    return walk(obj, depth)


@dataclass(frozen=True)
class RingCase:
    """One decoding run through a rolling cache: a left-padded prefill, then chunks."""

    B: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    window: int
    lengths: tuple[int, ...]  # prompt lengths, left-padded to max(lengths) columns
    chunks: tuple[int, ...]  # the columns fed after the prefill, chunk by chunk
    seed: int = 0

    def __str__(self) -> str:
        return (f"window={self.window}, B={self.B}, n_kv_heads={self.n_kv_heads}, prompts "
                f"{list(self.lengths)} left-padded, then chunks {list(self.chunks)}")


RING_CASES: tuple[RingCase, ...] = (
    RingCase(2, 16, 4, 2, 4, (5, 3), (1,) * 8 + (3, 6), seed=0),
    RingCase(1, 8, 2, 1, 1, (3,), (1, 1, 2, 1), seed=1),
    RingCase(3, 12, 3, 3, 3, (2, 1, 2), (1, 4, 1, 1, 5), seed=2),
    RingCase(2, 16, 4, 1, 4, (9, 6), (1, 1, 1, 2), seed=3),
    RingCase(1, 16, 2, 2, 6, (2,), (1,) * 10, seed=4),
)
"""The runs a RingCache is checked on: the first shows every planted mistake."""


def _ring_run(make: Callable[[int, int, int, int], Any], case: RingCase, module, x: np.ndarray,
              pos: np.ndarray) -> tuple[list[np.ndarray], _Through | None, str | None]:
    """Decode x chunk by chunk through a ring `make(B, h_kv, window, d_k)` makes: (outputs, cache, problem)."""
    B, N = pos.shape
    outs: list[np.ndarray] = []
    try:
        ring = make(B, module.n_kv_heads, case.window, module.d_k)
    except NotImplementedError:
        return outs, None, "RingCache is not written yet (its __init__ raises NotImplementedError)"
    except Exception as e:
        return outs, None, f"RingCache({B}, {module.n_kv_heads}, {case.window}, {module.d_k}) raised {type(e).__name__}: {e}"
    cache = _Through(ring, B, module.n_kv_heads, N, module.d_k, case.window)
    s = 0
    for t in _sizes(case):
        try:
            with np.errstate(all="ignore"):
                outs.append(module(x[:, s:s + t], causal=True, positions=pos[:, s:s + t], cache=cache))
        except RingProblem as e:
            return outs, cache, f"{e} [call {len(outs) + 1}: {t} token(s) after {s}]"
        s += t
    return outs, cache, None


def ring_diagnosis(ring_class: Callable[[int, int, int, int], Any],
                   cases: Sequence[RingCase] = RING_CASES) -> Diagnosis:
    """Decode through ring_class in a windowed module; outputs must equal its full forward, memory flat."""
    for case in cases:
        module = ring_module(case)
        rng = np.random.default_rng(100 + case.seed)
        T0 = max(case.lengths)
        N = T0 + sum(case.chunks)
        pos = np.concatenate([compose.padded_positions(np.array(case.lengths), T0),
                              np.array(case.lengths)[:, None] + np.arange(N - T0)], 1)  # (B, N)
        x = rng.normal(size=(case.B, N, case.d_model))
        full = module(x, causal=True, positions=pos)  # (B, N, d_model): the dense window band
        outs, cache, problem = _ring_run(ring_class, case, module, x, pos)
        if problem:
            return Diagnosis("RingCache", False, f"{problem} [case: {case}]")
        s = 0
        for i, out in enumerate(outs):
            t = out.shape[1]
            real = pos[:, s:s + t] >= 0  # (B, t): pads' outputs are never read
            if not np.allclose(out[real], full[:, s:s + t][real], rtol=1e-9, atol=1e-10):
                return Diagnosis("RingCache", False, _ring_differs(ring_class, case, module, x, pos,
                                                                    outs, full, i, s, t))
            s += t
        seen = np.cumsum(_sizes(case))  # tokens fed after each call
        full_at = int(np.argmax(seen >= case.window)) if seen[-1] >= case.window else len(seen) - 1
        held = cache.bytes  # bytes the ring's arrays hold after each call
        if held[-1] > held[full_at]:
            return Diagnosis("RingCache", False,
                             f"the outputs are right, but the cache grows: its arrays held "
                             f"{held[full_at]} bytes after {int(seen[full_at])} tokens (the window "
                             f"is {case.window}) and {held[-1]} bytes after {int(seen[-1])}. A "
                             f"rolling cache keeps only the last `window` keys and values, in "
                             f"window slots: O(window) memory, whatever the length [case: {case}]",
                             bug="grows")
    return Diagnosis("RingCache", True,
                     f"RingCache: decoding through it equals the module's full forward with the "
                     f"window band, on {len(cases)} run(s), and its memory stays at window slots",
                     cases=tuple(str(c) for c in cases))


def _sizes(case: RingCase) -> tuple[int, ...]:
    """The columns of each call: the prefill, then the chunks."""
    return (max(case.lengths),) + case.chunks


def ring_module(case: RingCase):
    """A MultiHeadAttention with the case's n_kv_heads, RoPE and window, and non-zero biases."""
    from mha.modules.numpy_mha import MultiHeadAttention

    m = MultiHeadAttention(case.d_model, case.n_heads, seed=case.seed, n_kv_heads=case.n_kv_heads,
                           rope="half", window=case.window)
    rng = np.random.default_rng(1000 + case.seed)  # zero biases would hide a dropped one
    m.bq, m.bk, m.bv, m.bo = (0.1 * rng.normal(size=b.shape) for b in (m.bq, m.bk, m.bv, m.bo))
    return m


def _ring_differs(ring_class, case: RingCase, module, x, pos, outs, full, i: int, s: int, t: int) -> str:
    """Which call first differs, and the planted ring whose outputs equal the student's so far."""
    where = (f"decoding through your RingCache differs from the module's full forward at call "
             f"{i + 1} ({t} token(s) after {s}; window={case.window})")
    for name, (planted, why) in RING_MISTAKES.items():
        theirs, _, problem = _ring_run(planted, case, module, x, pos)
        if problem or len(theirs) <= i:
            continue
        same = all(np.allclose(a, b, rtol=1e-9, atol=1e-10) for a, b in zip(theirs[:i + 1], outs, strict=False))
        if same:
            return f"{where}: {why} [case: {case}; matches planted mistake '{name}']"
    err = float(np.abs(outs[i] - full[:, s:s + t]).max())
    return (f"{where}, max error {err:.3g}; no known mistake fits. Each query must read the keys "
            f"at positions p - window + 1 .. p (its own included) with their positions [case: {case}]")


def check_ring(ring_class: Callable[[int, int, int, int], Any],
               cases: Sequence[RingCase] = RING_CASES) -> str:
    """`ring_diagnosis(...).check()`: the success line, or AssertionError naming the mistake."""
    __tracebackhide__ = True
    return ring_diagnosis(ring_class, cases).check()


# ---- part 4: what the caches hold ---------------------------------------------------------------
BYTES_CASES: tuple[dict[str, int | None], ...] = (
    dict(n_layers=32, B=4, n_heads=32, n_kv_heads=8, d_k=128, context=8192, itemsize=2, window=None),
    dict(n_layers=2, B=3, n_heads=4, n_kv_heads=2, d_k=8, context=1024, itemsize=4, window=6),
    dict(n_layers=24, B=1, n_heads=16, n_kv_heads=16, d_k=64, context=2048, itemsize=4, window=4096),
    dict(n_layers=1, B=2, n_heads=8, n_kv_heads=1, d_k=32, context=100, itemsize=8, window=None),
    dict(n_layers=80, B=8, n_heads=64, n_kv_heads=8, d_k=128, context=32768, itemsize=2, window=4096),
)
"""Model and batch sizes kv_cache_bytes is checked on (window=None: a plain cache)."""


def reference_bytes(n_layers: int, B: int, n_heads: int, n_kv_heads: int, d_k: int, context: int,
                    itemsize: int, window: int | None = None) -> int:
    """What the caches hold: cache_bytes_formula with slots = context, or min(window, context)."""
    slots = context if window is None else min(window, context)
    return _bytes_formula(n_layers, B, n_kv_heads, slots, d_k, itemsize)


def _slips(c: dict) -> dict[str, tuple[int, str]]:
    """The usual wrong formulas on case c: name -> (value, what it means)."""
    f = reference_bytes
    plain = dict(c, window=None)
    return {
        "query_heads": (f(**dict(c, n_kv_heads=c["n_heads"])),
                        "you counted all n_heads query heads; with grouped-query attention only the "
                        "n_kv_heads key/value heads are cached (n_heads / n_kv_heads queries share each)"),
        "no_k_and_v": (f(**c) // 2, "half the bytes: the cache holds K AND V, two tensors (the factor 2)"),
        "one_layer": (f(**dict(c, n_layers=1)), "that is one layer: every layer has its own cache"),
        "window_ignored": (f(**plain), "a rolling cache keeps `window` slots, not the whole context"),
        "window_over_context": (_bytes_formula(c["n_layers"], c["B"], c["n_kv_heads"],
                                               c["window"] or c["context"], c["d_k"], c["itemsize"]),
                                "the window is longer than the context here: the cache never holds "
                                "more than the context's tokens, slots = min(window, context)"),
        "bits": (8 * f(**c), "8 times too many: itemsize is already in bytes, not bits"),
        "d_model": (f(**c) * c["n_heads"], "you multiplied by d_model = n_heads * d_k; each cached "
                    "head has width d_k"),
    }


def bytes_diagnosis(fn: Callable, cases: Sequence[dict] = BYTES_CASES) -> Diagnosis:
    """Compare fn(n_layers, B, n_heads, n_kv_heads, d_k, context, itemsize, window) with the formula."""
    order = ("n_layers", "B", "n_heads", "n_kv_heads", "d_k", "context", "itemsize", "window")
    for c in cases:
        call = "kv_cache_bytes(" + ", ".join(f"{k}={c[k]}" for k in order) + ")"
        want = reference_bytes(**c)
        got, problem = _run(fn, *(c[k] for k in order))
        if problem:
            return Diagnosis("kv_cache_bytes", False, f"{call} {problem}")
        try:
            value = float(_to_numpy(got))
        except (TypeError, ValueError):
            return Diagnosis("kv_cache_bytes", False, f"{call} must return a number of bytes, got {got!r}")
        if value == want:
            continue
        why = next((msg for val, msg in _slips(c).values() if val != want and value == val),
                   "no usual slip fits: bytes = 2 (K and V) x n_layers x B x n_kv_heads x slots x "
                   "d_k x itemsize, slots = context, or min(window, context)")
        return Diagnosis("kv_cache_bytes", False,
                         f"{call} returned {value:,.0f}, expected {want:,} bytes: {why}")
    return Diagnosis("kv_cache_bytes", True,
                     f"kv_cache_bytes matches 2 x layers x B x n_kv_heads x slots x d_k x itemsize on "
                     f"{len(cases)} model(s)")


def check_cache_bytes(fn: Callable, cases: Sequence[dict] = BYTES_CASES) -> str:
    """`bytes_diagnosis(...).check()`: the success line, or AssertionError naming the slip."""
    __tracebackhide__ = True
    return bytes_diagnosis(fn, cases).check()
