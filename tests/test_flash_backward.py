"""FlashAttention-2's backward (mha.attention.flash.flash_attention_backward) against mha.training.grad and torch autograd."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import steps
from mha.attention import flash, masking
from mha.perf import bench
from mha.training import grad
from tests.test_flash import EDGE, causal_edges, edge_case, planted


def _case(seed, B, h, T, S, d_k, d_v, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(B, h, T, d_k)), rng.normal(size=(B, h, S, d_k))
    v, dout = rng.normal(size=(B, h, S, d_v)), rng.normal(size=(B, h, T, d_v))
    return [a.astype(dtype) for a in (q, k, v, dout)]


def _allowed(T, S, causal, offset, mask):
    """The boolean mask of the forward, (.., T, S), or None."""
    allowed = steps.causal_mask(T, S, offset=offset) if causal else None
    if mask is not None:
        allowed = mask if allowed is None else allowed & mask
    return allowed


def _autograd(q, k, v, dout, allowed):
    """dq, dk, dv by torch autograd through softmax attention in float64 (masked rows give 0)."""
    leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v)]
    scores = leaves[0] @ leaves[1].transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, h, T, S)
    if allowed is not None:
        scores = scores.masked_fill(~torch.as_tensor(allowed), float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)  # no key: weight 0
    return [g.numpy() for g in torch.autograd.grad(weights @ leaves[2], leaves, torch.tensor(dout))]


def _max_err(got, want):
    return max(float(np.abs(g - w).max(initial=0.0)) for g, w in zip(got, want, strict=True))


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 23), S=st.integers(1, 23), bq=st.integers(1, 9), bk=st.integers(1, 9),
       d_k=st.integers(1, 6), d_v=st.integers(1, 6), causal=st.booleans(),
       offset=st.integers(-4, 4), masked=st.booleans(), seed=st.integers(0, 2**16))
def test_equals_torch_autograd_for_any_shapes_blocks_and_masks(T, S, bq, bk, d_k, d_v, causal,
                                                               offset, masked, seed):
    q, k, v, dout = _case(seed, 2, 2, T, S, d_k, d_v)
    mask = np.random.default_rng(seed + 1).random((2, 1, T, S)) > 0.3 if masked else None
    offset = offset if causal else 0
    out, lse = flash.flash_attention(q, k, v, causal, mask, bq, bk, offset)
    got = flash.flash_attention_backward(q, k, v, out, lse, dout, causal, mask, bq, bk, offset)
    err = _max_err(got, _autograd(q, k, v, dout, _allowed(T, S, causal, offset, mask)))
    assert err < 1e-12, f"T={T} S={S} blocks {bq}x{bk} causal={causal} offset={offset}: {err:.3g}"


@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (True, True)])
def test_equals_the_step_backwards_of_mha_grad(causal, masked):
    q, k, v, dout = _case(3, 2, 3, 17, 13, 8, 8)
    mask = np.random.default_rng(4).random((17, 13)) > 0.2 if masked else None
    allowed = _allowed(17, 13, causal, 0, mask)
    scores = steps.scaled_scores(q, k)  # (B, h, T, S)
    if allowed is not None:
        scores = steps.apply_mask(scores, allowed)
    weights = steps.softmax(scores)  # (B, h, T, S): what the naive backward keeps
    want = grad.core_backward(dout, q, k, v, weights, allowed)
    out, lse = flash.flash_attention(q, k, v, causal, mask, block_q=4, block_k=5)
    got = flash.flash_attention_backward(q, k, v, out, lse, dout, causal, mask, block_q=4, block_k=5)
    assert _max_err(got, want) < 1e-12


def test_float32_stays_within_the_error_of_the_float32_steps():
    q, k, v, dout = _case(5, 1, 2, 64, 64, 16, 16, np.float32)
    golden = _autograd(q, k, v, dout, steps.causal_mask(64, 64))  # float64
    allowed = steps.causal_mask(64, 64)
    weights = steps.softmax(steps.apply_mask(steps.scaled_scores(q, k), allowed))  # float32
    naive = grad.core_backward(dout, q, k, v, weights, allowed)
    out, lse = flash.flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    got = flash.flash_attention_backward(q, k, v, out, lse, dout, causal=True, block_q=16, block_k=16)
    for name, g, n, w in zip("qkv", got, naive, golden, strict=True):
        assert g.dtype == np.float32, f"d{name}: expected float32, got {g.dtype}"
        ref_err = float(np.abs(n.astype(np.float64) - w).max())  # the naive float32 backward's error
        err = float(np.abs(g.astype(np.float64) - w).max())
        assert err <= 4 * ref_err + 1e-6, f"d{name}: tiled error {err:.3g} vs naive {ref_err:.3g}"


def test_the_planted_mistakes_are_caught():
    """A backward that reuses a stale logsumexp, or forms delta without O, is far off."""
    q, k, v, dout = _case(6, 1, 2, 12, 12, 4, 4)
    want = _autograd(q, k, v, dout, steps.causal_mask(12, 12))
    out, lse = flash.flash_attention(q, k, v, causal=True, block_q=4, block_k=4)
    for name, o, ls in (("lse off by one", out, lse + 1.0), ("delta without O", np.ones_like(out), lse)):
        bad = flash.flash_attention_backward(q, k, v, o, ls, dout, causal=True, block_q=4, block_k=4)
        assert _max_err(bad, want) > 1e-2, f"the check could not tell: {name}"


def test_memory_the_tiled_backward_keeps_o_and_lse_not_the_weights():
    """tracemalloc: the naive backward needs (B, h, T, S) arrays, the tiled one a few tiles."""
    B, h, T, d = 1, 2, 512, 16
    q, k, v, dout = _case(7, B, h, T, T, d, d)
    allowed = steps.causal_mask(T, T)
    weights = steps.softmax(steps.apply_mask(steps.scaled_scores(q, k), allowed))
    out, lse = flash.flash_attention(q, k, v, causal=True, block_q=64, block_k=64)
    kept_naive, kept_tiled = weights.nbytes, out.nbytes + lse.nbytes
    assert kept_naive == B * h * T * T * 8 and kept_tiled == B * h * T * (d + 1) * 8  # formulas
    naive = bench.numpy_peak_bytes(lambda: grad.core_backward(dout, q, k, v, weights, allowed))
    tiled = bench.numpy_peak_bytes(lambda: flash.flash_attention_backward(
        q, k, v, out, lse, dout, causal=True, block_q=64, block_k=64))
    grads = 3 * B * h * T * d * 8  # dq, dk, dv themselves
    tile = B * h * 64 * 64 * 8  # one (g, bq, bk) float64 tile
    assert naive >= 2 * kept_naive, f"naive peak {naive} below two (T, S) arrays"
    assert tiled <= grads + 8 * tile + B * h * T * 8 * 2, f"tiled peak {tiled} holds more than tiles"
    assert tiled < naive / 4


@pytest.mark.parametrize("kwargs,match", [
    (dict(lse=np.zeros((1, 2, 5))), r"lse must have shape \(1, 2, 4\)"),
    (dict(dout=np.zeros((1, 2, 4, 3))), r"dout must have shape \(1, 2, 4, 4\)"),
    (dict(out=np.zeros((1, 2, 4), dtype=np.int64)), "out"),
])
def test_bad_input_names_what_was_expected(kwargs, match):
    q, k, v, dout = _case(8, 1, 2, 4, 6, 4, 4)
    out, lse = flash.flash_attention(q, k, v)
    args = dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        flash.flash_attention_backward(**args)


# ---- float16: delta, P and the gradient sums in float32, each gradient rounded once -------------
@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 40), S=st.integers(1, 200), bq=st.integers(1, 48), bk=st.integers(1, 64),
       size=st.sampled_from([1.0, 4.0, 30.0]), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_float16_gradients_within_one_rounding_of_the_exact_ones(T, S, bq, bk, size, causal, seed):
    """Each of dq, dk, dv within one float16 rounding of the exact (float64) gradient, plus the
    float32 work's error: scores off by (d_k + 4) 2^-24 of |q||k|, delta read from the float16 out,
    and float32's sums (twice float32 autograd's whole error).

    Kept in float16, delta, the tile sums and the scores (size 30: q.k / 8 past 65504) lose that.
    """
    q, k, v, dout = _case(seed, 1, 2, T, S, 64, 64, np.float16)
    q, k = (size * q.astype(np.float32)).astype(np.float16), (size * k.astype(np.float32)).astype(np.float16)
    allowed = steps.causal_mask(T, S) if causal else None
    with np.errstate(over="raise", invalid="raise"):
        out, lse = flash.flash_attention(q, k, v, causal, block_q=bq, block_k=bk)
        got = flash.flash_attention_backward(q, k, v, out, lse, dout, causal, block_q=bq, block_k=bk)
    exact = _autograd(q, k, v, dout, allowed)  # float64, from the float16 inputs (exact there)
    fp32 = _autograd32(q, k, v, dout, allowed)  # float32's own summation error, for scale
    q64, k64, v64, d64 = (a.astype(np.float64) for a in (q, k, v, dout))
    ok = allowed if allowed is not None else np.ones((T, S), dtype=bool)
    scores = np.where(ok, q64 @ k64.swapaxes(-1, -2) / 8.0, -np.inf)  # (B, h, T, S), exact
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)  # (B, h, T, S): the exact weights
    # a float32 score is off by at most (d_k + 4) 2^-24 of its |q||k| sum, lse by its row's largest:
    # each weight by w times twice that (first order)
    reach = np.where(ok, np.abs(q64) @ np.abs(k64).swapaxes(-1, -2) / 8.0, 0.0).max(-1)  # (B, h, T)
    dw = w * (2 * (64 + 4) * 2.0**-24 * reach)[..., None]  # (B, h, T, S)
    # delta = rowsum(dout * out) reads the float16 out, as FA-2 does: 2^-11 |dout| |out| per row
    slip = 2.0**-11 * (np.abs(d64) * np.abs(out.astype(np.float64))).sum(-1)  # (B, h, T)
    dp = d64 @ v64.swapaxes(-1, -2)  # (B, h, T, S)
    delta = (d64 * (w @ v64)).sum(-1)  # (B, h, T)
    ds_err = (dw * np.abs(dp - delta[..., None]) + w * slip[..., None]) / 8.0  # (B, h, T, S)
    from_work = (ds_err @ np.abs(k64),  # dq (B, h, T, 64)
                 ds_err.swapaxes(-1, -2) @ np.abs(q64),  # dk (B, h, S, 64)
                 dw.swapaxes(-1, -2) @ np.abs(d64))  # dv (B, h, S, 64)
    for name, g, ex, ex32, fw in zip(("dq", "dk", "dv"), got, exact, fp32, from_work, strict=True):
        work = fw + 2 * float(np.abs(ex32 - ex).max()) + 2.0**-24  # + float32's sums
        bound = 2.0**-11 * (np.abs(ex) + work) + work
        ratio = float((np.abs(g.astype(np.float64) - ex) / bound).max(initial=0.0))
        assert ratio <= 1, f"{name}: {ratio:.2f} x one float16 rounding plus float32's error"
        assert g.dtype == np.float16, f"{name}: expected float16, got {g.dtype}"


def _autograd32(q, k, v, dout, allowed):
    """The same gradients by torch autograd in float32 (the float32 work's own error)."""
    leaves = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (q, k, v)]
    scores = leaves[0] @ leaves[1].transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, h, T, S)
    if allowed is not None:
        scores = scores.masked_fill(~torch.as_tensor(allowed), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ leaves[2]
    grads = torch.autograd.grad(out, leaves, torch.tensor(dout, dtype=torch.float32))
    return [g.double().numpy() for g in grads]


# ---- the backward's causal skip at its edge -------------------------------------------------
def _backward_edge_error(T, S, offset, bq, bk, dead, seed=0):
    """Max error of the tiled backward (unseen keys NaN) against autograd (clean keys); inf for NaN."""
    q, k, v, k_nan, v_nan = edge_case(T, S, offset, dead, seed)
    dout = np.random.default_rng(seed + 1).normal(size=(2, 2, T, 4))  # (B, h, T, d_v)
    out, lse = flash.flash_attention(q, k, v, causal=True, block_q=bq, block_k=bk, offset=offset)
    got = flash.flash_attention_backward(q, k_nan, v_nan, out, lse, dout, causal=True, block_q=bq,
                                         block_k=bk, offset=offset)
    if not all(np.isfinite(g).all() for g in got):
        return math.inf  # a key no query may see was read
    return _max_err(got, _autograd(q, k, v, dout, steps.causal_mask(T, S, offset=offset)))


@settings(max_examples=80, deadline=None)
@given(case=causal_edges(), seed=st.integers(0, 2**16))
@pytest.mark.filterwarnings("ignore:invalid value")  # NaN keys, read only by a wrong skip
def test_the_backward_tile_skip_at_its_edge(case, seed):
    """Key blocks outside: the first query block computed is the one holding query s0 - offset."""
    T, S, offset, bq, bk, dead = case
    assert any(j * bk - offset == min((i + 1) * bq, T) - 1  # key block j's first key: query i's last
               for i in range(-(-T // bq)) for j in range(-(-S // bk))), "the draw reaches the edge"
    assert _backward_edge_error(T, S, offset, bq, bk, dead, seed) < 1e-12


BACKWARD_SKIP = "none = none | (k_lo > q_hi)"  # MaskSpec._position_tiles: the rule both loops follow
BACKWARD_OFF_BY_ONE = {
    "drops the query block whose last query sees s0": BACKWARD_SKIP.replace(">", ">="),
    "reads a query block that sees none of the keys": BACKWARD_SKIP.replace("q_hi", "q_hi + 1"),
}


@pytest.mark.parametrize("wrong", list(BACKWARD_OFF_BY_ONE))
@pytest.mark.filterwarnings("ignore:invalid value")
def test_the_edge_check_catches_a_backward_skip_off_by_one(wrong, monkeypatch):
    assert _backward_edge_error(*EDGE) < 1e-12
    right = masking.MaskSpec._position_tiles
    bad = planted(right, BACKWARD_SKIP, BACKWARD_OFF_BY_ONE[wrong], masking)
    backward = flash.flash_attention_backward

    def backward_on_the_bad_schedule(*args, **kwargs):  # the forward keeps the right one
        monkeypatch.setattr(masking.MaskSpec, "_position_tiles", bad)
        try:
            return backward(*args, **kwargs)
        finally:
            monkeypatch.setattr(masking.MaskSpec, "_position_tiles", right)

    monkeypatch.setattr(flash, "flash_attention_backward", backward_on_the_bad_schedule)
    assert _backward_edge_error(*EDGE) > 1e-3, f"the edge case could not tell: {wrong}"


@settings(max_examples=40, deadline=None)
@given(h_kv=st.integers(1, 3), g=st.integers(1, 3), T=st.integers(1, 12), S=st.integers(1, 14),
       bq=st.integers(1, 6), bk=st.integers(1, 6), window=st.one_of(st.none(), st.integers(1, 5)),
       biased=st.booleans(), seed=st.integers(0, 2**16))
def test_gqa_bias_and_window_gradients_equal_torch_autograd(h_kv, g, T, S, bq, bk, window, biased, seed):
    """Grouped heads (dk, dv summed over the g query heads of a kv head), a constant bias, a band."""
    rng = np.random.default_rng(seed)
    h = h_kv * g
    q, dout = rng.normal(size=(2, h, T, 3)), rng.normal(size=(2, h, T, 3))
    k, v = rng.normal(size=(2, h_kv, S, 3)), rng.normal(size=(2, h_kv, S, 3))
    bias = rng.normal(size=(1, h, T, S)) if biased else None
    spec = masking.MaskSpec.plain(T, S, causal=True, aligned="bottom_right", window=window)
    out, lse = flash.flash_attention(q, k, v, mask=spec, bias=bias, block_q=bq, block_k=bk)
    got = flash.flash_attention_backward(q, k, v, out, lse, dout, mask=spec, bias=bias, block_q=bq,
                                         block_k=bk)
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    kk, vv = (t.repeat_interleave(g, dim=1) for t in leaves[1:])  # (2, h, S, 3): head i reads i // g
    scores = leaves[0] @ kk.transpose(-1, -2) / math.sqrt(3) + (0 if bias is None else torch.tensor(bias))
    t_pos, s_pos = torch.arange(T)[:, None] + S - T, torch.arange(S)[None, :]  # bottom-right positions
    ok = (s_pos <= t_pos) & (True if window is None else t_pos - s_pos < window)  # (T, S)
    weights = torch.nan_to_num(torch.softmax(scores.masked_fill(~ok, float("-inf")), -1), nan=0.0)
    want = torch.autograd.grad(weights @ vv, leaves, torch.tensor(dout))
    assert [g_.shape for g_ in got] == [q.shape, k.shape, v.shape]
    assert _max_err(got, [w.numpy() for w in want]) < 1e-12


def test_the_gqa_check_catches_dk_taken_from_one_query_head(monkeypatch):
    """Planted: a kv head's dk from its first query head only, not the sum over the group."""
    right = "dk_j += (ds.swapaxes(-1, -2) @ q[:, :, t0:t1]).sum(1, keepdims=True)"
    monkeypatch.setattr(flash, "_tiled_backward", planted(
        flash._tiled_backward, right, "dk_j += (ds.swapaxes(-1, -2) @ q[:, :, t0:t1])[:, :1]"))
    with pytest.raises(AssertionError):
        test_gqa_bias_and_window_gradients_equal_torch_autograd.hypothesis.inner_test(
            h_kv=1, g=2, T=5, S=7, bq=2, bk=3, window=None, biased=False, seed=0)
