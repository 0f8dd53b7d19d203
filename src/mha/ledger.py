"""The shape ledger: which step made which tensor, and its shape, from a real forward pass.

Kept out of the modules on purpose, so their `forward` reads as the seven steps and
nothing else. `recording(owner, labels)` wraps the step functions a forward pass calls
(`mha.steps.linear`, ...) for the length of a `with` block and writes one row per call;
`trace` on each module is that block around one ordinary forward pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Label = tuple[str, str, str]  # (step, tensor, symbolic shape)
Labels = Label | list[Label]  # a list: one label per tensor of a function returning a tuple


@dataclass(frozen=True)
class LedgerRow:
    """One line of the shape ledger: which step made which tensor, and its shape."""

    step: str
    tensor: str
    symbol: str
    shape: tuple[int, ...]


def input_rows(x: Any, context: Any = None) -> list[LedgerRow]:
    """The ledger's first rows: the input x, and the context when attending to another sequence."""
    rows = [LedgerRow("input", "x", "(B, T, d_model)", tuple(int(s) for s in x.shape))]
    if context is not None:
        rows.append(LedgerRow("input", "context", "(B, S, d_model)",
                              tuple(int(s) for s in context.shape)))
    return rows


@contextmanager
def recording(owner: Any, labels: Mapping[str, Sequence[Labels]]) -> Iterator[list[LedgerRow]]:
    """Within the block, each call of `owner.<name>` (a name in `labels`) adds a LedgerRow.

    `labels[name]` gives the row for the 1st, 2nd, ... call of that function (the last
    label repeats if there are more calls); a list of labels for a call of a function
    that returns a tuple gives one row per tensor. The functions are restored on exit, even if
    the block raises.
    """
    rows: list[LedgerRow] = []
    calls: Counter[str] = Counter()
    saved = {name: getattr(owner, name) for name in labels}

    def recorded(name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            label = labels[name][min(calls[name], len(labels[name]) - 1)]
            calls[name] += 1
            # A function that returns several tensors has one label per tensor.
            pairs = zip(label, out, strict=True) if isinstance(label, list) else [(label, out)]
            for (step, tensor, symbol), value in pairs:
                rows.append(LedgerRow(step, tensor, symbol, tuple(int(s) for s in value.shape)))
            return out
        return call

    try:
        for name, fn in saved.items():
            setattr(owner, name, recorded(name, fn))
        yield rows
    finally:
        for name, fn in saved.items():
            setattr(owner, name, fn)


def format_ledger(rows: list[LedgerRow]) -> str:
    """Render a shape ledger as an aligned text table."""
    header = ("step", "tensor", "symbolic shape", "shape")
    table = [header] + [(r.step, r.tensor, r.symbol, str(r.shape)) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
