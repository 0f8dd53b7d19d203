"""Pictures of serving: a block pool's tables (logical blocks -> physical blocks) and a scheduler's
timeline (which request runs at each step, and how)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from mha_course.i18n import _, use_cjk_font


def N_(message: str) -> str:
    """Mark a message for the catalogs where it is defined; `_()` translates it where it is drawn."""
    return message


EMPTY_SLOT = -1
"""The position a pool writes in an unused slot (mha.inference.kv_cache.EMPTY)."""

STATES = (N_("not arrived"), N_("waiting"), N_("prefill chunk"), N_("decode"), N_("preempted"),
          N_("done"))
"""What a request does at one step of the timeline, in the order of COLOURS (the legend translates
them; the codes of `timeline_states` index this English tuple)."""
COLOURS = ("#ffffff", "#e8e8e8", "#f0a35e", "#3b75af", "#d62728", "#9e9e9e")


def block_fill(pool: Any) -> np.ndarray:
    """(N,) tokens each physical block holds: its slots whose position is not EMPTY."""
    positions = pool.positions
    if hasattr(positions, "detach"):  # a TorchBlockPool keeps its positions on the device
        positions = positions.detach().cpu().numpy()
    return (np.asarray(positions) != EMPTY_SLOT).sum(axis=1)  # (N, bs) -> (N,)


def plot_pool(pool: Any, ax=None, title: str | None = None,
              names: Mapping[Hashable, str] | None = None):
    """The block tables of every sequence in the pool, drawn as arrows from each sequence's logical
    blocks (top row, one group per sequence) to the physical blocks of the pool (bottom row).

    A physical block shows its number, its refcount and how many of its slots hold a token (the
    shaded part); shared blocks (refcount > 1) are orange, free ones white.
    """
    tables = dict(pool.tables)
    refcounts = np.asarray(pool.refcounts)  # (N,)
    fill = block_fill(pool)  # (N,)
    N, bs = len(refcounts), int(pool.block_size)
    gap = 0.7
    starts, x = [], 0.0
    for table in tables.values():  # each sequence's logical blocks side by side, a gap between
        starts.append(x)
        x += max(len(table), 1) + gap
    width = max(N, x - gap)
    use_cjk_font()
    if ax is None:
        ax = plt.subplots(figsize=(max(6.0, 0.75 * width + 2.5), 2.6), layout="constrained")[1]
    y = 1.9  # the logical row
    for (seq, table), x0 in zip(tables.items(), starts, strict=True):
        label = (names or {}).get(seq, str(seq))
        ax.text(x0 + 0.45 * max(len(table), 1), y + 0.85, label, ha="center", va="bottom", fontsize=9)
        if not table:
            ax.text(x0 + 0.45, y + 0.3, _("(no blocks)"), ha="center", va="center", fontsize=7)
        for i, b in enumerate(table):
            ax.add_patch(Rectangle((x0 + i, y), 0.9, 0.6, facecolor="#f4f4f4", edgecolor="0.3",
                                   zorder=2))
            ax.text(x0 + i + 0.45, y + 0.3, f"L{i}", ha="center", va="center", fontsize=8, zorder=3)
            ax.add_patch(FancyArrowPatch((x0 + i + 0.45, y), (b + 0.45, 0.9), arrowstyle="-|>",
                                         mutation_scale=8, lw=0.8, zorder=1,
                                         color="#c46f1f" if refcounts[b] > 1 else "0.35"))
    for b in range(N):  # the pool: one box per physical block, shaded by its fill
        colour = "#f6c48f" if refcounts[b] > 1 else "#a9c6e3"
        ax.add_patch(Rectangle((b, 0), 0.9, 0.9, facecolor="white", edgecolor="0.3", zorder=2))
        if refcounts[b] > 0:
            ax.add_patch(Rectangle((b, 0), 0.9 * fill[b] / bs, 0.9, facecolor=colour, lw=0, zorder=2))
        ax.text(b + 0.45, 0.62, f"{b}", ha="center", va="center", fontsize=9, weight="bold", zorder=3)
        ax.text(b + 0.45, 0.28, _("ref {refcount}\n{fill}/{size}").format(
                    refcount=refcounts[b], fill=fill[b], size=bs) if refcounts[b] else _("free"),
                ha="center", va="center", fontsize=7, zorder=3)
    ax.text(-0.15, 0.45, _("pool"), ha="right", va="center", fontsize=8, color="0.3")
    ax.text(-0.15, y + 0.3, _("tables"), ha="right", va="center", fontsize=8, color="0.3")
    ax.set_xlim(-1.0, width + 0.1)
    ax.set_ylim(-0.1, y + 1.25)
    ax.set_axis_off()
    if title is not None:
        ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(facecolor="#a9c6e3", edgecolor="0.3", label=_("held by one table")),
                       Patch(facecolor="#f6c48f", edgecolor="0.3", label=_("shared (refcount > 1)")),
                       Patch(facecolor="white", edgecolor="0.3", label=_("free"))],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return ax


def timeline_states(timeline: Sequence[Any], arrivals: Mapping[int, int]) -> tuple[np.ndarray, list[int], list[int]]:
    """(R, steps) state codes (indices into STATES), the request ids (rows), the steps (columns).

    Read from the scheduler's own StepRecords: prefilled (rid, start, stop), decoded, preempted,
    retired; a request is waiting from its arrival until it runs, done after it retires.
    """
    rids = sorted(arrivals)
    steps = [rec.step for rec in timeline]
    first, last = (min(steps), max(steps)) if steps else (0, -1)
    cols = list(range(first, last + 1))
    state = np.zeros((len(rids), len(cols)), dtype=int)  # (R, steps): 0 = not arrived
    row = {rid: i for i, rid in enumerate(rids)}
    for rid, i in row.items():
        state[i, [c - first >= 0 and c >= arrivals[rid] for c in cols]] = STATES.index("waiting")
    for rec in timeline:
        c = rec.step - first
        for rid, _start, _stop in rec.prefilled:
            state[row[rid], c] = STATES.index("prefill chunk")
        for rid in rec.decoded:
            state[row[rid], c] = STATES.index("decode")
        for rid in rec.preempted:
            state[row[rid], c] = STATES.index("preempted")
        for rid in rec.retired:
            state[row[rid], c + 1:] = STATES.index("done")
    return state, rids, cols


def plot_timeline(timeline: Sequence[Any], arrivals: Mapping[int, int], title: str | None = None,
                  fig=None):
    """Which request runs at each step, and how (a grid of requests x steps), over the blocks in use.

    arrivals: {rid: the step it arrives at}. Prefill chunks are labelled with the tokens they feed.
    """
    state, rids, cols = timeline_states(timeline, arrivals)
    use_cjk_font()
    if fig is None:
        fig = plt.figure(figsize=(max(6.5, 0.28 * len(cols) + 2), 1.6 + 0.32 * len(rids)),
                         layout="constrained")
    top, grid = fig.subplots(2, 1, sharex=True, height_ratios=[1, max(2, 0.45 * len(rids))])
    first = cols[0] if cols else 0
    used = {rec.step: rec.blocks_in_use for rec in timeline}
    top.bar([c for c in cols if c in used], [used[c] for c in cols if c in used], width=0.8,
            color="0.55")
    top.set_ylabel(_("blocks\nin use"), fontsize=8)
    top.tick_params(labelsize=7)
    grid.imshow(state, cmap=ListedColormap(COLOURS), vmin=0, vmax=len(STATES) - 1, aspect="auto",
                interpolation="nearest", extent=(first - 0.5, first + len(cols) - 0.5,
                                                 len(rids) - 0.5, -0.5))
    row = {rid: i for i, rid in enumerate(rids)}
    for rec in timeline:
        for rid, start, stop in rec.prefilled:
            grid.text(rec.step, row[rid], f"{stop - start}", ha="center", va="center", fontsize=6)
    grid.set_yticks(range(len(rids)), [_("request {rid}").format(rid=r) for r in rids], fontsize=8)
    grid.set_xlabel(_("scheduler step"))
    grid.set_xticks(np.arange(first - 0.5, first + len(cols)), minor=True)
    grid.set_yticks(np.arange(-0.5, len(rids)), minor=True)
    grid.grid(which="minor", color="white", lw=0.6)
    grid.tick_params(which="minor", length=0)
    grid.legend(handles=[Patch(facecolor=c, edgecolor="0.5", label=_(s))
                         for s, c in zip(STATES, COLOURS, strict=True)],
                loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(rids) > 4 else -0.45),
                ncol=len(STATES), fontsize=7, frameon=False)
    if title is not None:
        top.set_title(title, fontsize=10)
    return fig
