"""Heatmap helpers and the attention explorer, without a browser: pure logic and figure data."""

import base64

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

from mha import steps
from mha.attention import posenc
from mha.modules.numpy_mha import MultiHeadAttention
from mha_course import viz


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _heatmaps(fig) -> list[np.ndarray]:
    """The data of every heatmap in a figure, in axes order."""
    return [np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images]


# Pure functions -------------------------------------------------------------------------
def test_divisors():
    assert viz.divisors(16) == [1, 2, 4, 8, 16]
    assert viz.divisors(12) == [1, 2, 3, 4, 6, 12]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_maps_match_the_module(causal):
    d_model, h, T, seed = 16, 4, 5, 3
    got = viz.attention_maps(d_model, h, T, causal=causal, temperature=1.0, seed=seed)
    mha = MultiHeadAttention(d_model, h, seed=seed)
    x = np.random.default_rng(seed).normal(0.0, 1.0, (1, T, d_model))
    mha(x, causal=causal)
    assert got.shape == (h, T, T)
    np.testing.assert_allclose(got, mha.attn[0], rtol=0, atol=1e-12)


def test_temperature_divides_the_scores_before_softmax():
    d_model, h, T, temp = 16, 2, 6, 0.3
    base = viz.attention_maps(d_model, h, T, causal=False, temperature=1.0)
    got = viz.attention_maps(d_model, h, T, causal=False, temperature=temp)
    # Independent reference: softmax(log(w) / temp) recovers softmax(scores / temp),
    # because log(w) differs from the scores only by a per-row constant.
    z = np.log(base) / temp
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_temperature_moves_entropy_the_right_way_and_keeps_the_mask():
    ent = [viz.row_entropy(viz.attention_maps(16, 4, 8, True, t)).mean() for t in (0.2, 1, 5)]
    assert ent[0] < ent[1] < ent[2]
    cold = viz.attention_maps(16, 4, 8, causal=True, temperature=0.1)
    upper = ~steps.causal_mask(8)
    assert np.all(cold[:, upper] == 0.0)
    np.testing.assert_allclose(cold.sum(-1), 1.0, rtol=0, atol=1e-12)


def test_longer_T_keeps_earlier_causal_rows():
    short = viz.attention_maps(16, 4, 5, causal=True)
    long = viz.attention_maps(16, 4, 9, causal=True)
    # Same tokens 0..4 and nothing after them visible: equal up to BLAS rounding.
    np.testing.assert_allclose(long[:, :5, :5], short, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad, err", [(0.0, ValueError), (-1.0, ValueError),
                                      (float("inf"), ValueError), ("1", TypeError)])
def test_attention_maps_rejects_bad_temperature(bad, err):
    with pytest.raises(err, match="temperature"):
        viz.attention_maps(16, 4, 6, temperature=bad)


def test_attention_maps_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="d_model=16 must be divisible by n_heads=3"):
        viz.attention_maps(16, 3, 6)


def test_row_entropy_against_formula():
    w = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(viz.row_entropy(w), [0.0, np.log(2), np.log(3)], atol=1e-15)


def test_describe_counts_exact_zeros():
    maps = viz.attention_maps(16, 4, 6, causal=True)
    text = viz.describe(maps, causal=True, temperature=1.0)
    assert text.startswith("causal on: 15 of 36 weights per head are exactly 0")
    off = viz.describe(viz.attention_maps(16, 4, 6, causal=False), False, 2.0)
    assert off.startswith("causal off: 0 of 36") and "temperature 2" in off


def test_what_changed():
    old = {"causal": True, "T": 6, "temperature": 1.0}
    assert viz.what_changed(old, old) == "initial view"
    new = {"causal": False, "T": 8, "temperature": 1.45}
    assert viz.what_changed(old, new) == "changed: causal True -> False, T 6 -> 8, temperature 1 -> 1.45"


# Plot helpers ------------------------------------------------------------------------
def test_plot_attention_shows_exactly_the_weights():
    w = viz.attention_maps(16, 1, 5)[0]
    ax = viz.plot_attention(w, title="head 0", tokens=list("abcde"))
    np.testing.assert_array_equal(ax.images[0].get_array(), w)
    assert ax.get_title() == "head 0"
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
    assert ax.images[0].get_clim() == (0.0, 1.0)


def test_plot_attention_rejects_wrong_inputs():
    with pytest.raises(ValueError, match=r"weights_2d must be \(T, S\), got \(2, 3, 3\)"):
        viz.plot_attention(np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match="tokens must have 3 labels"):
        viz.plot_attention(np.zeros((3, 3)), tokens=["a"])


