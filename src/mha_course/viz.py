"""Pictures of attention: the pipeline diagram, heatmaps, and the slider explorer."""

from __future__ import annotations

import base64
import functools
import html
import io

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from mha import steps
from mha.attention import masks, posenc
from mha.ledger import LedgerRow
from mha.modules.numpy_mha import MultiHeadAttention
from mha.validate import require_heads, require_int, shape_of
from mha_course.i18n import _, use_cjk_font


def N_(message: str) -> str:
    """Mark a message for the catalogs where it is defined; `_()` translates it where it is drawn."""
    return message


PIPELINE = [
    ("1", N_("QKV projection"), "x W + b"),
    ("2", N_("split heads"), "reshape + transpose"),
    ("3", N_("scaled scores"), "q k^T / sqrt(d_k)"),
    ("4", N_("causal mask"), N_("-inf above diagonal")),
    ("5", "softmax", N_("rows sum to 1")),
    ("6", N_("weighted sum"), "weights @ v"),
    ("7", N_("merge + project"), N_("concat heads, W_o")),
]


def _shape_after(ledger: list[LedgerRow], number: str) -> str:
    """The shape of the last tensor a numbered step produced, or "(skipped)" if it did not run."""
    rows = [r for r in ledger if r.step.startswith(number + " ")]
    return str(rows[-1].shape) if rows else _("(skipped)")


def plot_pipeline(ledger: list[LedgerRow] | None = None, ax=None):
    """Draw the seven steps as a left-to-right flow, with shapes from a real `trace` if given."""
    use_cjk_font()
    if ax is None:
        ax = plt.subplots(figsize=(15, 2.4))[1]
    n = len(PIPELINE)
    w, gap = 1.9, 0.3  # box width and the arrow gap, in data units; labels must fit (tested)
    for i, (num, name, formula) in enumerate(PIPELINE):
        x0 = i * (w + gap)
        box = FancyBboxPatch((x0, 0), w, 1, boxstyle="round,pad=0.04",
                             fc="#e8f0fe" if num != "4" else "#fde8e8", ec="#3b5998")
        ax.add_patch(box)
        ax.text(x0 + w / 2, 0.78, f"{num}) {_(name)}", ha="center", va="center", fontsize=8,
                weight="bold")
        ax.text(x0 + w / 2, 0.5, _(formula), ha="center", va="center", fontsize=7.5)
        if ledger is not None:
            shape = _shape_after(ledger, num)
            # Shapes in monospace; a Chinese "(skipped)" in the sans-serif font (it has the glyphs)
            ax.text(x0 + w / 2, 0.2, shape, ha="center", va="center", fontsize=8,
                    family="monospace" if shape.isascii() else None, color="#444")
        if i < n - 1:
            ax.add_patch(FancyArrowPatch((x0 + w + 0.04, 0.5), (x0 + w + gap - 0.04, 0.5),
                                         arrowstyle="-|>", mutation_scale=12, color="#3b5998"))
    if ledger is not None and ledger:
        ax.text(-0.15, 0.5, f"x\n{ledger[0].shape}", ha="right", va="center", fontsize=8,
                family="monospace")
    ax.set_xlim(-1.2, n * (w + gap))
    ax.set_ylim(-0.15, 1.15)
    ax.axis("off")
    ax.set_title(_("Multi-head attention in seven steps") if ledger is None else
                 _("Multi-head attention in seven steps (shapes from a real run)"))
    return ax


# Heatmaps ----------------------------------------------------------------------------
ATTN_CMAP = plt.get_cmap("Blues").with_extremes(bad="#c8c8c8")
"""Weights in blue; exact zeros (masked keys) in grey, so they never pass for tiny weights."""


def _zeros_grey(w: np.ndarray) -> np.ma.MaskedArray:
    """w with its exact zeros masked: the colour map draws them in its 'bad' grey."""
    return np.ma.masked_equal(w, 0.0)


