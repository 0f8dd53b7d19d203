"""mha_course.diagnose.generation names each usual generation mistake, calls correct code correct, and
names nothing it can't tell.

Contracts:
  * correct code in several styles passes every check (lists or arrays, positions given or taken
    from the cache, keys returned in any order, a float number of bytes);
  * each mistake A6's hidden tests name is named, by value: the positions of a left-padded batch
    (through checks.check_padded_positions), greedy decoding (the recorded calls of the model),
    the rolling cache (its planted rings, its memory) and the bytes of a GQA cache;
  * student code that raises, returns None or the wrong shape is reported, not raised;
  * the verdicts do not lean on module state: a grader's refusing(generate, ...) cannot break them.
"""

from __future__ import annotations

import numpy as np
import pytest

from mha.inference import generate
from mha_course import diagnose
from mha_course.diagnose import generation as dg


# ---- part 1: positions -----------------------------------------------------------------------
def positions_vectorised(lengths, T):
    pos = np.arange(T)[None, :] - (T - np.asarray(lengths)[:, None])  # (B, T)
    return np.where(pos >= 0, pos, -1)


def positions_lists(lengths, T):
    return [[-1] * (T - int(L)) + list(range(int(L))) for L in lengths]


@pytest.mark.parametrize("fn", [positions_vectorised, positions_lists])
@pytest.mark.parametrize("as_array", [False, True])
def test_correct_positions_pass(fn, as_array):
    assert dg.positions_diagnosis(fn, as_array=as_array).ok


@pytest.mark.parametrize("wrong, words", [
    (lambda ls, T: np.where(np.arange(T) < np.asarray(ls)[:, None], np.arange(T), -1),
     "the pads are on the right"),
    (lambda ls, T: np.maximum(positions_vectorised(ls, T), 0), "the pads are at position 0"),
    (lambda ls, T: np.where(positions_vectorised(ls, T) >= 0, positions_vectorised(ls, T) + 1, -1),
     "off by one"),
    (lambda ls, T: np.where(positions_vectorised(ls, T) >= 0, np.arange(T), -1),
     "count from the first column"),
    (lambda ls, T: np.tile(np.arange(T), (len(ls), 1)), "every row is 0..T-1"),
    (lambda ls, T: None, "returned None"),
    (lambda ls, T: positions_vectorised(ls, T) + 0.5, "whole numbers"),
    (lambda ls, T: positions_vectorised(ls, T)[:, 1:], "must be (B=3, T=5)"),
])
def test_each_positions_mistake_is_named(wrong, words):
    d = dg.positions_diagnosis(wrong)
    assert not d.ok and words in d.message, d.message
    assert "[2, 5, 3], T=5" in d.message  # the first case tells every mistake apart


def test_positions_that_raise_are_reported():
    def unwritten(lengths, T):
        raise NotImplementedError()

    assert "not written yet" in dg.positions_diagnosis(unwritten).message
    assert "raised ZeroDivisionError" in dg.positions_diagnosis(lambda ls, T: 1 / 0).message


# ---- part 2: greedy decoding -----------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return dg.tiny_model()


@pytest.fixture(scope="module")
def batch():
    return generate.left_pad([[5, 9, 2, 7, 1], [3, 8, 4], [6, 1, 2, 9, 4, 7, 3]])


def greedy(model, tokens, positions, n_new, next_pos=lambda step, T, i: step + 1, axis=-1,
           column=-1, step_positions=True, max_len=None):
    """The model solution, with one knob per usual mistake."""
    B, T = tokens.shape
    caches = model.new_caches(B, max_len or T + n_new)
    logits = model(tokens, positions, caches)
    step, new = positions[:, -1:], []
    for i in range(n_new):
        nxt = np.argmax(logits[:, column], axis=axis)
        new.append(nxt)
        if i + 1 < n_new:
            step = next_pos(step, T, i)
            logits = model(nxt[:, None], step if step_positions else None, caches)
    return np.stack(new, axis=1)


def recompute(model, tokens, positions, n_new, caches_for_prefill=False):
    """The right tokens without the cache: the whole sequence at every step."""
    new = []
    if caches_for_prefill:
        model(tokens, positions, model.new_caches(*tokens.shape))
    for _ in range(n_new):
        nxt = model(tokens, positions)[:, -1].argmax(-1)
        new.append(nxt)
        tokens = np.concatenate([tokens, nxt[:, None]], 1)
        positions = np.concatenate([positions, positions[:, -1:] + 1], 1)
    return np.stack(new, 1)


def refeed(model, tokens, positions, n_new, fresh=False):
    """The whole sequence into the cache at every step (or into fresh caches each time)."""
    caches, new = model.new_caches(tokens.shape[0], 100), []
    for _ in range(n_new):
        if fresh:
            caches = model.new_caches(tokens.shape[0], 100)
        nxt = model(tokens, positions, caches)[:, -1].argmax(-1)
        new.append(nxt)
        tokens = np.concatenate([tokens, nxt[:, None]], 1)
        positions = np.concatenate([positions, positions[:, -1:] + 1], 1)
    return np.stack(new, 1)


