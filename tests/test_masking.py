"""The one description of what may be attended (mha.attention.masking.MaskSpec) and each of its lowerings.

References, each independent of the code under test:
  * the rules written as plain loops over (b, h, t, s) (`loop_allowed`), from the docstring;
  * SDPA's is_causal staircase: torch.ones(T, S).tril() (its documented top-left alignment);
  * FlexAttention's own create_mask / flex_attention on the mask_mod and BlockMask;
  * packed sequences: each document run alone through a float64 softmax written here;
  * tile kinds: every tile of the loop mask read whole.
Every lowering is drawn by hypothesis over positions (1-D and per-sequence, pads, offsets),
causal, windows, documents and user masks, numpy and torch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_mask, flex_attention

from mha import steps
from mha.attention import flash, masks, numpy_attention, torch_attention
from mha.attention.masking import (
    FULL,
    PARTIAL,
    SKIPPED,
    MaskSpec,
    document_ids,
    packed_positions,
)
from mha.modules import compose
from mha.modules.numpy_mha import MultiHeadAttention
from mha.modules.torch_mha import MultiHeadAttention as TorchMHA

EAGER_FLEX = "ignore:flex_attention called without torch.compile"


def to_np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


# ---- the reference: the rules as loops -----------------------------------------------------------
def loop_allowed(q_pos, k_pos, causal=False, window=None, q_doc=None, k_doc=None, user=None,
                 B=1, H=1) -> np.ndarray:
    """(B, H, T, S) bool from the rules one pair at a time (the module docstring, read literally)."""
    q_pos, k_pos = np.atleast_2d(to_np(q_pos)), np.atleast_2d(to_np(k_pos))
    qd = None if q_doc is None else np.atleast_2d(to_np(q_doc))
    kd = None if k_doc is None else np.atleast_2d(to_np(k_doc))
    u = None if user is None else to_np(user)
    if u is not None:
        u = u.reshape((1, 1) * (u.ndim == 2) + (u.shape[0], 1) * (u.ndim == 3) + u.shape[-2:]) \
            if u.ndim < 4 else u
    T, S = q_pos.shape[-1], k_pos.shape[-1]
    out = np.zeros((B, H, T, S), dtype=bool)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                for s in range(S):
                    qp, kp = q_pos[min(b, len(q_pos) - 1), t], k_pos[min(b, len(k_pos) - 1), s]
                    ok = kp >= 0
                    if causal:
                        ok = ok and kp <= qp
                    if window is not None:
                        ok = ok and qp - kp < window
                    if qd is not None:
                        a, c = qd[min(b, len(qd) - 1), t], kd[min(b, len(kd) - 1), s]
                        ok = ok and a == c and a >= 0
                    if u is not None:
                        ok = ok and u[min(b, u.shape[0] - 1), min(h, u.shape[1] - 1), t, s]
                    out[b, h, t, s] = ok
    return out


@st.composite
def specs(draw, framework: str = "numpy", docs: bool | None = None, user: bool | None = None):
    """A drawn MaskSpec and the loop reference's arguments (B, H included)."""
    T, S = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    B = draw(st.sampled_from([None, 1, 2, 3]))  # None: positions (T,) shared by the batch
    rows = 1 if B is None else B

    def ints(n, lo, hi, batched):
        shape = (rows, n) if batched else (n,)
        return np.array(draw(st.lists(st.integers(lo, hi), min_size=int(np.prod(shape)),
                                      max_size=int(np.prod(shape))))).reshape(shape)

    batched = B is not None
    q_pos = ints(T, -1, 9, batched and draw(st.booleans()))
    k_pos = ints(S, -2, 9, batched and draw(st.booleans()))
    causal = draw(st.booleans())
    window = draw(st.one_of(st.none(), st.integers(1, 5))) if causal else None
    kw = dict(causal=causal, window=window)
    if docs if docs is not None else draw(st.booleans()):
        kw["q_doc"], kw["k_doc"] = ints(T, -1, 2, batched), ints(S, -1, 2, batched)
    H = 1
    if user if user is not None else draw(st.booleans()):
        H = draw(st.sampled_from([1, 2]))
        form = draw(st.sampled_from(["TS", "BTS", "BHTS"]))
        shape = {"TS": (T, S), "BTS": (rows, T, S), "BHTS": (rows, H, T, S)}[form]
        H = H if form == "BHTS" else 1
        bits = draw(st.lists(st.booleans(), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        kw["user"] = np.array(bits).reshape(shape)
    args = dict(q_pos=q_pos, k_pos=k_pos, **kw)
    if framework == "torch":
        args = {n: torch.as_tensor(a) if isinstance(a, np.ndarray) else a for n, a in args.items()}
    sizes = [np.shape(a)[0] for n, a in args.items() if n != "user" and np.ndim(a) == 2]
    sizes += [np.shape(kw["user"])[0]] if "user" in kw and np.ndim(kw["user"]) >= 3 else []
    return MaskSpec(**args), dict(args, B=max(sizes, default=1), H=H)

def full_dense(spec: MaskSpec, B: int, H: int) -> np.ndarray:
    """spec.dense() as a numpy (B, H, T, S) array (all True where it says None)."""
    d = spec.dense()
    if d is None:
        return np.ones((B, H, spec.T, spec.S), dtype=bool)
    d = to_np(d)
    assert d.ndim == 4, f"dense() must be 4-D, got {d.shape}"
    return np.broadcast_to(d, (B, H, spec.T, spec.S))


# ---- dense --------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(drawn=specs(), framework=st.sampled_from(["numpy", "torch"]))
def test_dense_equals_the_rules_written_as_loops(drawn, framework):
    spec, ref = drawn
    if framework == "torch":
        spec = MaskSpec(*(torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in
                          (spec.q_pos, spec.k_pos, spec.causal, spec.window, spec.q_doc,
                           spec.k_doc, spec.user)))
    want = loop_allowed(**ref)
    got = full_dense(spec, ref["B"], ref["H"])
    np.testing.assert_array_equal(got, want)
    d = spec.dense()
    assert d is None or isinstance(d, torch.Tensor) == (framework == "torch")
    full = spec.dense(full=True)
    assert tuple(full.shape) == (spec.B, spec.H, spec.T, spec.S)
    np.testing.assert_array_equal(np.broadcast_to(to_np(full), want.shape), want)


def test_dense_is_none_only_when_everything_is_allowed():
    assert MaskSpec.plain(4, 6).dense() is None
    assert MaskSpec.plain(4, 6, causal=True, aligned="bottom_right").dense() is not None
    decode = MaskSpec(np.array([9]), np.arange(10), causal=True)  # one new token, 10 keys
    assert decode.dense() is None and decode.all_allowed()
    assert MaskSpec(np.array([9]), np.arange(10), causal=True, window=10).dense() is None
    assert MaskSpec(np.array([9]), np.arange(10), causal=True, window=9).dense() is not None
    padded = MaskSpec(np.array([9]), np.array([-1, *range(1, 10)]), causal=True)
    np.testing.assert_array_equal(padded.dense()[0, 0, 0], np.arange(10) > 0)


def test_the_plain_numpy_staircase_is_the_lessons_causal_mask(monkeypatch):
    """The modules' causal mask is steps.causal_mask (05_causal_mask.ipynb), offset after a cache."""
    seen = []
    real = steps.causal_mask
    monkeypatch.setattr(steps, "causal_mask", lambda *a, **k: seen.append((a, k)) or real(*a, **k))
    MaskSpec.plain(3, 5, causal=True).dense()
    MaskSpec(np.arange(3) + 2, np.arange(5), causal=True).dense()
    assert seen == [((3, 5), {}), ((3, 5), {"offset": 2})]


# ---- SDPA's two arguments ------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(drawn=specs(framework="torch"))
def test_sdpa_args_mean_exactly_the_spec(drawn):
    spec, ref = drawn
    mask, is_causal = spec.sdpa_args()
    T, S = spec.T, spec.S
    if is_causal:
        assert mask is None
        meant = np.broadcast_to(torch.ones(T, S, dtype=torch.bool).tril().numpy(), (ref["B"], ref["H"], T, S))
    else:
        meant = np.ones((ref["B"], ref["H"], T, S), bool) if mask is None else \
            np.broadcast_to(to_np(mask), (ref["B"], ref["H"], T, S))
    np.testing.assert_array_equal(meant, loop_allowed(**ref))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_sdpa_args_keep_the_fast_kernels_for_prefill_and_decode(framework):
    like = torch.zeros(1) if framework == "torch" else None
    assert MaskSpec.plain(6, causal=True, like=like).sdpa_args() == (None, True)  # causal prefill
    assert MaskSpec.plain(6, like=like).sdpa_args() == (None, False)  # no mask at all
    decode = MaskSpec.plain(1, 9, causal=True, like=like, aligned="bottom_right")  # cached decode step
    assert decode.sdpa_args() == (None, False)
    chunk = MaskSpec.plain(3, 9, causal=True, like=like, aligned="bottom_right")  # chunk after a cache
    mask, is_causal = chunk.sdpa_args()
    assert not is_causal and mask is not None  # bottom-right: SDPA's is_causal would be wrong
    for changed in (dict(window=3), dict(k_pos=np.array([-1, 1, 2, 3, 4, 5]))):
        spec = MaskSpec.plain(6, causal=True, like=like).with_(**changed)
        assert spec.sdpa_args()[1] is False and spec.sdpa_args()[0] is not None


def test_the_module_calls_sdpa_with_is_causal_and_no_mask_where_exact(monkeypatch):
    """What the torch module hands SDPA: is_causal for a prefill, nothing for a decode step."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        calls.append((attn_mask is None, is_causal, q.shape[-2], k.shape[-2]))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    m = TorchMHA(16, 4, dtype=torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    cache = m.new_cache(2, 8)
    with torch.no_grad():
        m(x, causal=True, cache=cache)
        m(x[:, :1], causal=True, cache=cache)
    assert calls == [(True, True, 5, 5), (True, False, 1, 6)]


def test_all_allowed_and_is_causal_are_decided_without_a_dense_mask(monkeypatch):
    """At T = S = 100,000 a (T, S) mask is 10 GB: the answers must come from positions alone."""
    def refuse(self, full=False):
        raise AssertionError("dense() was built")

    monkeypatch.setattr(MaskSpec, "dense", refuse)
    n = 100_000
    prefill = MaskSpec.plain(n, causal=True)
    assert prefill.sdpa_args() == (None, True)
    after = MaskSpec(n + np.arange(n), np.arange(n), causal=True)  # every key before every query
    assert after.sdpa_args() == (None, False)
    assert MaskSpec.plain(n, n, causal=True, like=torch.zeros(1)).sdpa_args() == (None, True)
    assert MaskSpec.packed([n]).sdpa_args() == (None, True)  # one document is plain causal


# ---- tiles ---------------------------------------------------------------------------------------
def loop_kinds(allowed: np.ndarray, bq: int, bk: int) -> np.ndarray:
    """(B, nq, nk) kinds read off a (B, H, T, S) mask tile by tile."""
    B, _, T, S = allowed.shape
    nq, nk = -(-T // bq), -(-S // bk)
    out = np.empty((B, nq, nk), dtype=np.int8)
    for b in range(B):
        for i in range(nq):
            for j in range(nk):
                tile = allowed[b, :, i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
                out[b, i, j] = FULL if tile.all() else SKIPPED if not tile.any() else PARTIAL
    return out


@settings(max_examples=150, deadline=None)
@given(drawn=specs(), bq=st.integers(1, 4), bk=st.integers(1, 4))
def test_tile_kinds_never_skip_an_allowed_pair_nor_call_a_masked_tile_full(drawn, bq, bk):
    spec, ref = drawn
    want = loop_allowed(**ref)
    kinds = spec.tile_kinds(bq, bk)
    exact = loop_kinds(want, bq, bk)
    assert kinds.shape[1:] == exact.shape[1:] and kinds.shape[0] in (1, exact.shape[0])
    kinds = np.broadcast_to(kinds, exact.shape)
    assert ((kinds == exact) | (kinds == PARTIAL)).all(), (kinds, exact)  # PARTIAL is always safe
    b = ref["B"] - 1
    for t0 in range(0, spec.T, bq):
        for s0 in range(0, spec.S, bk):
            block = spec.block(t0, t0 + bq, s0, s0 + bk)
            piece = want[:, :, t0:t0 + bq, s0:s0 + bk]
            got = np.ones_like(piece) if block is None else np.broadcast_to(to_np(block), piece.shape)
            np.testing.assert_array_equal(got, piece)
            if ref["H"] == 1:
                tile = spec.tile(b, t0, t0 + bq, s0, s0 + bk)
                np.testing.assert_array_equal(np.ones_like(piece[b, 0]) if tile is None else tile,
                                              piece[b, 0])
                assert (tile is None) == bool(piece[b, 0].all())


@settings(max_examples=100, deadline=None)
@given(T=st.integers(1, 12), S=st.integers(1, 12), bq=st.integers(1, 5), bk=st.integers(1, 5),
       offset=st.integers(-4, 8), window=st.one_of(st.none(), st.integers(1, 6)),
       framework=st.sampled_from(["numpy", "torch"]))
def test_tile_kinds_are_exact_for_plain_positions_and_skip_left_of_a_window(T, S, bq, bk, offset,
                                                                           window, framework):
    arange = torch.arange if framework == "torch" else np.arange
    spec = MaskSpec(offset + arange(T), arange(S), causal=True, window=window)
    exact = loop_kinds(loop_allowed(offset + np.arange(T), np.arange(S), True, window), bq, bk)
    np.testing.assert_array_equal(spec.tile_kinds(bq, bk), exact)
    if window is None:  # flash's schedule is the causal case of it
        np.testing.assert_array_equal(flash.tile_schedule(T, S, bq, bk, offset=offset), exact[0])


def test_a_window_skips_the_tiles_left_of_its_band():
    kinds = MaskSpec.plain(16, causal=True, window=4).tile_kinds(4, 4)[0]
    assert (np.diag(kinds) == PARTIAL).all() and (np.diag(kinds, -1) == PARTIAL).all()
    assert (np.tril(kinds == SKIPPED, -2)[np.tril_indices(4, -2)]).all()  # left of the band
    causal = MaskSpec.plain(16, causal=True).tile_kinds(4, 4)[0]
    assert (np.tril(causal, -1)[np.tril_indices(4, -1)] == FULL).all()  # without it: computed


# ---- FlexAttention -------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(drawn=specs(framework="torch"))
def test_mask_mod_equals_dense(drawn):
    spec, ref = drawn
    got = create_mask(spec.mask_mod(), ref["B"], ref["H"], spec.T, spec.S, device="cpu")
    np.testing.assert_array_equal(got.numpy(), loop_allowed(**ref))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_pad_tokens_of_a_packed_row_read_nothing_and_are_never_read_in_every_lowering(framework):
    lengths = torch.tensor([2, 3]) if framework == "torch" else [2, 3]
    ids = document_ids(lengths, total=7)  # tokens 5, 6: document -1
    want = loop_allowed(np.arange(7), np.arange(7), q_doc=ids, k_doc=ids)
    assert not want[..., 5:, :].any() and not want[..., 5:].any()
    packed = MaskSpec.packed(lengths, causal=False, total=7)  # pads: position -1 too
    by_ids = MaskSpec(packed.k_pos * 0 + np.arange(7), np.arange(7), q_doc=ids, k_doc=ids)  # ids alone
    for spec in (packed, by_ids):
        np.testing.assert_array_equal(full_dense(spec, 1, 1), want)
        got = create_mask(spec.mask_mod(), None, None, 7, 7, device="cpu").numpy()
        np.testing.assert_array_equal(got, want)
        assert (spec.tile_kinds(2, 2)[0, 2:, 3] == SKIPPED).all()  # pads' own tile: nothing to do


def test_mask_mod_looks_up_positions_never_a_dense_table():
    """Only per-position tensors ride in the closure (none of T * S entries) unless a user mask is given."""
    T = S = 64
    lens = [20, 30, 14]
    for spec in (MaskSpec.packed(lens), MaskSpec.padded(torch.tensor([64, 40]), T, causal=True),
                 MaskSpec(torch.arange(T) + 3, torch.arange(S), causal=True, window=8)):
        mod = spec.mask_mod()
        captured = [c.cell_contents for c in mod.__closure__ or ()]
        tensors = [c for c in captured if isinstance(c, torch.Tensor)]
        tensors += [t for c in captured if isinstance(c, tuple) for t in c if isinstance(t, torch.Tensor)]
        assert all(t.numel() < T * S for t in tensors), [tuple(t.shape) for t in tensors]
    user = MaskSpec.plain(T, like=torch.zeros(1)).with_(user=torch.ones(T, S, dtype=torch.bool))
    assert any(isinstance(c.cell_contents, torch.Tensor) and c.cell_contents.numel() == T * S
               for c in user.mask_mod().__closure__)  # the one case that needs a lookup


@settings(max_examples=25, deadline=None)
@given(drawn=specs(framework="torch", user=False), block=st.sampled_from([2, 4]))
def test_block_mask_holds_exactly_dense(drawn, block):
    """The BlockMask's tiles expanded and its mask_mod applied inside them give dense(); every tile
    tile_kinds skips is empty there too."""
    spec, ref = drawn
    bm = spec.block_mask(ref["B"], ref["H"], spec.T, spec.S, block_size=block)
    want = loop_allowed(**ref)
    if bm is None:
        assert want.all()
        return
    tiles = bm.to_dense()  # (B|1, 1, nq, nk): a tile is computed at all
    nq, nk = -(-spec.T // block), -(-spec.S // block)
    grid = tiles[..., :nq, :nk].repeat_interleave(block, -2).repeat_interleave(block, -1)
    grid = grid[..., :spec.T, :spec.S].numpy().astype(bool)  # (B|1, 1, T, S)
    inside = create_mask(bm.mask_mod, ref["B"], ref["H"], spec.T, spec.S, device="cpu").numpy()
    np.testing.assert_array_equal(np.broadcast_to(grid, want.shape) & inside, want)
    kinds = np.broadcast_to(spec.tile_kinds(block, block), (tiles.shape[0], nq, nk))
    assert not (tiles[:, 0, :nq, :nk].numpy() > 0)[kinds == SKIPPED].any()  # skipped: skipped there
    assert bm.shape[0] == (spec.B if spec.B > 1 else 1)  # B=None when the same for every sequence


@pytest.mark.filterwarnings(EAGER_FLEX)
def test_flex_attention_with_the_block_mask_equals_sdpa_with_dense():
    g = torch.Generator().manual_seed(0)
    B, h, T, d = 2, 2, 40, 8
    q, k, v = (torch.randn(B, h, T, d, generator=g, dtype=torch.float64) for _ in range(3))
    spec = MaskSpec(torch.tensor([[*range(30), *[-1] * 10], [*range(40)]]),
                    torch.tensor([[*range(30), *[-1] * 10], [*range(40)]]), causal=True, window=7,
                    q_doc=torch.tensor([[0] * 12 + [1] * 28, [0] * 40]),
                    k_doc=torch.tensor([[0] * 12 + [1] * 28, [0] * 40]))
    dense = spec.dense()
    live = dense.any(-1, keepdim=True)  # rows with a key: SDPA gives NaN-free output there only
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    got = flex_attention(q, k, v, block_mask=spec.block_mask(B, h, T, T, block_size=8))
    torch.testing.assert_close(torch.where(live, got, 0.0), torch.where(live, want, 0.0), rtol=0, atol=1e-12)
    assert (got[~live.expand_as(got)] == 0).all()  # rows with no key: zeros


# ---- packed sequences ------------------------------------------------------------------------------
def softmax_reference(q, k, v, causal) -> np.ndarray:
    """float64 attention over one document: (h, L, d) each -> (h, L, d)."""
    scores = np.einsum("htd,hsd->hts", q, k) / np.sqrt(q.shape[-1])  # (h, L, L)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v  # (h, L, d)


def each_document_alone(q, k, v, lengths, causal) -> np.ndarray:
    """(1, h, T, d): every document attended on its own, concatenated; pads (past the docs) zero."""
    out = np.zeros(q.shape)
    a = 0
    for n in lengths:
        sl = slice(a, a + n)
        g = q.shape[1] // k.shape[1]
        kk, vv = np.repeat(k[0, :, sl], g, 0), np.repeat(v[0, :, sl], g, 0)  # (h, L, d)
        out[0, :, sl] = softmax_reference(q[0, :, sl], kk, vv, causal)
        a += n
    return out


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4), causal=st.booleans(),
       pad=st.integers(0, 3), h_kv=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
@pytest.mark.filterwarnings(EAGER_FLEX)
def test_a_packed_row_equals_each_document_alone_on_every_backend(lengths, causal, pad, h_kv, seed):
    rng = np.random.default_rng(seed)
    T = sum(lengths) + pad
    q = rng.normal(size=(1, 2, T, 4))
    k, v = rng.normal(size=(1, h_kv, T, 4)), rng.normal(size=(1, h_kv, T, 4))
    spec = MaskSpec.packed(lengths, causal=causal, total=T)
    want = each_document_alone(q, k, v, lengths, causal)
    for backend in ("reference", "flash"):
        out, _ = numpy_attention.attention(q, k, v, spec, backend=backend)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-12, err_msg=backend)
    tspec = MaskSpec.packed(torch.tensor(lengths), causal=causal, total=T)
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    for backend in ("manual", "sdpa", "flex"):
        with torch.no_grad():
            out, _ = torch_attention.attention(qt, kt, vt, tspec, backend=backend,
                                               **({"compile": False} if backend == "flex" else {}))
        real = np.arange(T) < sum(lengths)  # pad queries: no key; each backend's own convention
        np.testing.assert_allclose(out.numpy()[:, :, real], want[:, :, real], rtol=0, atol=1e-12,
                                   err_msg=backend)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.filterwarnings(EAGER_FLEX)
def test_a_packed_batch_with_rope_equals_each_document_alone_in_the_modules(causal, framework):
    """Positions restart per document (packed_positions): RoPE turns each as if alone.

    (RoPE is relative, so running positions 0..T-1 give the same scores up to rounding; the
    restart keeps the numbers each document would see alone, as a cache or ALiBi's bias do.)
    """
    lengths = [3, 5, 2]
    T = sum(lengths)
    m = MultiHeadAttention(16, 4, seed=1, rope="half", n_kv_heads=2)
    x = np.random.default_rng(1).normal(size=(1, T, 16))
    starts = np.cumsum([0, *lengths[:-1]])
    want = np.concatenate([m(x[:, a:a + n], causal=causal) for a, n in zip(starts, lengths, strict=True)], 1)
    pos = packed_positions(lengths)
    np.testing.assert_array_equal(pos, [0, 1, 2, 0, 1, 2, 3, 4, 0, 1])
    spec = MaskSpec.packed(lengths, causal=causal)
    if framework == "numpy":
        runs = {b: (lambda mask, b=b: m(x, causal=causal, positions=pos, mask=mask, backend=b))
                for b in ("reference", "flash")}
    else:
        tm = TorchMHA.from_numpy(m)
        runs = {b: (lambda mask, b=b: tm(torch.from_numpy(x), causal=causal, mask=mask, backend=b,
                                         positions=torch.from_numpy(pos)).numpy())
                for b in ("manual", "sdpa", "flex")}
    with torch.no_grad():
        for backend, run in runs.items():
            np.testing.assert_allclose(run(spec), want, rtol=0, atol=1e-12, err_msg=backend)
            assert np.abs(run(None) - want).max() > 1e-3  # without the documents: they leak


def test_packed_ids_positions_and_errors():
    np.testing.assert_array_equal(document_ids([2, 0, 3], total=7), [0, 0, 2, 2, 2, -1, -1])
    np.testing.assert_array_equal(packed_positions([2, 3], total=6), [0, 1, 0, 1, 2, -1])
    ids = torch.tensor([[0, 0, 1, 1, 1], [5, 5, 5, 7, -1]])
    spec = MaskSpec.packed(doc_ids=ids, causal=False)
    assert spec.is_torch and spec.B == 2
    np.testing.assert_array_equal(to_np(spec.q_pos), [[0, 1, 0, 1, 2], [0, 1, 2, 0, -1]])
    np.testing.assert_array_equal(to_np(spec.dense(full=True))[1, 0, 4], [False] * 5)  # a pad reads nothing
    np.testing.assert_array_equal(to_np(spec.dense(full=True))[1, 0, :, 4], [False] * 5)  # nor is read
    with pytest.raises(ValueError, match="exactly one of lengths"):
        MaskSpec.packed()
    with pytest.raises(ValueError, match="total=3 is shorter than the documents' 5 tokens"):
        MaskSpec.packed([2, 3], total=3)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        document_ids([2, -1])


# ---- the lessons' masks are lowerings of it ------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(0, 6), min_size=1, max_size=3), T=st.integers(0, 6),
       causal=st.booleans(), queries=st.booleans(), framework=st.sampled_from(["numpy", "torch"]))
def test_padding_mask_is_the_padded_spec_and_its_definition(lens, T, causal, queries, framework):
    T = max(T, *lens, 1)  # padding_mask takes T >= 1
    lengths = torch.tensor(lens) if framework == "torch" else np.array(lens)
    got = masks.padding_mask(lengths, T, causal=causal, queries=queries)
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    L = np.array(lens)[:, None, None, None]
    want = (s < L) & ((t < L) if queries else True) & ((s <= t) if causal else True)  # (B, 1, T, S)
    np.testing.assert_array_equal(to_np(got), np.broadcast_to(want, (len(lens), 1, T, T)))
    assert isinstance(got, torch.Tensor) == (framework == "torch")


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 8), S=st.integers(1, 8), window=st.integers(1, 9), offset=st.integers(-3, 6))
def test_sliding_window_mask_is_the_windowed_spec_and_its_definition(T, S, window, offset):
    t, s = np.arange(T)[:, None] + offset, np.arange(S)[None, :]
    want = (s <= t) & (t - s < window)
    np.testing.assert_array_equal(masks.sliding_window_mask(T, window, S, offset), want)


# ---- compose: the modules' spec ---------------------------------------------------------------------
def test_compose_mask_spec_joins_a_given_spec_to_the_modules_positions():
    q_pos = np.arange(6)
    packed = MaskSpec.packed([2, 4], causal=False)
    spec = compose.mask_spec(q_pos, q_pos, True, None, packed, 1, 4)
    want = loop_allowed(q_pos, q_pos, causal=True, q_doc=packed.q_doc, k_doc=packed.k_doc)
    np.testing.assert_array_equal(full_dense(spec, 1, 1), want)
    padded = MaskSpec(np.arange(6), np.array([-1, 1, 2, 3, 4, 5]))  # key 0 is a pad
    spec = compose.mask_spec(q_pos, q_pos, False, None, padded, 1, 4)
    assert not full_dense(spec, 1, 1)[..., 0].any()
    user = np.tril(np.ones((6, 6), bool))
    np.testing.assert_array_equal(compose.allowed(q_pos, q_pos, False, None, user, 2, 4)[0, 0], user)
    with pytest.raises(ValueError, match="describes T=6 queries and S=6 keys, but this call has T=6 and S=9"):
        compose.mask_spec(q_pos, np.arange(9), True, None, packed, 1, 4)
    with pytest.raises(ValueError, match=r"mask must be \(T=6, S=6\)"):
        compose.mask_spec(q_pos, q_pos, True, None, np.ones((5, 6), bool), 1, 4)
    assert compose.allowed(np.array([5]), np.arange(6), True, None, None, 1, 4) is None  # decode


# ---- bad input: clear errors ----------------------------------------------------------------------------
@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda: MaskSpec(np.arange(3), np.arange(3), window=2), ValueError,
     "window=2 is a causal band .* give causal=True"),
    (lambda: MaskSpec(np.arange(3.0), np.arange(3)), TypeError, "q_pos must hold whole numbers"),
    (lambda: MaskSpec(np.zeros((1, 1, 3), int), np.arange(3)), ValueError, r"q_pos must be \(n,\) or \(B, n\)"),
    (lambda: MaskSpec(np.arange(3), np.arange(3), q_doc=np.zeros(3, int)), ValueError,
     "q_doc and k_doc come together"),
    (lambda: MaskSpec(np.arange(3), np.arange(3), q_doc=np.zeros(2, int), k_doc=np.zeros(3, int)),
     ValueError, r"q_doc must have one id per query \(3\)"),
    (lambda: MaskSpec(np.arange(3), np.arange(4), user=np.ones((3, 4))), TypeError,
     "user must be a boolean mask"),
    (lambda: MaskSpec(np.arange(3), np.arange(4), user=np.ones((4, 3), bool)), ValueError,
     r"user must be \(T=3, S=4\)"),
    (lambda: MaskSpec(np.zeros((2, 3), int), np.zeros((3, 4), int)), ValueError,
     "batch sizes .* must agree"),
    (lambda: MaskSpec(np.arange(3), np.arange(3), causal="yes"), TypeError, "causal must be True or False"),
    (lambda: MaskSpec.plain(3, 3, aligned="bottom"), ValueError, "aligned must be one of"),
    (lambda: MaskSpec.plain(3).block_mask(1, 1, 4, 3), ValueError, r"must match the spec's \(T=3, S=3\)"),
    (lambda: MaskSpec.plain(3, causal=True).tile_kinds(0, 2), ValueError, "block_q must be >= 1"),
])
def test_bad_specs_give_clear_errors(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_spec_follows_its_tensors_and_refuses_change():
    spec = MaskSpec(torch.arange(4), np.arange(4), causal=True)  # numpy keys join the torch queries
    assert spec.is_torch and isinstance(spec.k_pos, torch.Tensor)
    with pytest.raises(AttributeError):
        spec.causal = False  # frozen: what a backend was handed does not change under it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MaskSpec([0, 1, 2], [0, 1, 2], causal=True).sdpa_args() == (None, True)  # lists