def _tick_step(n: int, most: int = 10) -> int:
    """Label every k-th row/column so at most `most` labels show (readable up to any T)."""
    return max(1, -(-n // most))


def _set_ticks(ax, T: int, S: int, labels: list[str] | None = None) -> None:
    """Tick labels for a (T, S) heatmap, thinned to stay readable."""
    labels = labels or [str(i) for i in range(max(T, S))]
    xs, ys = range(0, S, _tick_step(S)), range(0, T, _tick_step(T))
    ax.set_xticks(list(xs), [labels[i] for i in xs])
    ax.set_yticks(list(ys), [labels[i] for i in ys])


def plot_attention(weights_2d, ax=None, title: str | None = None, tokens=None,
                   annotate: bool = False, colorbar: bool = False):
    """Heatmap of one (T, S) attention matrix: rows are queries, columns are keys."""
    w = np.asarray(weights_2d)
    if w.ndim != 2:
        raise ValueError(f"weights_2d must be (T, S), got {shape_of(w)}")
    if tokens is not None and len(tokens) != max(w.shape):
        raise ValueError(f"tokens must have {max(w.shape)} labels for a {w.shape} matrix, "
                         f"got {len(tokens)}")
    use_cjk_font()
    if ax is None:
        ax = plt.subplots(figsize=(3.6, 3.2))[1]
    T, S = w.shape  # (T, S)
    im = ax.imshow(_zeros_grey(w), cmap=ATTN_CMAP, vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xlabel(_("key s"))
    ax.set_ylabel(_("query t"))
    if tokens is not None:
        ax.set_xticks(range(S), list(tokens)[:S], rotation=90)
        ax.set_yticks(range(T), list(tokens)[:T])
    else:
        _set_ticks(ax, T, S)
    if annotate:
        for t in range(T):
            for s in range(S):
                ax.text(s, t, f"{w[t, s]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if w[t, s] > 0.6 else "black")
    if title is not None:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label=_("weight (grey: exactly 0)"))
    return ax


def _grid(h: int) -> tuple[int, int]:
    """Rows and columns for h small heatmaps: at most 4 per row."""
    ncols = min(h, 4)
    return -(-h // ncols), ncols


def plot_heads(weights, tokens=None, fig=None, suptitle: str | None = None,
               ticks: bool = True, colorbar: bool = True):
    """One heatmap per head of (h, T, S) attention weights, in a grid; returns the figure.

    One shared colour bar (0 to 1) reads for every head; exact zeros are grey.
    """
    w = np.asarray(weights)
    if w.ndim == 4 and w.shape[0] == 1:
        w = w[0]  # (1, h, T, S) -> (h, T, S)
    if w.ndim != 3:
        raise ValueError(f"weights must be (h, T, S) or (1, h, T, S), got {shape_of(weights)}")
    h = w.shape[0]
    nrows, ncols = _grid(h)
    use_cjk_font()
    if fig is None:
        fig = plt.figure(figsize=(2.4 * ncols + 0.6, 2.3 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for j, ax in enumerate(axes.flat):
        if j >= h:
            ax.set_visible(False)
            continue
        plot_attention(w[j], ax=ax, title=_("head {j}").format(j=j), tokens=tokens)
        if not ticks:
            ax.set_xticks([])
            ax.set_yticks([])
        if j % ncols:
            ax.set_ylabel("")
        if j < h - ncols:
            ax.set_xlabel("")
    if colorbar:
        shown = [ax for ax in axes.flat if ax.get_visible()]
        fig.colorbar(shown[0].images[0], ax=list(axes.flat), shrink=0.8 if nrows > 1 else 1.0,
                     label=_("weight (grey: exactly 0)"))
    if suptitle is not None:
        fig.suptitle(suptitle)
    return fig


# The attention explorer: pure functions first, widgets on top --------------------------
def divisors(n: int) -> list[int]:
    """All h with n % h == 0, smallest first: the head counts a d_model allows."""
    n = require_int("n", n)
    return [h for h in range(1, n + 1) if n % h == 0]


# The explorer's mask / bias selector: what each pattern does, in one line.
PATTERNS = {
    "none": N_("no extra mask or bias"),
    "window": N_("sliding window: each query sees keys at most {w_1} positions away (itself too)"),
    "padding": N_("padding: the last {pad} token(s) are <pad>; no query sees them and their rows are 0"),
    "alibi": N_("ALiBi: a per-head penalty, slope x distance, added to the scores (recent keys win)"),
    "rope": N_("RoPE: q and k rotated by their positions before the scores (relative positions)"),
}


PATTERN_OPTIONS = [(N_("none"), "none"), (N_("sliding window"), "window"), (N_("padding"), "padding"),
                   ("ALiBi", "alibi"), ("RoPE", "rope")]
"""The mask / bias selector's entries: (label, pattern); the labels are translated where shown."""


def padded(T: int) -> int:
    """How many trailing tokens the explorer's padding pattern marks as <pad>: about a third."""
    return max(1, T // 3)


def explorer_mask(T: int, causal: bool, pattern: str = "none", window: int = 3) -> np.ndarray | None:
    """The boolean (T, T) mask (True = may attend) of the explorer's settings; None = no mask."""
    allowed = steps.causal_mask(T) if causal else None  # (T, T) staircase
    extra = None
    if pattern == "window":  # |t - s| < window; with causal on only the band's past half stays
        band = masks.sliding_window_mask(T, window)  # (T, T): s in (t - window, t]
        extra = band | band.T  # (T, T): symmetric band
    elif pattern == "padding":
        extra = masks.padding_mask([T - padded(T)], T)[0, 0]  # (T, T): real query -> real key
    if extra is None:
        return allowed
    return extra if allowed is None else masks.combine(allowed, extra)


def attention_maps(d_model: int = 16, n_heads: int = 4, T: int = 6, causal: bool = True,
                   temperature: float = 1.0, seed: int = 0, pattern: str = "none",
                   window: int = 3) -> np.ndarray:
    """Attention weights (h, T, T) of a seeded random module on seeded random tokens.

    temperature divides the scaled scores before softmax: softmax(q k^T / sqrt(d_k) / temp).
    Below 1 it sharpens every row, above 1 it flattens it; masked weights stay exactly 0.
    Tokens come from one seeded stream, so a longer T keeps the earlier tokens unchanged;
    the projection weights do not depend on n_heads, so changing h regroups the same columns.
    `pattern` adds one mask or bias from PATTERNS, composed with `causal` (a sliding window
    with causal on is the usual causal band of `window` keys, the query's own included).
    """
    require_heads(d_model, n_heads)
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {sorted(PATTERNS)}, got {pattern!r}")
    T = require_int("T", T)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | np.floating):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    Wq, Wk = _projections(d_model, seed)
    x = np.random.default_rng(seed).normal(0.0, 1.0, (1, T, d_model))  # (1, T, d_model)
    zeros = np.zeros(d_model)
    q = steps.split_heads(steps.linear(x, Wq, zeros), n_heads)  # (1, h, T, d_k)
    k = steps.split_heads(steps.linear(x, Wk, zeros), n_heads)  # (1, h, T, d_k)
    if pattern == "rope":  # rotate q and k by their positions (needs an even d_k)
        q, k = posenc.rope(q), posenc.rope(k)  # (1, h, T, d_k) each
    scores = steps.scaled_scores(q, k) / float(temperature)  # (1, h, T, T)
    if pattern == "alibi":
        scores = scores + posenc.alibi_bias(n_heads, T)[None]  # (1, h, T, T) + (1, h, T, T)
    allowed = explorer_mask(T, causal, pattern, window)  # None or (T, T)
    if allowed is not None:
        scores = steps.apply_mask(scores, allowed)  # (1, h, T, T), -inf where not allowed
    weights = steps.softmax(scores)  # (1, h, T, T)
    return weights[0]  # (h, T, T)


@functools.lru_cache(maxsize=8)
def _projections(d_model: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Wq and Wk of MultiHeadAttention(d_model, 1, seed): the same for every head count."""
    m = MultiHeadAttention(d_model, 1, seed=seed)
    return m.Wq, m.Wk


def row_entropy(weights) -> np.ndarray:
    """Entropy in nats of each attention row (last axis); 0 * log 0 counts as 0."""
    w = np.asarray(weights, dtype=np.float64)
    logs = np.log(w, out=np.zeros_like(w), where=w > 0)
    return -(w * logs).sum(axis=-1)


def describe(maps, causal: bool, temperature: float, pattern: str = "none",
             window: int = 3) -> str:
    """One sentence on what (h, T, T) maps show: exact zeros per head, and how peaked rows are."""
    w = np.asarray(maps)
    if w.ndim != 3:
        raise ValueError(f"maps must be (h, T, S), got {shape_of(w)}")
    h, T, S = w.shape
    zeros = (w == 0.0).sum(axis=(1, 2))  # (h,): exact zeros per head
    lo, hi = int(zeros.min()), int(zeros.max())
    count = str(lo) if lo == hi else f"{lo}-{hi}"
    # Entropies average over rows that may attend somewhere (a padded query's row is all 0);
    # uniform rows would have log(number of allowed keys).
    allowed = explorer_mask(T, causal, pattern, window) if T == S else None
    n_allowed = np.full(T, S) if allowed is None else allowed.sum(axis=-1)  # (T,)
    live = n_allowed > 0
    ent = float(row_entropy(w)[:, live].mean())
    uniform = float(np.log(n_allowed[live]).mean())
    text = (_("causal on: {count} of {total} weights per head are exactly 0; temperature "
              "{temperature:.3g}: mean row entropy over {h} head(s) {ent:.2f} nats (uniform over "
              "the allowed keys: {uniform:.2f}, one-hot: 0)") if causal else
            _("causal off: {count} of {total} weights per head are exactly 0; temperature "
              "{temperature:.3g}: mean row entropy over {h} head(s) {ent:.2f} nats (uniform over "
              "the allowed keys: {uniform:.2f}, one-hot: 0)"))
    text = text.format(count=count, total=T * S, temperature=temperature, h=h, ent=ent,
                       uniform=uniform)
    if pattern != "none":
        text = _("{text}. {pattern}").format(
            text=text, pattern=_(PATTERNS[pattern]).format(w_1=window - 1, pad=padded(T)))
    return text


def what_changed(old: dict, new: dict) -> str:
    """Name the settings that differ between two explorer states, e.g. 'T 6 -> 8'."""
    def fmt(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    diffs = [f"{k} {fmt(old[k])} -> {fmt(new[k])}" for k in new if k in old and old[k] != new[k]]
    return _("changed: {diffs}").format(diffs=", ".join(diffs)) if diffs else _("initial view")


class _HeatmapView:
    """One laid-out figure of the explorer: its heatmaps and the pixels behind them."""

    def __init__(self, shown: np.ndarray, s: dict, dpi: int):
        use_cjk_font()
        self.fig = Figure(dpi=dpi, layout="constrained")
        FigureCanvasAgg(self.fig)
        n = shown.shape[0]  # shown: (n, T, T)
        self.ticks = s["head"] >= 0 or n <= 8  # a 16-head grid stays readable without ticks
        if s["head"] < 0:
            nrows, ncols = _grid(n)
            self.fig.set_size_inches(2.1 * ncols + 0.5, 2.0 * nrows + 0.3)
            plot_heads(shown, fig=self.fig, ticks=self.ticks)
        else:
            self.fig.set_size_inches(4.6, 3.8)
            plot_attention(shown[0], ax=self.fig.add_subplot(), colorbar=True,
                           title=_("head {j} of {h}").format(j=s["head"], h=s["n_heads"]))
        self.images = [ax.images[0] for ax in self.fig.axes if ax.images]
        # Blitting: draw everything except the heatmaps once (text is the slow part) and
        # keep those pixels; each redraw pastes them back and draws only the heatmaps.
        for im in self.images:
            im.set_animated(True)
        self._snapshot()  # lays the axes out once for this view ...
        self.fig.set_layout_engine("none")  # ... then freezes them

    def _snapshot(self) -> None:
        """Full draw without the heatmaps; keep its pixels as the blitting background."""
        self.fig.canvas.draw()
        self.background = self.fig.canvas.copy_from_bbox(self.fig.bbox)

    def update(self, shown: np.ndarray) -> None:
        """New numbers into the same axes; a new T also needs new extents, ticks, background."""
        resized = self.images[0].get_array().shape != shown.shape[1:]
        for im, w in zip(self.images, shown, strict=True):
            im.set_data(_zeros_grey(w))  # (T, T): same axes, new numbers, zeros grey
            if resized:
                T = w.shape[0]
                im.set_extent((-0.5, T - 0.5, T - 0.5, -0.5))
                if self.ticks:
                    _set_ticks(im.axes, T, T)
        if resized:
            self._snapshot()

    def png(self) -> bytes:
        """Paste the saved background, draw the heatmaps (and their frames), encode PNG."""
        from PIL import Image

        canvas = self.fig.canvas
        canvas.restore_region(self.background)
        for im in self.images:
            im.axes.draw_artist(im)
            for spine in im.axes.spines.values():
                im.axes.draw_artist(spine)
        buf = io.BytesIO()
        Image.fromarray(np.asarray(canvas.buffer_rgba())).save(buf, format="png",
                                                               compress_level=1)
        return buf.getvalue()


def display_with_png_fallback(widget, image, text: str) -> None:
    """Display a widget whose picture is `image` (an ipywidgets.Image), so that viewers
    without a widget manager (GitHub, nbviewer) still show that picture and `text`."""
    from IPython.display import display

    bundle = widget._repr_mimebundle_()
    if not bundle:
        display(widget)
        return
    bundle["image/png"] = base64.b64encode(bytes(image.value)).decode("ascii")
    bundle["text/plain"] = text
    display(bundle, raw=True)


class AttentionExplorer:
    """Sliders over live attention heatmaps; display it (or its `.widget`) in Jupyter.

    Works with the plain inline backend: each view (number of heads, grid or one head)
    is a private Agg `Figure`, laid out once and kept (the last few are cached); a slider
    move only puts new numbers into its heatmaps with `set_data`, redraws their pixels
    and sends a PNG to an `ipywidgets.Image`. Controls live in `.controls` (causal,
    n_heads, T, temperature, head, and pattern: the mask / bias selector of PATTERNS);
    `.fig` is the figure on screen; the sentence under the plot is `.caption.value`.
    """

    def __init__(self, d_model: int = 16, n_heads: int = 4, T: int = 6, causal: bool = True,
                 temperature: float = 1.0, seed: int = 0, max_T: int = 16, dpi: int = 80,
                 cached_views: int = 6, pattern: str = "none", window: int = 3):
        import ipywidgets as widgets

        require_heads(d_model, n_heads)
        max_T = require_int("max_T", max_T, minimum=2)
        if not 2 <= require_int("T", T) <= max_T:
            raise ValueError(f"T must be in [2, max_T={max_T}], got {T}")
        if not 0.1 <= temperature <= 10.0:
            raise ValueError(f"temperature must be in [0.1, 10] (the slider range), got {temperature}")
        if pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {sorted(PATTERNS)}, got {pattern!r}")
        self.d_model, self.seed, self.dpi = d_model, seed, dpi
        self.window = require_int("window", window)
        self.cached_views = require_int("cached_views", cached_views)
        self.controls = {
            "causal": widgets.Checkbox(value=causal, description=_("causal mask")),
            "n_heads": widgets.SelectionSlider(options=divisors(d_model), value=n_heads,
                                               description=_("heads h")),
            "T": widgets.IntSlider(value=T, min=2, max=max_T, description=_("length T")),
            "temperature": widgets.FloatLogSlider(value=temperature, base=10, min=-1, max=1,
                                                  step=0.05, description=_("temperature"),
                                                  readout_format=".2f"),
            "head": widgets.Dropdown(options=self._head_options(n_heads), value=-1,
                                     description=_("show")),
            "pattern": widgets.Dropdown(options=[(_(label), p) for label, p in PATTERN_OPTIONS],
                                        value=pattern, description=_("mask / bias")),
        }
        self.image = widgets.Image(format="png")
        self.caption = widgets.HTML()
        self.maps: np.ndarray | None = None
        self._views: dict[tuple, _HeatmapView] = {}  # insertion order = least recently used first
        self._view: _HeatmapView | None = None
        self._state: dict | None = None
        self._busy = False
        for c in self.controls.values():
            c.style.description_width = "initial"  # show the whole label, e.g. "temperature"
            c.observe(self._on_change, names="value")
        c = self.controls
        self.widget = widgets.VBox([
            widgets.HBox([c["causal"], c["n_heads"], c["head"]]),
            widgets.HBox([c["T"], c["temperature"], c["pattern"]]),
            self.image,
            self.caption,
        ])
        self.redraw()

    @property
    def fig(self) -> Figure:
        """The figure currently on screen."""
        return self._view.fig

    @staticmethod
    def _head_options(h: int) -> list[tuple[str, int]]:
        """Dropdown entries: all heads in a grid (-1), or one head by index."""
        return [(_("all heads"), -1)] + [(_("head {j}").format(j=j), j) for j in range(h)]

    def state(self) -> dict:
        """The current settings as a plain dict."""
        return {name: c.value for name, c in self.controls.items()}

    def _on_change(self, change) -> None:
        if self._busy:
            return
        self._busy = True
        try:
            head = self.controls["head"]
            h = self.controls["n_heads"].value
            if len(head.options) != h + 1:  # heads changed: rebuild the head list
                keep = head.value if head.value < h else -1
                head.options = self._head_options(h)
                head.value = keep
        finally:
            self._busy = False
        self.redraw()

    def redraw(self) -> None:
        """Recompute the maps from the controls, update the heatmaps and the caption."""
        s = self.state()
        try:
            maps = attention_maps(self.d_model, s["n_heads"], s["T"], s["causal"],
                                  s["temperature"], self.seed, s["pattern"], self.window)
        except ValueError as err:  # e.g. RoPE with an odd d_k: say why, keep the old picture
            self.caption.value = ("<b style='color:#b00'>" + html.escape(
                _("cannot show this: {error}").format(error=err)) + "</b>")
            return
        self.maps = maps  # (h, T, T)
        shown = self.maps if s["head"] < 0 else self.maps[s["head"]][None]  # (h or 1, T, T)
        key = (s["n_heads"], s["head"], s["head"] >= 0 or s["T"] <= 8)
        view = self._views.pop(key, None)
        if view is None:  # first visit of this view: lay out new axes
            view = _HeatmapView(shown, s, self.dpi)
        else:
            view.update(shown)
        self._views[key] = view  # most recently used last
        while len(self._views) > self.cached_views:
            self._views.pop(next(iter(self._views)))
        self._view = view
        self.image.value = view.png()
        shown_state = {**s, "head": _("all") if s["head"] < 0 else s["head"]}
        old, self._state = self._state, shown_state
        changed = _("initial view") if old is None else what_changed(old, shown_state)
        self.caption.value = _("{changed}. {description}").format(
            changed=f"<b>{changed}</b>", description=html.escape(describe(
                self.maps, s["causal"], s["temperature"], s["pattern"], self.window)))

    def _ipython_display_(self) -> None:
        """Show the live widget; static viewers (GitHub) fall back to the current PNG."""
        display_with_png_fallback(self.widget, self.image, _(
            "attention explorer (run the notebook in Jupyter to move the sliders)"))


def explorer(**kwargs) -> AttentionExplorer:
    """Build the attention explorer (see AttentionExplorer for the settings)."""
    return AttentionExplorer(**kwargs)