def feed_last_prompt_token(model, tokens, positions, n_new):
    caches = model.new_caches(tokens.shape[0], 100)
    logits, step, new = model(tokens, positions, caches), positions[:, -1:], []
    for _ in range(n_new):
        new.append(logits[:, -1].argmax(-1))
        step = step + 1
        logits = model(tokens[:, -1:], step, caches)  # not the token just chosen
    return np.stack(new, 1)


@pytest.mark.parametrize("fn", [
    greedy,
    lambda m, t, p, n: greedy(m, t, p, n, step_positions=False),  # the cache knows each next position
    lambda m, t, p, n: greedy(m, t, p, n, max_len=64),  # room to spare
    lambda m, t, p, n: greedy(m, t, p, n).astype(np.float64),  # whole numbers as floats
])
@pytest.mark.parametrize("n_new", [1, 6])
def test_correct_generation_passes(fn, n_new, model, batch):
    d = dg.generation_diagnosis(fn, model, *batch, n_new)
    assert d.ok, d.message


@pytest.mark.parametrize("fn, words", [
    (lambda m, t, p, n: greedy(m, t, p, n, next_pos=lambda s, T, i: 0 * s),
     "the new token's position restarted at 0"),
    (lambda m, t, p, n: greedy(m, t, p, n, next_pos=lambda s, T, i: s),
     "off by one: the new token took the position of the token before it"),
    (lambda m, t, p, n: greedy(m, t, p, n, next_pos=lambda s, T, i: s + 2),
     "one position too far"),
    (lambda m, t, p, n: greedy(m, t, p, n, next_pos=lambda s, T, i: np.full_like(s, T + i)),
     "the positions count the columns (the padded width T)"),
    (lambda m, t, p, n: greedy(m, t, None, n), "the prefill used positions 0..T-1 (or none)"),
    (lambda m, t, p, n: greedy(m, t, p, n, axis=0), "the argmax ran over the batch axis"),
    (lambda m, t, p, n: greedy(m, t, p, n, column=0), "take the argmax of the LAST column's logits"),
    (lambda m, t, p, n: greedy(m, t, p, n).T, "stack the steps along axis 1"),
    (lambda m, t, p, n: np.concatenate([t, greedy(m, t, p, n)], 1), "return only the n_new new tokens"),
    (lambda m, t, p, n: greedy(m, t, p, n, max_len=t.shape[1]), "cache holds at most"),
    (recompute, "the tokens are right, but never used the cache"),
    (lambda m, t, p, n: recompute(m, t, p, n, caches_for_prefill=True), "the steps never used the cache"),
    (refeed, "the whole sequence went into the cache again (duplicate keys)"),
    (lambda m, t, p, n: refeed(m, t, p, n, fresh=True), "the calls used different caches"),
    (feed_last_prompt_token, "feed each step the token just chosen"),
    (lambda m, t, p, n: np.zeros((3, n), dtype=int), "never called the model it was given"),
    (lambda m, t, p, n: None, "returned None"),
])
def test_each_generation_mistake_is_named(fn, words, model, batch):
    d = dg.generation_diagnosis(fn, model, *batch, 6)
    assert not d.ok and words in d.message, d.message


def test_unwritten_generation_is_reported(model, batch):
    def unwritten(model, tokens, positions, n_new):
        raise NotImplementedError()

    d = dg.generation_diagnosis(unwritten, model, *batch, 3)
    assert not d.ok and "not written yet" in d.message


def test_generation_verdicts_survive_a_refused_reference(model, batch):
    """A grader may refuse generate.generate to the student: the diagnosis's own copy still runs."""
    with diagnose.refusing(generate, ("generate", "cache_bytes_formula")):
        assert dg.generation_diagnosis(greedy, model, *batch, 4).ok
        assert dg.bytes_diagnosis(dg.reference_bytes).ok


def test_the_recorder_is_the_model_to_its_caller(model, batch):
    rec = dg.Recorder(model)
    assert rec.vocab == model.vocab
    assert all(a is b for a, b in zip(rec.attention_layers, model.attention_layers, strict=True))
    caches = rec.new_caches(3, 9)
    np.testing.assert_array_equal(rec(batch[0], batch[1], caches),
                                  model(batch[0], batch[1], model.new_caches(3, 9)))
    (call,) = rec.calls
    np.testing.assert_array_equal(call.positions, batch[1])
    assert call.caches == tuple(id(c) for c in caches) and rec.made[0][:2] == (3, 9)


# ---- part 3: the rolling cache ---------------------------------------------------------------
class ChronologicalRing:
    """Another correct style: only the last window keys, oldest first, grown lazily."""

    def __init__(self, B, n_heads, window, d_k):
        self.window, self.K = window, None

    def update(self, k, v, positions):
        if self.K is None:
            K, V, P = k, v, positions
        else:
            K, V = np.concatenate([self.K, k], 2), np.concatenate([self.V, v], 2)
            P = np.concatenate([self.P, positions], 1)
        w = self.window
        self.K, self.V, self.P = K[:, :, -w:].copy(), V[:, :, -w:].copy(), P[:, -w:].copy()
        return K, V, P