def test_plot_heads_one_heatmap_per_head():
    maps = viz.attention_maps(16, 8, 4)
    fig = viz.plot_heads(maps)
    data = _heatmaps(fig)
    assert len(data) == 8
    for j in range(8):
        np.testing.assert_array_equal(data[j], maps[j])
    fig1 = viz.plot_heads(maps[None, :2])  # (1, h, T, S) is accepted too
    assert len(_heatmaps(fig1)) == 2
    with pytest.raises(ValueError, match=r"weights must be \(h, T, S\)"):
        viz.plot_heads(maps[0])


# The explorer widget, without a browser ----------------------------------------------------
@pytest.fixture
def explorer():
    return viz.explorer(d_model=16, n_heads=4, T=6, causal=False, temperature=1.0)


def test_explorer_children_are_the_controls_image_and_caption(explorer):
    import ipywidgets as widgets

    assert isinstance(explorer.widget, widgets.VBox)
    assert explorer.widget.children[2] is explorer.image
    assert explorer.widget.children[3] is explorer.caption
    assert list(explorer.controls["n_heads"].options) == [1, 2, 4, 8, 16]
    assert bytes(explorer.image.value).startswith(b"\x89PNG")
    assert "initial view" in explorer.caption.value


def test_explorer_causal_zeroes_the_upper_triangle(explorer):
    before = _heatmaps(explorer.fig)
    assert all((d[np.triu_indices(6, 1)] > 0).all() for d in before)
    png = bytes(explorer.image.value)
    explorer.controls["causal"].value = True
    after = _heatmaps(explorer.fig)
    assert len(after) == 4
    for d in after:
        assert np.all(d[np.triu_indices(6, 1)] == 0.0)
        np.testing.assert_allclose(d.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert bytes(explorer.image.value) != png
    assert "changed: causal False -> True" in explorer.caption.value
    assert "15 of 36 weights per head are exactly 0" in explorer.caption.value


def test_explorer_heads_slider_changes_the_number_of_heatmaps(explorer):
    for h in (1, 2, 8, 16):
        explorer.controls["n_heads"].value = h
        data = _heatmaps(explorer.fig)
        assert len(data) == h
        np.testing.assert_array_equal(np.stack(data), viz.attention_maps(16, h, 6, False))
        assert len(explorer.controls["head"].options) == h + 1


def test_explorer_temperature_changes_entropy_in_the_right_direction(explorer):
    def entropy():
        return viz.row_entropy(np.stack(_heatmaps(explorer.fig))).mean()

    e1 = entropy()
    explorer.controls["temperature"].value = 0.2
    e_cold = entropy()
    explorer.controls["temperature"].value = 5.0
    e_hot = entropy()
    assert e_cold < e1 < e_hot


def test_explorer_length_and_single_head_view(explorer):
    explorer.controls["T"].value = 11
    data = _heatmaps(explorer.fig)
    assert [d.shape for d in data] == [(11, 11)] * 4
    explorer.controls["head"].value = 2
    assert "changed: head all -> 2" in explorer.caption.value
    (one,) = _heatmaps(explorer.fig)
    np.testing.assert_array_equal(one, viz.attention_maps(16, 4, 11, False)[2])
    explorer.controls["n_heads"].value = 2  # head 2 no longer exists: back to the grid
    assert explorer.controls["head"].value == -1
    assert len(_heatmaps(explorer.fig)) == 2


@pytest.mark.parametrize("kwargs, match", [({"n_heads": 3}, "divisible"), ({"T": 1}, "T must be"),
                                           ({"T": 17}, "T must be"),
                                           ({"temperature": 20.0}, "temperature must be")])
def test_explorer_rejects_settings_outside_its_controls(kwargs, match):
    with pytest.raises(ValueError, match=match):
        viz.explorer(d_model=16, **kwargs)


def test_explorer_displays_the_widget_with_a_png_fallback(explorer, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append(obj))
    explorer._ipython_display_()
    (bundle,) = shown
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.widget.model_id
    assert base64.b64decode(bundle["image/png"]) == bytes(explorer.image.value)


def test_explorer_reuses_figures_and_keeps_titles_current(explorer):
    grid4 = explorer.fig
    explorer.controls["n_heads"].value = 8
    assert explorer.fig is not grid4
    explorer.controls["n_heads"].value = 4
    assert explorer.fig is grid4  # the laid-out view is reused, only its data changes
    explorer.controls["head"].value = 0
    assert explorer.fig.axes[0].get_title() == "head 0 of 4"
    explorer.controls["n_heads"].value = 8  # head 0 still exists: same view kind, new title
    assert explorer.fig.axes[0].get_title() == "head 0 of 8"
    np.testing.assert_array_equal(_heatmaps(explorer.fig)[0],
                                  viz.attention_maps(16, 8, 6, False)[0])


def test_describe_reports_a_range_when_heads_differ():
    maps = np.full((2, 2, 2), 0.5)
    maps[1, 0] = [1.0, 0.0]  # head 1 has one exact zero, head 0 none
    assert viz.describe(maps, causal=False, temperature=1.0).startswith(
        "causal off: 0-1 of 4 weights per head are exactly 0")


# What a reader sees ---------------------------------------------------------------------------
def test_pipeline_labels_fit_inside_their_boxes():
    from matplotlib.patches import FancyBboxPatch

    ax = viz.plot_pipeline(MultiHeadAttention(16, 4).trace(np.zeros((2, 6, 16)), causal=True))
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [p.get_window_extent(r) for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 7
    inside = 0
    for t in ax.texts:
        tb = t.get_window_extent(r)
        box = next((b for b in boxes if b.x0 <= tb.x0 + tb.width / 2 <= b.x1), None)
        if box is None:
            continue  # the input shape, left of the first box
        assert box.x0 <= tb.x0 and tb.x1 <= box.x1, f"label {t.get_text()!r} spills out of its box"
        inside += 1
    assert inside == 21  # name, formula and shape in each of the seven boxes
    plt.close(fig)


def test_exact_zeros_are_drawn_grey_and_tiny_weights_are_not():
    w = np.array([[1.0, 0.0], [1e-12, 1.0 - 1e-12]])
    ax = viz.plot_attention(w)
    shown = ax.images[0].get_array()
    assert shown.mask.tolist() == [[False, True], [False, False]]
    rgba = ax.images[0].cmap(np.ma.masked_array([0.0], mask=[True]))
    assert np.allclose(rgba[0][:3], matplotlib.colors.to_rgb("#c8c8c8"))
    plt.close(ax.figure)


@pytest.mark.parametrize("T", [6, 16, 40])
def test_tick_labels_stay_readable_up_to_any_length(T):
    ax = viz.plot_attention(np.full((T, T), 1.0 / T))
    assert len(ax.get_xticks()) <= 10 and ax.get_xticks()[0] == 0
    plt.close(ax.figure)


def test_head_grid_has_one_shared_colour_bar():
    fig = viz.plot_heads(viz.attention_maps(16, 16, 16, causal=True), ticks=False)
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1 and "exactly 0" in bars[0].get_ylabel()
    plt.close(fig)


# The mask / bias selector ------------------------------------------------------------------
def _module_inputs(d_model=16, h=4, T=7, seed=0):
    """The explorer's module and tokens: the same seeded draw attention_maps uses."""
    mha = MultiHeadAttention(d_model, h, seed=seed)
    x = np.random.default_rng(seed).normal(0.0, 1.0, (1, T, d_model))  # (1, T, d_model)
    return mha, x


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", ["window", "padding"])
def test_mask_patterns_equal_the_module_with_that_mask(pattern, causal):
    # Independent masks, written out with loops: the module applies them through steps 4-5.
    T, window, pad = 7, 3, viz.padded(7)
    allowed = np.zeros((T, T), dtype=bool)
    for t in range(T):
        for s in range(T):
            ok = abs(t - s) < window if pattern == "window" else (t < T - pad and s < T - pad)
            allowed[t, s] = ok and (s <= t or not causal)
    got = viz.attention_maps(16, 4, T, causal=causal, pattern=pattern, window=window)
    mha, x = _module_inputs(T=T)
    mha(x, mask=allowed)
    np.testing.assert_allclose(got, mha.attn[0], rtol=0, atol=1e-12)
    assert np.all(got[:, ~allowed] == 0.0)
    np.testing.assert_array_equal(viz.explorer_mask(T, causal, pattern, window), allowed)


def test_window_with_causal_equals_torch_sdpa_band():
    import torch
    import torch.nn.functional as F

    T, window = 9, 3
    got = viz.attention_maps(16, 2, T, causal=True, pattern="window", window=window)
    mha, x = _module_inputs(h=2, T=T)
    q = torch.from_numpy(mha.Wq.T @ x[0].T).T.reshape(T, 2, 8).transpose(0, 1)[None]  # (1,2,T,8)
    k = torch.from_numpy(mha.Wk.T @ x[0].T).T.reshape(T, 2, 8).transpose(0, 1)[None]  # (1,2,T,8)
    t = torch.arange(T)
    band = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - window)  # (T, T)
    eye = torch.eye(T, dtype=torch.float64).expand(1, 2, T, T)  # v = I makes the output the weights
    want = F.scaled_dot_product_attention(q, k, eye, attn_mask=band)  # (1, 2, T, T)
    np.testing.assert_allclose(got, want[0].numpy(), rtol=0, atol=1e-12)


def test_alibi_pattern_equals_sdpa_with_the_bias_as_float_mask():
    import torch
    import torch.nn.functional as F


    T, h = 8, 4
    got = viz.attention_maps(16, h, T, causal=True, pattern="alibi")
    mha, x = _module_inputs(h=h, T=T)
    q = torch.from_numpy(x[0] @ mha.Wq).reshape(T, h, 4).transpose(0, 1)[None]  # (1, h, T, d_k)
    k = torch.from_numpy(x[0] @ mha.Wk).reshape(T, h, 4).transpose(0, 1)[None]  # (1, h, T, d_k)
    bias = torch.as_tensor(posenc.alibi_bias(h, T))  # (h, T, T)
    bias = bias.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    eye = torch.eye(T, dtype=torch.float64).expand(1, h, T, T)
    want = F.scaled_dot_product_attention(q, k, eye, attn_mask=bias[None])  # (1, h, T, T)
    np.testing.assert_allclose(got, want[0].numpy(), rtol=0, atol=1e-12)
    # ALiBi favours recent keys: the last row puts more weight on the newest key than plain.
    plain = viz.attention_maps(16, h, T, causal=True)
    assert (got[:, -1, -1] > plain[:, -1, -1]).all()


def test_rope_pattern_uses_rotated_q_and_k():
    T, h = 6, 2
    got = viz.attention_maps(16, h, T, causal=False, pattern="rope")
    mha, x = _module_inputs(h=h, T=T)
    q = posenc.rope(steps.split_heads(x @ mha.Wq, h))  # (1, h, T, d_k)
    k = posenc.rope(steps.split_heads(x @ mha.Wk, h))  # (1, h, T, d_k)
    scores = np.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(8)  # (1, h, T, T)
    want = np.exp(scores - scores.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want[0], rtol=0, atol=1e-12)
    assert not np.allclose(got, viz.attention_maps(16, h, T, causal=False))  # RoPE did something


def test_attention_maps_rejects_unknown_pattern_and_odd_rope():
    with pytest.raises(ValueError, match=r"pattern must be one of .*'window'.*got 'band'"):
        viz.attention_maps(16, 4, 6, pattern="band")
    with pytest.raises(ValueError, match="even"):
        viz.attention_maps(16, 16, 6, pattern="rope")  # d_k = 1


def test_explorer_pattern_selector_changes_maps_and_caption(explorer):
    assert [v for _, v in explorer.controls["pattern"].options] == list(viz.PATTERNS)
    explorer.controls["causal"].value = True
    explorer.controls["pattern"].value = "padding"
    data = np.stack(_heatmaps(explorer.fig))
    np.testing.assert_array_equal(data, viz.attention_maps(16, 4, 6, True, pattern="padding"))
    assert np.all(data[:, -2:, :] == 0.0) and np.all(data[:, :, -2:] == 0.0)  # 2 of 6 are <pad>
    assert "changed: pattern none -> padding" in explorer.caption.value
    assert "the last 2 token(s) are &lt;pad&gt;" in explorer.caption.value  # escaped HTML
    # 4 real rows with 1-4 allowed keys: uniform entropy is the mean of log 1..log 4
    assert f"uniform over the allowed keys: {np.log([1, 2, 3, 4]).mean():.2f}" in explorer.caption.value
    explorer.controls["pattern"].value = "window"
    assert "sliding window: each query sees keys at most 2 positions away" in explorer.caption.value


def test_explorer_rope_with_odd_d_k_says_why_and_keeps_the_picture(explorer):
    explorer.controls["n_heads"].value = 16  # d_k = 1
    png = bytes(explorer.image.value)
    explorer.controls["pattern"].value = "rope"
    assert "cannot show this" in explorer.caption.value and "even" in explorer.caption.value
    assert bytes(explorer.image.value) == png
    explorer.controls["n_heads"].value = 4  # d_k = 4: RoPE works again
    assert "RoPE: q and k rotated" in explorer.caption.value
