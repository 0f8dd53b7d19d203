"""The on-ramp helpers: soft lookup, one head, heads one by one, running mean, the two named checks.

Values are checked against obvious Python loops (math.exp, float64) and against torch; every
named check is shown catching the bug it names, and its control case is shown firing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha import checks, onramp, steps
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import MultiHeadAttention as TorchMHA
from mha_course import planted
from tests.reference import attention_loops

HUES = [0, 60, 120, 180, 240, 300]  # red, yellow, green, cyan, blue, magenta
VALUES = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])


def _module(rng, d_model=12, n_heads=3) -> MultiHeadAttention:
    """A module with nonzero biases: zero biases would hide a bias sliced wrongly or dropped."""
    m = MultiHeadAttention(d_model, n_heads, seed=5)
    m.bq, m.bk, m.bv, m.bo = (rng.normal(size=d_model) for _ in range(4))
    return m


# ---- on_circle -------------------------------------------------------------------------------
def test_on_circle_against_math():
    pts = onramp.on_circle([0, 90, 210], radius=2.0)
    assert pts.shape == (3, 2) and pts.dtype == np.float64
    for (px, py), deg in zip(pts, [0, 90, 210], strict=True):
        assert math.isclose(px, 2 * math.cos(math.radians(deg)), abs_tol=1e-15)
        assert math.isclose(py, 2 * math.sin(math.radians(deg)), abs_tol=1e-15)


def test_on_circle_rejects_a_2d_list():
    with pytest.raises(ValueError, match=r"degrees must be a 1-D list of angles \(n,\), got shape"):
        onramp.on_circle([[0, 90]])


# ---- the lookup ------------------------------------------------------------------------------
def lookup_loops(query, keys, values, tau):
    """softmax(q . k / tau) @ v written with math.exp over Python lists, one query at a time."""
    qs = np.atleast_2d(query)
    out = []
    for q in qs:
        logits = [sum(float(a) * float(b) for a, b in zip(q, k, strict=True)) / tau for k in keys]
        top = max(logits)
        e = [math.exp(lg - top) for lg in logits]
        w = [x / sum(e) for x in e]
        out.append(sum(wi * vi for wi, vi in zip(w, values, strict=True)))
    out = np.array(out)
    return out if query.ndim == 2 else out[0]


def lookup_torch(query, keys, values, tau):
    """The same with torch.softmax in float64."""
    q, k, v = (torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (query, keys, values))
    return (F.softmax(q @ k.T / tau, dim=-1) @ v).numpy()


@pytest.mark.parametrize("reference", [lookup_loops, lookup_torch], ids=["loops", "torch"])
@pytest.mark.parametrize("q_shape", ["one", "many"])
@pytest.mark.parametrize("v_shape", ["numbers", "vectors"])
@pytest.mark.parametrize("tau", [0.3, 1.0, 7.0])
def test_soft_lookup_matches_references(rng, reference, q_shape, v_shape, tau):
    keys = rng.normal(size=(6, 3))  # (S, d)
    query = rng.normal(size=(3,) if q_shape == "one" else (4, 3))  # (d,) or (T, d)
    values = rng.normal(size=(6,) if v_shape == "numbers" else (6, 2))  # (S,) or (S, d_v)
    got = onramp.soft_lookup(query, keys, values, tau)
    want = reference(query, keys, values, tau)
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_lookup_weights_are_rows_over_the_keys(rng):
    w = onramp.lookup_weights(rng.normal(size=(4, 3)), rng.normal(size=(6, 3)), 0.5)
    assert w.shape == (4, 6)
    checks.check_rows_sum_to_one(w, atol=1e-12)


def test_lookup_keeps_float32(rng):
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((2, 3), (5, 3), (5, 2)))
    assert onramp.lookup_weights(q, k, 2.0).dtype == np.float32
    assert onramp.soft_lookup(q, k, v, 2.0).dtype == np.float32


def test_cold_limit_is_the_exact_lookup_and_hot_limit_the_average():
    keys = onramp.on_circle(HUES)
    crimson = onramp.on_circle([348])[0]  # nearest key: red, 12 degrees away
    exact = onramp.exact_lookup(crimson, keys, VALUES)
    assert exact == 10.0
    assert abs(onramp.soft_lookup(crimson, keys, VALUES, 1e-3) - exact) <= 1e-12
    gaps = [abs(onramp.soft_lookup(crimson, keys, VALUES, tau) - VALUES.mean())
            for tau in (1e4, 1e6)]
    assert gaps[1] <= 1e-5
    # far from both limits the gap to the average shrinks like 1/tau
    assert math.isclose(gaps[0] / gaps[1], 100.0, rel_tol=1e-2), gaps


def test_tied_keys_split_in_the_cold_limit_and_exact_lookup_takes_the_first():
    keys = onramp.on_circle(HUES)
    orange = onramp.on_circle([30])[0]  # exactly between red and yellow
    w = onramp.lookup_weights(orange, keys, 1e-3)
    np.testing.assert_allclose(w, [0.5, 0.5, 0, 0, 0, 0], rtol=0, atol=1e-9)
    assert math.isclose(onramp.soft_lookup(orange, keys, VALUES, 1e-3), 15.0, abs_tol=1e-9)
    many = np.array([[1.0, 0.0], [1.0, 0.0]])  # two equal keys
    assert onramp.exact_lookup(np.array([1.0, 0.0]), many, np.array([7.0, 8.0])) == 7.0


def test_exact_lookup_many_queries_and_vector_values(rng):
    keys = onramp.on_circle(HUES)  # (S, 2)
    queries = onramp.on_circle([5, 175, 290])  # (T, 2): nearest red, cyan, magenta
    values = rng.normal(size=(6, 4))  # (S, d_v)
    np.testing.assert_array_equal(onramp.exact_lookup(queries, keys, values), values[[0, 3, 5]])
    np.testing.assert_array_equal(onramp.exact_lookup(queries, keys, VALUES), [10.0, 40.0, 60.0])


def test_self_attention_without_weights_is_a_soft_lookup_of_x_in_itself(rng):
    x = rng.normal(size=(5, 3))  # (T, d)
    want = steps.softmax(x @ x.T) @ x  # (T, T) @ (T, d)
    np.testing.assert_allclose(onramp.soft_lookup(x, x, x), want, rtol=0, atol=1e-15)


def test_wrong_axis_softmax_in_a_lookup_is_caught_by_rows_sum_to_one(rng):
    scores = rng.normal(size=(3, 6))  # (T, S): 3 queries scored against 6 keys
    bad = planted.softmax_wrong_axis(scores)  # columns sum to 1
    with pytest.raises(AssertionError, match="attention rows must sum to 1"):
        checks.check_rows_sum_to_one(bad)
    checks.check_rows_sum_to_one(steps.softmax(scores))


@pytest.mark.parametrize("tau, err, msg", [
    (0, ValueError, "temperature must be a finite number > 0, got 0"),
    (-1.0, ValueError, "temperature must be a finite number > 0, got -1.0"),
    (math.inf, ValueError, "finite number > 0, got inf"),
    (math.nan, ValueError, "finite number > 0, got nan"),
    ("1", TypeError, "temperature must be a number > 0, got str '1'"),
    (True, TypeError, "got bool True"),
])
def test_temperature_errors(tau, err, msg):
    with pytest.raises(err, match=msg):
        onramp.soft_lookup(np.ones(2), np.ones((3, 2)), np.ones(3), tau)


@pytest.mark.parametrize("q, k, v, err, msg", [
    (np.ones(3), np.ones((4, 2)), np.ones(4), ValueError, r"keys must be \(S, d=3\), got \(4, 2\)"),
    (np.ones((1, 1, 2)), np.ones((4, 2)), np.ones(4), ValueError,
     r"query must be \(d,\) or \(T, d\), got \(1, 1, 2\)"),
    (np.ones(2), np.ones((4, 2)), np.ones(3), ValueError,
     r"values must be \(S=4,\) or \(S=4, d_v\), one row per key, got \(3,\)"),
    (np.ones(2), np.ones((4, 2)), np.arange(4), TypeError, "values must be a floating-point array"),
    (np.arange(2), np.ones((4, 2)), np.ones(4), TypeError, "query must be a floating-point array"),
])
def test_lookup_shape_and_dtype_errors(q, k, v, err, msg):
    with pytest.raises(err, match=msg):
        onramp.soft_lookup(q, k, v)
    with pytest.raises(err, match=msg):
        onramp.exact_lookup(q, k, v)


# ---- one head, heads one by one --------------------------------------------------------------
def single_head_loops(x, Wq, Wk, Wv, bq, bk, bv, causal):
    """One head with explicit loops over batch, query and key, in float64."""
    B, T, _ = x.shape
    q, k, v = x @ Wq + bq, x @ Wk + bk, x @ Wv + bv
    d_k = Wq.shape[1]
    out = np.zeros((B, T, Wv.shape[1]))
    weights = np.zeros((B, T, T))
    for b in range(B):
        for t in range(T):
            keys = range(t + 1) if causal else range(T)
            logits = [float(q[b, t] @ k[b, s]) / math.sqrt(d_k) for s in keys]
            e = [math.exp(lg - max(logits)) for lg in logits]
            for s, es in zip(keys, e, strict=True):
                weights[b, t, s] = es / sum(e)
                out[b, t] += weights[b, t, s] * v[b, s]
    return out, weights


@pytest.mark.parametrize("causal", [False, True])
def test_single_head_matches_loops(rng, causal):
    x = rng.normal(size=(2, 5, 6))  # (B, T, d_model)
    Wq, Wk = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))  # (d_model, d_k)
    Wv = rng.normal(size=(6, 3))  # (d_model, d_v): a value width of its own
    bq, bk, bv = rng.normal(size=4), rng.normal(size=4), rng.normal(size=3)
    out, w = onramp.single_head(x, Wq, Wk, Wv, bq, bk, bv, causal=causal)
    want_out, want_w = single_head_loops(x, Wq, Wk, Wv, bq, bk, bv, causal)
    assert out.shape == (2, 5, 3) and w.shape == (2, 5, 5)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-12)


def test_single_head_biases_default_to_zero(rng):
    x = rng.normal(size=(1, 4, 6))
    W = [rng.normal(size=(6, 2)) for _ in range(3)]
    out, _ = onramp.single_head(x, *W)
    want, _ = single_head_loops(x, *W, 0.0, 0.0, 0.0, causal=False)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("which, shape, msg", [
    ("Wk", (6, 3), r"Wk must be \(d_model=6, d_k=2\), got \(6, 3\)"),
    ("Wq", (5, 2), r"Wq must be \(d_model=6, d_k\), got \(5, 2\)"),
    ("Wv", (6,), r"Wv must be \(d_model=6, d_v\), got \(6,\)"),
])
def test_single_head_shape_errors(rng, which, shape, msg):
    W = {"Wq": np.ones((6, 2)), "Wk": np.ones((6, 2)), "Wv": np.ones((6, 2))}
    W[which] = np.ones(shape)
    with pytest.raises(ValueError, match=msg):
        onramp.single_head(rng.normal(size=(1, 4, 6)), W["Wq"], W["Wk"], W["Wv"])


@pytest.mark.parametrize("d_model, n_heads", [(8, 1), (8, 2), (12, 3), (16, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_heads_one_by_one_equals_the_module_and_the_loop_reference(rng, d_model, n_heads, causal):
    m = _module(rng, d_model, n_heads)
    x = rng.normal(size=(2, 6, d_model))  # (B, T, d_model)
    out, w = onramp.heads_one_by_one(m, x, causal=causal)
    assert out.shape == (2, 6, d_model) and w.shape == (2, n_heads, 6, 6)
    np.testing.assert_allclose(out, m(x, causal=causal), rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, m.attn, rtol=0, atol=1e-12)
    allowed = np.broadcast_to(steps.causal_mask(6), (2, n_heads, 6, 6)) if causal else None
    ref_out, ref_w = attention_loops(m, x, allowed=allowed)  # written without mha.steps
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bug", ["merge_no_transpose", "split_no_transpose"])
def test_the_loop_exposes_a_reshape_bug_in_the_module(rng, bug):
    # heads_one_by_one never splits or merges an array of heads, so it is an independent
    # witness: with the bug planted the module drifts away from it.
    m = _module(rng, 8, 2)
    x = rng.normal(size=(1, 5, 8))
    loop, _ = onramp.heads_one_by_one(m, x)
    buggy = planted.forward_with(m, bug)(x)
    assert np.abs(buggy - loop).max() > 1e-3


def test_heads_one_by_one_rejects_the_wrong_width(rng):
    with pytest.raises(ValueError, match=r"x must be \(B, T, d_model=8\), got \(1, 4, 6\)"):
        onramp.heads_one_by_one(MultiHeadAttention(8, 2), rng.normal(size=(1, 4, 6)))


# ---- running mean ----------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 2, 5, 9])
def test_running_mean_weights_against_loops(T):
    W = onramp.running_mean_weights(T)
    want = np.zeros((T, T))
    for t in range(T):
        for s in range(t + 1):
            want[t, s] = 1.0 / (t + 1)
    np.testing.assert_array_equal(W, want)
    assert W.dtype == np.float64


def test_running_mean_is_softmax_of_equal_scores_under_the_causal_mask(rng):
    T = 7
    W = onramp.running_mean_weights(T)
    np.testing.assert_array_equal(W, steps.masked_softmax(np.zeros((T, T)), steps.causal_mask(T)))
    x = rng.normal(size=(T, 3))  # (T, d)
    np.testing.assert_allclose(W @ x, np.cumsum(x, axis=0) / np.arange(1, T + 1)[:, None],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("T, err", [(0, ValueError), (2.0, TypeError)])
def test_running_mean_weights_rejects_bad_T(T, err):
    with pytest.raises(err, match="T must be"):
        onramp.running_mean_weights(T)


def test_check_running_mean_passes():
    assert "running mean: row t spreads 1/(t+1)" in onramp.check_running_mean(
        onramp.running_mean_weights(6))
    onramp.check_running_mean(onramp.running_mean_weights(4).astype(np.float32), atol=1e-7)


T_BUG = 6
ZEROS = np.zeros((T_BUG, T_BUG))  # (T, S): equal scores
PLANTED = {  # what each mistake makes of the running-mean weights, built with mha_course.planted
    "no mask": (lambda: steps.softmax(ZEROS), "the causal mask is missing"),
    "after softmax": (lambda: planted.mask_after_softmax(ZEROS, steps.causal_mask(T_BUG)),
                      "the mask was applied after the softmax"),
    "triu": (lambda: steps.masked_softmax(ZEROS, planted.anti_causal_mask(T_BUG)),
             r"the triangle is flipped \(np.triu\)"),
    "no diagonal": (lambda: steps.masked_softmax(ZEROS, planted.mask_without_diagonal(T_BUG)),
                    "the diagonal is masked"),
    "one ahead": (lambda: steps.masked_softmax(ZEROS, planted.mask_one_ahead(T_BUG)),
                  r"the mask is off by one \(s <= t \+ 1\)"),
    "wrong axis": (lambda: planted.softmax_wrong_axis(steps.apply_mask(ZEROS,
                                                                       steps.causal_mask(T_BUG))),
                   "the softmax ran over the wrong axis"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_check_running_mean_names_each_planted_mistake(name):
    make, msg = PLANTED[name]
    with pytest.raises(AssertionError, match="not a running mean .*" + msg):
        onramp.check_running_mean(make())


def test_check_running_mean_points_at_the_worst_row_when_no_mistake_matches():
    W = onramp.running_mean_weights(4)
    W[2] = [0.5, 0.25, 0.25, 0.0]
    with pytest.raises(AssertionError, match=r"row 2 should be 1/3 on keys 0..2 and 0 after, got"):
        onramp.check_running_mean(W)


def test_check_running_mean_fails_on_nan_and_rejects_a_non_square_matrix():
    W = onramp.running_mean_weights(3)
    W[1, 0] = np.nan
    with pytest.raises(AssertionError, match="max deviation inf"):
        onramp.check_running_mean(W)
    with pytest.raises(ValueError, match=r"weights must be \(T, S=3\), got \(3, 4\)"):
        onramp.check_running_mean(np.zeros((3, 4)))


# ---- permutation equivariance ----------------------------------------------------------------
def _forward(impl: str, m: MultiHeadAttention, **kw):
    """x (B, T, d_model) numpy -> numpy output, through the numpy module or its torch twin."""
    if impl == "numpy":
        return lambda a: m(a, **kw)
    tm = TorchMHA.from_numpy(m, use_sdpa=impl == "sdpa")
    return lambda a: tm(torch.from_numpy(a), **kw).detach().numpy()


@pytest.mark.parametrize("impl", ["numpy", "sdpa", "manual"])
def test_attention_without_mask_is_permutation_equivariant(rng, impl):
    m = _module(rng, 8, 2)
    x = rng.normal(size=(2, 6, 8))
    msg = onramp.check_permutation_equivariance(_forward(impl, m), x, perm=[3, 0, 5, 1, 4, 2])
    assert "permutation-equivariant" in msg and "[3, 0, 5, 1, 4, 2]" in msg


@pytest.mark.parametrize("impl", ["numpy", "sdpa", "manual"])
def test_the_causal_mask_breaks_equivariance(rng, impl):
    m = _module(rng, 8, 2)
    x = rng.normal(size=(2, 6, 8))
    with pytest.raises(AssertionError, match="not permutation-equivariant.*causal"):
        onramp.check_permutation_equivariance(_forward(impl, m, causal=True), x)


def test_equivariance_holds_for_the_helpers(rng):
    m = _module(rng, 8, 2)
    x = rng.normal(size=(1, 5, 8))
    onramp.check_permutation_equivariance(lambda a: onramp.heads_one_by_one(m, a)[0], x)
    onramp.check_permutation_equivariance(lambda a: onramp.soft_lookup(a[0], a[0], a[0])[None], x)


def test_positions_added_to_the_tokens_break_equivariance(rng):
    m = _module(rng, 8, 2)
    x = rng.normal(size=(1, 5, 8))
    pos = rng.normal(size=(5, 8))  # one learned-style vector per position

    with pytest.raises(AssertionError, match="not permutation-equivariant"):
        onramp.check_permutation_equivariance(lambda a: m(a + pos), x)


@pytest.mark.parametrize("bug", ["merge_no_transpose", "split_no_transpose"])
def test_a_token_mixing_reshape_breaks_equivariance(rng, bug):
    m = _module(rng, 8, 2)
    x = rng.normal(size=(1, 6, 8))
    with pytest.raises(AssertionError, match="not permutation-equivariant"):
        onramp.check_permutation_equivariance(planted.forward_with(m, bug), x)


@pytest.mark.parametrize("forward", [
    lambda a: np.zeros_like(a),  # ignores its input
    lambda a: np.broadcast_to(a.mean(axis=1, keepdims=True), a.shape),  # one output for all
], ids=["constant", "pooled"])
def test_permutation_control_case_fires(rng, forward):
    with pytest.raises(AssertionError, match="control case failed"):
        onramp.check_permutation_equivariance(forward, rng.normal(size=(1, 4, 3)))


def test_permutation_default_is_seeded_and_moves_something(rng):
    x = rng.normal(size=(1, 2, 3))
    for seed in range(6):  # with T = 2 half the shuffles are the identity; none may be used
        msg = onramp.check_permutation_equivariance(lambda a: a * 2.0, x, seed=seed)
        assert "[1, 0]" in msg


@pytest.mark.parametrize("perm, msg", [
    ([0, 1, 1], r"perm must be an order of the T=3 positions 0..2, each once, got \[0, 1, 1\]"),
    ([0, 1], "perm must be an order of the T=3"),
])
def test_permutation_input_errors(rng, perm, msg):
    x = rng.normal(size=(1, 3, 2))
    with pytest.raises(ValueError, match=msg):
        onramp.check_permutation_equivariance(lambda a: a, x, perm=perm)
    with pytest.raises(ValueError, match="T >= 2 tokens"):
        onramp.check_permutation_equivariance(lambda a: a, x[:, :1])