class ReversedRing(dg._GoodRing):
    def update(self, k, v, positions):
        K, V, P = super().update(k, v, positions)
        return K[:, :, ::-1], V[:, :, ::-1], P[:, ::-1]


class GrowingRing(dg._GoodRing):
    def update(self, k, v, positions):
        self.K, self.V, self.pos = self._read(k, v, positions)
        return self.K, self.V, self.pos


class UnwrappedRing(dg._GoodRing):
    def update(self, k, v, positions):
        out = self._read(k, v, positions)
        t = k.shape[2]
        self._write(k, v, positions, 0, self.seen + np.arange(t))  # no % window
        self.seen += t
        return out


@pytest.mark.parametrize("ring", [dg._GoodRing, ChronologicalRing, ReversedRing])
def test_correct_rings_pass(ring):
    d = dg.ring_diagnosis(ring)
    assert d.ok, d.message


@pytest.mark.parametrize("name", sorted(dg.RING_MISTAKES))
def test_each_planted_ring_is_named(name):
    ring, _ = dg.RING_MISTAKES[name]
    d = dg.ring_diagnosis(ring)
    assert not d.ok and f"matches planted mistake '{name}'" in d.message, d.message


@pytest.mark.parametrize("ring, words", [
    (GrowingRing, "the cache grows"),
    (UnwrappedRing, "wrap it, slot = (tokens seen) % window"),
])
def test_ring_memory_and_index_mistakes_are_named(ring, words):
    d = dg.ring_diagnosis(ring)
    assert not d.ok and words in d.message, d.message


@pytest.mark.parametrize("update, words", [
    (lambda self, k, v, p: None, "returned None"),
    (lambda self, k, v, p: (k, v), "must return three things"),
    (lambda self, k, v, p: (k[0], v[0], p), "it must be (B=2, n_heads=2, S, d_k=4)"),
    (lambda self, k, v, p: (k, v, p[:, :1]), "key_positions must be (B=2, S=5)"),
])
def test_rings_returning_the_wrong_thing_are_reported(update, words):
    ring = type("Bad", (dg._GoodRing,), {"update": update})
    d = dg.ring_diagnosis(ring)
    assert not d.ok and words in d.message, d.message


def test_an_unwritten_ring_is_reported():
    class Unwritten:
        def __init__(self, B, n_heads, window, d_k):
            raise NotImplementedError()

    assert "not written yet" in dg.ring_diagnosis(Unwritten).message


def test_held_bytes_counts_arrays_in_attributes_and_containers():
    class Holder:
        def __init__(self):
            self.a = np.zeros(10)  # 80 bytes
            self.items = [np.zeros(2, np.int32), {"b": np.zeros(3)}]  # 8 + 24
            self.same = self.a  # counted once
            self.name = "not an array"

    assert dg.held_bytes(Holder()) == 80 + 8 + 24


# ---- part 4: the bytes of the caches ---------------------------------------------------------
def test_the_formula_matches_what_models_allocate():
    from mha.training import train

    for h_kv, window in [(4, None), (2, None), (1, 6), (2, 2000)]:
        m = train.TinyTransformer(vocab=16, T=24, d_model=32, n_heads=4, n_layers=2, causal=True,
                                  n_kv_heads=h_kv, rope="half", window=window)
        max_len = 1024 if window is None or window <= 1024 else window  # a ring needs max_len >= window
        want = generate.cache_bytes(m, 3, max_len)
        assert dg.reference_bytes(2, 3, 4, h_kv, 8, max_len, 4, window) == want


@pytest.mark.parametrize("slip", ["query_heads", "no_k_and_v", "one_layer", "window_ignored",
                                  "window_over_context", "bits", "d_model"])
def test_each_bytes_slip_is_named(slip):
    def wrong(n_layers, B, n_heads, n_kv_heads, d_k, context, itemsize, window=None):
        c = dict(n_layers=n_layers, B=B, n_heads=n_heads, n_kv_heads=n_kv_heads, d_k=d_k,
                 context=context, itemsize=itemsize, window=window)
        value, _ = dg._slips(c)[slip]
        return value

    d = dg.bytes_diagnosis(wrong)
    _, words = dg._slips(dict(dg.BYTES_CASES[2], window=4096))[slip]
    assert not d.ok and words in d.message, d.message


def test_bytes_by_value_not_type():
    assert dg.bytes_diagnosis(lambda *a: float(dg.reference_bytes(*a))).ok
    assert dg.bytes_diagnosis(lambda *a: np.int64(dg.reference_bytes(*a))).ok
    assert "must return a number" in dg.bytes_diagnosis(lambda *a: "lots").message
    assert "no usual slip fits" in dg.bytes_diagnosis(lambda *a: 1).message

