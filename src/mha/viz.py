"""Pictures of attention: the pipeline diagram (and, later, heatmaps and the explorer)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from .numpy_mha import LedgerRow

PIPELINE = [
    ("1", "QKV projection", "x W + b"),
    ("2", "split heads", "reshape + transpose"),
    ("3", "scaled scores", "q k^T / sqrt(d_k)"),
    ("4", "causal mask", "-inf above diagonal"),
    ("5", "softmax", "rows sum to 1"),
    ("6", "weighted sum", "weights @ v"),
    ("7", "merge + project", "concat heads, W_o"),
]


def _shape_after(ledger: list[LedgerRow], number: str) -> str:
    """The shape of the last tensor a numbered step produced, or '' if it did not run."""
    rows = [r for r in ledger if r.step.startswith(number + " ")]
    return str(rows[-1].shape) if rows else "(skipped)"


def plot_pipeline(ledger: list[LedgerRow] | None = None, ax=None):
    """Draw the seven steps as a left-to-right flow, with shapes from a real `trace` if given."""
    if ax is None:
        _, ax = plt.subplots(figsize=(15, 2.4))
    n = len(PIPELINE)
    w, gap = 1.6, 0.45
    for i, (num, name, formula) in enumerate(PIPELINE):
        x0 = i * (w + gap)
        box = FancyBboxPatch((x0, 0), w, 1, boxstyle="round,pad=0.04",
                             fc="#e8f0fe" if num != "4" else "#fde8e8", ec="#3b5998")
        ax.add_patch(box)
        ax.text(x0 + w / 2, 0.78, f"{num}) {name}", ha="center", va="center", fontsize=9,
                weight="bold")
        ax.text(x0 + w / 2, 0.5, formula, ha="center", va="center", fontsize=8)
        if ledger is not None:
            ax.text(x0 + w / 2, 0.2, _shape_after(ledger, num), ha="center", va="center",
                    fontsize=8, family="monospace", color="#444")
        if i < n - 1:
            ax.add_patch(FancyArrowPatch((x0 + w + 0.04, 0.5), (x0 + w + gap - 0.04, 0.5),
                                         arrowstyle="-|>", mutation_scale=12, color="#3b5998"))
    if ledger is not None and ledger:
        ax.text(-0.15, 0.5, f"x\n{ledger[0].shape}", ha="right", va="center", fontsize=8,
                family="monospace")
    ax.set_xlim(-1.6, n * (w + gap))
    ax.set_ylim(-0.15, 1.15)
    ax.axis("off")
    ax.set_title("Multi-head attention in seven steps" +
                 (" (shapes from a real run)" if ledger is not None else ""))
    return ax
