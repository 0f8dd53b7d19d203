"""Multi-head attention in numpy, assembled from the seven steps in `mha.steps`."""

from __future__ import annotations

import math

import numpy as np

from . import ledger, steps
from .ledger import LedgerRow, format_ledger  # noqa: F401  (re-exported for callers)
from .validate import mask_shape, require_float, require_heads, require_query_and_context

# What `trace` writes for each step call, in call order (see mha.ledger).
LEDGER_LABELS = {
    "linear": [("1 project", "q = x Wq + bq", "(B, T, d_model)"),
               ("1 project", "k = x Wk + bk", "(B, S, d_model)"),
               ("1 project", "v = x Wv + bv", "(B, S, d_model)"),
               ("7 project", "out = merged Wo + bo", "(B, T, d_model)")],
    "split_heads": [("2 split heads", "q", "(B, h, T, d_k)"), ("2 split heads", "k", "(B, h, S, d_k)"),
                    ("2 split heads", "v", "(B, h, S, d_k)")],
    "scaled_scores": [("3 scaled scores", "q k^T / sqrt(d_k)", "(B, h, T, S)")],
    "apply_mask": [("4 mask", "scores (-inf where masked)", "(B, h, T, S)")],
    "softmax": [("5 softmax", "attention weights", "(B, h, T, S)")],
    "weighted_sum": [("6 weighted sum", "weights @ v", "(B, h, T, d_k)")],
    "merge_heads": [("7 merge heads", "concat of heads", "(B, T, d_model)")],
}


class MultiHeadAttention:
    """Multi-head attention forward pass in plain numpy.

    Weights: four (d_model, d_model) matrices drawn from N(0, 1/d_model), applied as
    `x @ W` (in, out), and four zero biases. Shapes: x (B, T, d_model) -> (B, T, d_model).
    """

    def __init__(self, d_model: int, n_heads: int, seed: int = 0, dtype=np.float64):
        self.d_k = require_heads(d_model, n_heads)
        self.d_model, self.n_heads = int(d_model), int(n_heads)
        self.dtype = np.dtype(dtype)
        if not np.issubdtype(self.dtype, np.floating):
            raise TypeError(f"dtype must be a floating-point type, got {self.dtype}")
        rng = np.random.default_rng(seed)
        # std 1/sqrt(d_model): each projected feature sums d_model products of unit-variance
        # inputs, so its variance stays ~1 instead of growing with the width.
        std = 1.0 / math.sqrt(d_model)
        shape = (d_model, d_model)
        self.Wq, self.Wk, self.Wv, self.Wo = (
            rng.normal(0.0, std, shape).astype(self.dtype) for _ in range(4)
        )
        self.bq, self.bk, self.bv, self.bo = (np.zeros(d_model, self.dtype) for _ in range(4))
        self.attn: np.ndarray | None = None

    def parameters(self) -> list[np.ndarray]:
        """All learnable arrays: [Wq, bq, Wk, bk, Wv, bv, Wo, bo]."""
        return [self.Wq, self.bq, self.Wk, self.bk, self.Wv, self.bv, self.Wo, self.bo]

    def num_parameters(self) -> int:
        """Total number of learnable numbers (4 * d_model**2 + 4 * d_model)."""
        return sum(p.size for p in self.parameters())

    def __repr__(self) -> str:
        return (f"MultiHeadAttention(d_model={self.d_model}, n_heads={self.n_heads}, "
                f"d_k={self.d_k}, dtype={self.dtype})")

    def __call__(self, x, context=None, causal=False, mask=None) -> np.ndarray:
        return self.forward(x, context=context, causal=causal, mask=mask)


    def forward(
        self,
        x: np.ndarray,
        context: np.ndarray | None = None,
        causal: bool = False,
        mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Attend from x (B, T, d_model) to context (B, S, d_model; default x) -> (B, T, d_model).

        `causal=True` lets query t see keys s <= t. `mask` is boolean, True = may attend,
        shaped (T, S), (B, T, S) or (B|1, h|1, T, S); it is combined with `causal`.
        The attention weights (B, h, T, S) are kept on `self.attn`.
        """
        B, T, S = self._check_inputs(x, context)
        allowed = self.allowed(B, T, S, causal, mask)  # None, or True where query t may see key s
        ctx = x if context is None else context
        h = self.n_heads
        q = steps.linear(x, self.Wq, self.bq)  # 1) (B, T, d_model): three views of the tokens
        k = steps.linear(ctx, self.Wk, self.bk)  #    (B, S, d_model)
        v = steps.linear(ctx, self.Wv, self.bv)  #    (B, S, d_model)
        q, k, v = (steps.split_heads(a, h) for a in (q, k, v))  # 2) (B, h, T|S, d_k)
        scores = steps.scaled_scores(q, k)  # 3) (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
        if allowed is not None:
            scores = steps.apply_mask(scores, allowed)  # 4) -inf where masked, before softmax
        self.attn = steps.softmax(scores)  # 5) (B, h, T, S): rows sum to 1
        heads = steps.weighted_sum(self.attn, v)  # 6) (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
        merged = steps.merge_heads(heads)  # 7) (B, h, T, d_k) -> (B, T, d_model) ...
        return steps.linear(merged, self.Wo, self.bo)  # ... then the output projection

    def trace(self, x, context=None, causal=False, mask=None) -> list[LedgerRow]:
        """Run forward once and return the shape ledger of every tensor it made."""
        with ledger.recording(steps, LEDGER_LABELS) as rows:
            self.forward(x, context=context, causal=causal, mask=mask)
        return ledger.input_rows(x, context) + rows

    def allowed(self, B: int, T: int, S: int, causal: bool, mask) -> np.ndarray | None:
        """Combine `causal` and `mask` into one boolean array that broadcasts to (B, h, T, S)."""
        allowed = None
        if mask is not None:
            allowed = np.asarray(mask).reshape(mask_shape(mask, B, self.n_heads, T, S))
        if causal:
            tril = steps.causal_mask(T, S)  # (T, S)
            allowed = tril if allowed is None else allowed & tril
        return allowed

    def _check_inputs(self, x, context) -> tuple[int, int, int]:
        B, T, S = require_query_and_context(x, context, self.d_model)
        for name, a in (("x", x), ("context", context)):
            if a is not None and a.dtype != self.dtype:
                require_float(name, a)
                raise TypeError(
                    f"{name} must be {self.dtype} to match the weights, got {a.dtype} "
                    f"(convert with .astype(np.{self.dtype}) or build the module with "
                    f"dtype=np.{a.dtype})"
                )
        return B, T, S
