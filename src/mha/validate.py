"""Input checks for the public boundary: clear errors naming what was expected and what arrived.

Every public function in `mha` checks its inputs here first, so a learner sees
`ValueError: x must be (B, T, d_model=512), got (2, 6, 256)` instead of a numpy
broadcasting error from deep inside, or worse, a silently wrong answer.

The helpers look only at `.shape`, `.dtype` and `.ndim`, so numpy arrays and torch
tensors go through the same checks (the numpy and torch modules share them).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

Dim = int | None | tuple[str, int | None]
"""One expected dimension: an int, None (any size), or ("name", size-or-None)."""


def describe_shape(expected: Sequence[Dim]) -> str:
    """Render an expected shape the way errors print it: `(B, T, d_model=512)`."""
    parts = []
    for d in expected:
        if isinstance(d, tuple):
            name, size = d
            parts.append(name if size is None else f"{name}={size}")
        else:
            parts.append("*" if d is None else str(d))
    return "(" + ", ".join(parts) + ")"


def shape_of(x: Any) -> tuple[int, ...]:
    """Shape of an array or tensor as a plain tuple of ints."""
    return tuple(int(s) for s in x.shape)


def require_shape(name: str, x: Any, expected: Sequence[Dim]) -> None:
    """Raise ValueError unless x has len(expected) dims and every named size matches."""
    got = shape_of(x)
    ok = len(got) == len(expected)
    if ok:
        for g, d in zip(got, expected, strict=True):
            size = d[1] if isinstance(d, tuple) else d
            if size is not None and g != size:
                ok = False
                break
    if not ok:
        raise ValueError(f"{name} must be {describe_shape(expected)}, got {got}")


def require_int(name: str, value: Any, minimum: int = 1) -> int:
    """Return value as int if it is a whole number >= minimum, else raise."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def require_heads(d_model: int, n_heads: int) -> int:
    """Check d_model and n_heads and return d_k = d_model // n_heads."""
    d_model = require_int("d_model", d_model)
    n_heads = require_int("n_heads", n_heads)
    if d_model % n_heads:
        divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
        shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
        raise ValueError(
            f"d_model={d_model} must be divisible by n_heads={n_heads} "
            f"(d_k = d_model / n_heads must be a whole number); "
            f"n_heads could be one of {shown}"
        )
    return d_model // n_heads


def _is_float(x: Any) -> bool:
    dt = x.dtype
    if isinstance(dt, np.dtype):
        return bool(np.issubdtype(dt, np.floating))
    return bool(getattr(dt, "is_floating_point", False))  # torch.dtype


def require_float(name: str, x: Any) -> None:
    """Raise TypeError unless x holds floating-point numbers."""
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    if not _is_float(x):
        raise TypeError(
            f"{name} must be a floating-point array (float32 or float64), got dtype {x.dtype}"
        )


def require_bool(name: str, value: Any) -> bool:
    """value as a bool (numpy's too); anything else refused (a mask passed where `causal` goes)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}"
                        + (f" of shape {shape_of(value)} (a mask? pass it as mask=...)"
                           if hasattr(value, "shape") else f" {value!r}"))
    return bool(value)


def require_tensor(name: str, x: Any, what: str = "") -> None:
    """Raise TypeError unless x is a torch.Tensor (`what` names its expected shape)."""
    if not is_torch(x):
        hint = " (convert it with torch.from_numpy)" if isinstance(x, np.ndarray) else ""
        raise TypeError(f"{name} must be a torch.Tensor{' ' + what if what else ''}, got "
                        f"{type(x).__name__}{hint}")


def require_finite(name: str, x: Any) -> None:
    """Raise ValueError if x holds NaN or inf, saying how many and where the first is."""
    finite = np.isfinite(x) if isinstance(x, np.ndarray) else x.isfinite().cpu().numpy()
    if not finite.all():
        bad = np.argwhere(~finite)
        raise ValueError(
            f"{name} must be finite, got {len(bad)} NaN/inf value(s), "
            f"first at index {tuple(int(i) for i in bad[0])}"
        )


def require_tokens(name: str, x: Any, d_model: int) -> tuple[int, int]:
    """Check a (B, T, d_model) float input with T >= 1 and no NaN/inf; return (B, T)."""
    require_float(name, x)
    require_shape(name, x, (("B", None), ("T", None), ("d_model", d_model)))
    B, T, _ = shape_of(x)
    if B == 0 or T == 0:
        raise ValueError(f"{name} must have B >= 1 and T >= 1, got shape {shape_of(x)}")
    require_finite(name, x)
    return B, T


def require_query_and_context(x: Any, context: Any, d_model: int) -> tuple[int, int, int]:
    """Check x (B, T, d_model) and an optional context (B, S, d_model); return (B, T, S)."""
    B, T = require_tokens("x", x, d_model)
    if context is None:
        return B, T, T
    Bc, S = require_tokens("context", context, d_model)
    if Bc != B:
        raise ValueError(f"context must have the same batch size as x (B={B}), got {Bc}")
    return B, T, S


def _is_bool(x: Any) -> bool:
    dt = x.dtype
    return dt == np.bool_ if isinstance(dt, np.dtype) else str(dt) == "torch.bool"


def mask_shape(mask: Any, B: int, h: int, T: int, S: int) -> tuple[int, int, int, int]:
    """Check a boolean attention mask (True = may attend) and return its 4-D view shape.

    Accepted: (T, S) shared by every batch item and head, (B, T, S) one per batch item,
    or 4-D (B or 1, h or 1, T, S). The returned shape is what to reshape the mask to
    so it broadcasts against scores of shape (B, h, T, S).
    """
    if not hasattr(mask, "dtype") or not _is_bool(mask):
        kind = getattr(mask, "dtype", type(mask).__name__)
        raise TypeError(
            f"mask must be a boolean array (True = may attend), got {kind}; "
            f"for a 0/1 array (1 = may attend) use mask == 1; for an additive mask (0 = attend, "
            f"-inf = blocked) use mask == 0"
        )
    got = shape_of(mask)
    allowed = f"(T={T}, S={S}), (B={B}, T={T}, S={S}) or (B={B} or 1, h={h} or 1, T={T}, S={S})"
    if len(got) == 2 and got == (T, S):
        return (1, 1, T, S)
    if len(got) == 3 and got == (B, T, S):
        return (B, 1, T, S)
    if len(got) == 4 and got[0] in (1, B) and got[1] in (1, h) and got[2:] == (T, S):
        return got  # type: ignore[return-value]
    raise ValueError(f"mask must be {allowed}, got {got}")


class LazyModule:
    """A module imported on first attribute access: numpy-only work never pays for torch."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)
        self.__dict__.update(vars(module))  # later lookups skip __getattr__ altogether
        return getattr(module, attr)


torch = LazyModule("torch")
"""`torch`, imported the first time a torch-only branch needs it (a tensor was passed in)."""


def is_torch(x: Any) -> bool:
    """True for a torch.Tensor; never imports torch (no tensor can exist before torch is loaded)."""
    loaded = sys.modules.get("torch")
    return loaded is not None and isinstance(x, loaded.Tensor)
