"""Pictures of training: the Transformer block, loss curves, and a slider over training steps.

`TrainingScrubber(history)` shows the attention maps a `mha.training.train.History` recorded at one
training step next to the loss curve with a marker at that step; its slider moves through
the snapshots so a student watches the maps sharpen. Heatmaps come from
`mha_course.viz.plot_heads`, so they read like every other map in the course (exact zeros grey).
"""

from __future__ import annotations

import html
import io

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from mha.training.train import History
from mha.validate import require_int
from mha_course.i18n import _, use_cjk_font
from mha_course.viz import N_, display_with_png_fallback, plot_heads


# ---- the block --------------------------------------------------------------------------------
def plot_block(ax=None):
    """Draw a pre-LN Transformer block: x -> LN -> MHA -> (+) -> LN -> MLP -> (+), with the skips."""
    use_cjk_font()
    if ax is None:
        ax = plt.subplots(figsize=(10, 2.4))[1]
    w, hgt, r = 1.3, 0.8, 0.25  # box width and height, radius of a (+), in data units
    parts = [("x", 0.0), ("LayerNorm", 1.8), (N_("multi-head\nattention"), 3.6), ("+", 5.2),
             ("LayerNorm", 6.8), ("MLP\nd -> 4d -> d", 8.6), ("+", 10.2), ("out", 11.6)]
    colours = {"LayerNorm": "#f3f3f3", "multi-head\nattention": "#e8f0fe",
               "MLP\nd -> 4d -> d": "#eaf6ea"}
    half = []  # how far each part reaches left and right of its centre, for the arrows
    for name, xc in parts:
        if name == "+":  # a residual addition
            ax.add_patch(plt.Circle((xc, 0), r, fc="white", ec="#3b5998"))
            ax.text(xc, 0, "+", ha="center", va="center", fontsize=12, weight="bold")
            half.append(r)
        elif name in ("x", "out"):
            ax.text(xc, 0, f"{name}\n(B, T, d_model)", ha="center", va="center", fontsize=8,
                    family="monospace")
            half.append(0.75)
        else:
            ax.add_patch(FancyBboxPatch((xc - w / 2, -hgt / 2), w, hgt, fc=colours[name],
                                        ec="#3b5998", boxstyle="round,pad=0.04"))
            ax.text(xc, 0, _(name), ha="center", va="center", fontsize=8)
            half.append(w / 2 + 0.05)
    for (_a, a), ha, (_b, b), hb in zip(parts, half, parts[1:], half[1:], strict=False):
        ax.add_patch(FancyArrowPatch((a + ha, 0), (b - hb, 0), arrowstyle="-|>",
                                     mutation_scale=10, color="#3b5998"))
    for start, plus, label in ((0.85, 5.2, "x + MHA(LN(x))"), (6.0, 10.2, "h + MLP(LN(h))")):
        # the residual skip: from the stream before the sub-layer straight into its (+)
        ax.plot([start, start, plus, plus], [0, 0.85, 0.85, r], color="#c0392b", lw=1.2)
        ax.add_patch(FancyArrowPatch((plus, 0.5), (plus, r), arrowstyle="-|>",
                                     mutation_scale=10, color="#c0392b"))
        ax.text((start + plus) / 2, 0.95, _("residual: {sum}").format(sum=label), ha="center",
                va="bottom", fontsize=8, color="#c0392b")
    ax.text(5.2, -0.45, "h", ha="center", va="top", fontsize=9, family="monospace")
    ax.set_xlim(-0.9, 12.5)
    ax.set_ylim(-0.7, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(_("One pre-LayerNorm Transformer block (our toy models switch the MLP off)"),
                 fontsize=10)
    return ax


# ---- training curves and snapshots ------------------------------------------------------------
def plot_curves(history: History, ax=None, step: int | None = None, label: str | None = None):
    """Training loss per step (log scale) and held-out accuracy; a marker at `step` if given."""
    use_cjk_font()
    if ax is None:
        ax = plt.subplots(figsize=(5, 3.2))[1]
    steps = np.arange(1, len(history.losses) + 1)
    ax.plot(steps, history.losses, color="#3b75af", lw=1, label=label or _("training loss"))
    ax.set(yscale="log", xlabel=_("training step"), ylabel=_("loss (cross-entropy)"))
    acc = ax.twinx()
    acc.plot(history.eval_steps, history.eval_acc, "o-", ms=3, color="#e07b39",
             label=_("held-out accuracy"))
    acc.set(ylim=(0, 1.05), ylabel=_("held-out accuracy"))
    if step is not None:
        ax.axvline(step, color="0.3", ls="--", lw=1)
    ax.set_title(_("{task}: loss and accuracy").format(task=history.task))
    return ax


def snapshot_maps(history: History, index: int, example: int = 0) -> tuple[np.ndarray, list[str]]:
    """The maps of snapshot `index` for one probe example: (L*h, T, S) and a title per map."""
    n = len(history.snapshots)
    if isinstance(index, bool) or not isinstance(index, int | np.integer) or not -n <= index < n:
        raise ValueError(f"index must be an int in [0, {n - 1}] (one of {n} snapshots), got {index!r}")
    layers = history.snapshots[index]  # L x (B_probe, h, T, S)
    B_probe = layers[0].shape[0]
    if isinstance(example, bool) or not isinstance(example, int) or not 0 <= example < B_probe:
        raise ValueError(f"example must be an int in [0, {B_probe - 1}], got {example!r}")
    maps = np.concatenate([w[example].numpy() for w in layers])  # (L*h, T, S)
    h = layers[0].shape[1]
    titles = [_("layer {layer} head {head}").format(layer=i // h, head=i % h)
              for i in range(maps.shape[0])]
    return maps, titles


def _marks_for(marks, n: int) -> list:
    """Check `marks`: None, or one entry per map panel (a (T,) sequence of keys, -1 = none, or None)."""
    if marks is None:
        return [None] * n
    marks = list(marks)
    if len(marks) != n:
        raise ValueError(f"marks must have one entry per map ({n}), got {len(marks)}")
    return [None if m is None else np.asarray(m) for m in marks]


def plot_snapshot(history: History, index: int, example: int = 0, fig=None, tokens=None,
                  colorbar: bool = True, marks=None):
    """Heatmaps of every layer and head at snapshot `index` (e.g. 0 = before, -1 = after).

    `marks` rings chosen cells: one (T,) array of key positions per map (-1 = no ring in that
    row), e.g. the key that holds each query's answer, so a reader sees where weight should go.
    """
    use_cjk_font()
    maps, titles = snapshot_maps(history, index, example)  # (L*h, T, S)
    fig = plot_heads(maps, tokens=tokens, fig=fig, colorbar=colorbar)
    axes = [a for a in fig.axes if a.images]
    for ax, title, keys in zip(axes, titles, _marks_for(marks, len(axes)), strict=True):
        ax.set_title(title, fontsize=9)
        if keys is not None:
            rows = np.flatnonzero(keys >= 0)  # queries that have a marked key
            ax.scatter(keys[rows], rows, s=40, facecolors="none", edgecolors="#d62728", lw=1)
    fig.suptitle(_("{task}: step {step}").format(task=history.task,
                                                  step=history.snapshot_steps[index]), fontsize=10)
    return fig


def plot_before_after(history: History, example: int = 0, tokens=None, marks=None):
    """The maps before training (step 0) and after it, side by side; returns the figure."""
    use_cjk_font()
    maps = snapshot_maps(history, 0, example)[0]
    n = maps.shape[0]
    fig = plt.figure(figsize=(min(4, n) * 2.3 * 2 + 1.0, 2.5 * -(-n // 4) + 0.5),
                     layout="constrained")
    left, right = fig.subfigures(1, 2)
    plot_snapshot(history, 0, example, fig=left, tokens=tokens, marks=marks)
    plot_snapshot(history, -1, example, fig=right, tokens=tokens, marks=marks)
    return fig


# ---- the scrubber widget ----------------------------------------------------------------------
class TrainingScrubber:
    """A slider over training steps: that step's attention maps and the loss curve marked at it.

    Pure parts first: `frame(i)` builds the figure of snapshot i, `caption_text(i)` its
    sentence; the widget (`.widget`: slider, image, caption) renders frames to PNG, caching
    each, so moving back and forth is instant. Displays as a PNG where widgets cannot run.
    `marks` rings the cells where the weight should end up (see plot_snapshot).
    """

    def __init__(self, history: History, example: int = 0, dpi: int = 72, marks=None):
        import ipywidgets as widgets

        if not history.snapshots:
            raise ValueError("history has no snapshots (train with snapshot_every set)")
        self.history = history
        self.example, self.marks = example, marks
        self.dpi = require_int("dpi", dpi)
        n_maps = snapshot_maps(history, 0, example)[0].shape[0]  # validates example early
        _marks_for(marks, n_maps)
        self.slider = widgets.SelectionSlider(
            options=[(str(s), i) for i, s in enumerate(history.snapshot_steps)], value=0,
            description=_("training step"), continuous_update=False,
            style={"description_width": "initial"}, layout={"width": "520px"})
        self.image = widgets.Image(format="png")
        self.caption = widgets.HTML()
        self._png: dict[int, bytes] = {}
        self.slider.observe(lambda change: self.show(change["new"]), names="value")
        self.widget = widgets.VBox([self.slider, self.image, self.caption])
        self.show(0)

    def frame(self, index: int) -> Figure:
        """The figure of snapshot `index`: its maps on the left, the curves on the right."""
        use_cjk_font()
        maps = snapshot_maps(self.history, index, self.example)[0]
        n = maps.shape[0]
        ncols = min(n, 4)
        fig = Figure(figsize=(2.3 * ncols + 4.6, 2.4 * -(-n // 4) + 0.6), dpi=self.dpi,
                     layout="constrained")
        FigureCanvasAgg(fig)
        left, right = fig.subfigures(1, 2, width_ratios=[2.3 * ncols + 0.6, 4.0])
        plot_snapshot(self.history, index, self.example, fig=left, marks=self.marks)
        plot_curves(self.history, ax=right.subplots(), step=self.history.snapshot_steps[index])
        return fig

    def caption_text(self, index: int) -> str:
        """One sentence: the step, the loss there and the last held-out accuracy at or before it."""
        h = self.history
        step = h.snapshot_steps[index]
        loss = (_("no step taken yet") if step == 0 else
                _("training loss {loss:.3f}").format(loss=h.losses[step - 1]))
        acc = [a for s, a in zip(h.eval_steps, h.eval_acc, strict=True) if s <= step][-1]
        return _("step {step} of {steps}: {loss}; held-out accuracy {accuracy:.3f} "
                 "(snapshot {snapshot} of {snapshots})").format(
            step=step, steps=len(h.losses), loss=loss, accuracy=acc, snapshot=index + 1,
            snapshots=len(h.snapshots))

    def png(self, index: int) -> bytes:
        """The PNG of snapshot `index`, drawn once and then cached."""
        if index not in self._png:
            buf = io.BytesIO()
            self.frame(index).savefig(buf, format="png")
            self._png[index] = buf.getvalue()
        return self._png[index]

    def show(self, index: int) -> None:
        """Put snapshot `index` on screen (the slider calls this)."""
        self.image.value = self.png(index)
        self.caption.value = html.escape(self.caption_text(index))

    def _ipython_display_(self) -> None:
        """Show the live widget; static viewers (GitHub) fall back to the current PNG."""
        display_with_png_fallback(self.widget, self.image, _(
            "training scrubber (run the notebook in Jupyter to move the slider)"))
