"""Multi-head attention in numpy, assembled from the seven steps in `mha.steps`.

    MultiHeadAttention               steps 1-7 around the attention core (steps 3-6,
                                     `mha.attention.numpy_attention.attention`, on a named backend), with
                                     the production features as options (n_kv_heads, rope, alibi,
                                     window) and a cache and per-sequence positions passed to
                                     forward (see mha.modules.compose)
"""

from __future__ import annotations

import math

import numpy as np

from mha import ledger, steps
from mha.attention.backends import Call
from mha.attention.masking import MaskSpec
from mha.attention.numpy_attention import BACKENDS, attention
from mha.inference.kv_cache import KVCache
from mha.inference.paged import PagedKVCache
from mha.ledger import LedgerRow
from mha.modules import compose
from mha.validate import (
    mask_shape,
    require_float,
    require_heads,
    require_int,
    require_query_and_context,
)

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


def float_dtype(dtype) -> np.dtype:
    """dtype as a numpy floating-point dtype (float16, float32, float64), else TypeError."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or not np.issubdtype(dt, np.floating):
        shown = repr(dtype) if dt is None else str(dt)
        raise TypeError(f"dtype must be a floating-point type, got {shown} "
                        f"(np.float16, np.float32 or np.float64)")
    return dt


class MultiHeadAttention:
    """Multi-head attention forward pass in plain numpy, with the production features as options.

    Weights: Wq, Wo (d_model, d_model) and Wk, Wv (d_model, h_kv * d_k) drawn from
    N(0, 1/d_model), applied as `x @ W` (in, out), and zero biases. With the defaults this is
    the seven steps of the lessons; the options (see `mha.modules.compose`) only change what the core
    gets: `n_kv_heads` (grouped-query / multi-query attention), `rope` ("half" or
    "interleaved"), `alibi`, `window` (a causal sliding window); `backend`, steps 3-6's kernel
    (`numpy_attention.BACKENDS`, refused here if it cannot serve them; "flash" decodes one token
    after a cache by "split_kv": flash decoding). Shapes: x (B, T, d_model) -> (B, T, d_model).
    """

    def __init__(self, d_model: int, n_heads: int, seed: int = 0, dtype=np.float64, *,
                 n_kv_heads: int | None = None, rope: str | None = None, rope_base: float = 10000.0,
                 alibi: bool = False, window: int | None = None, backend: str = "reference"):
        self.d_k = require_heads(d_model, n_heads)
        self.d_model, self.n_heads = int(d_model), int(n_heads)
        self.options = compose.check_options(self.n_heads, self.d_k, n_kv_heads, rope, rope_base,
                                             alibi, window)
        self.n_kv_heads = self.options.n_kv_heads
        self.group = self.n_heads // self.n_kv_heads  # g query heads per key/value head
        self.dtype = float_dtype(dtype)
        self.set_backend(backend)
        rng = np.random.default_rng(require_int("seed", seed, minimum=0))
        # std 1/sqrt(d_model): each projected feature sums d_model products of unit-variance
        # inputs, so its variance stays ~1 instead of growing with the width.
        std, d_kv = 1.0 / math.sqrt(d_model), self.n_kv_heads * self.d_k
        shapes = [(d_model, d_model), (d_model, d_kv), (d_model, d_kv), (d_model, d_model)]
        self.Wq, self.Wk, self.Wv, self.Wo = (rng.normal(0.0, std, s).astype(self.dtype) for s in shapes)
        self.bq, self.bo = np.zeros(d_model, self.dtype), np.zeros(d_model, self.dtype)
        self.bk, self.bv = np.zeros(d_kv, self.dtype), np.zeros(d_kv, self.dtype)
        self.attn: np.ndarray | None = None

    def parameters(self) -> list[np.ndarray]:
        """All learnable arrays: [Wq, bq, Wk, bk, Wv, bv, Wo, bo]."""
        return [self.Wq, self.bq, self.Wk, self.bk, self.Wv, self.bv, self.Wo, self.bo]

    def num_parameters(self) -> int:
        """Total number of learnable numbers (4 * d_model**2 + 4 * d_model without GQA)."""
        return sum(p.size for p in self.parameters())

    def __repr__(self) -> str:
        extra = self.options.describe(self.n_heads)
        return (f"MultiHeadAttention(d_model={self.d_model}, n_heads={self.n_heads}, "
                f"d_k={self.d_k}, dtype={self.dtype}{', ' + extra if extra else ''})")

    def __call__(self, x, context=None, causal=False, mask=None, **options):
        return self.forward(x, context, causal, mask, **options)  # options: positions, cache, backend

    def forward(self, x: np.ndarray, context: np.ndarray | None = None, causal: bool = False,
                mask: np.ndarray | None = None, positions: np.ndarray | None = None,
                cache: KVCache | PagedKVCache | None = None, backend: str | None = None) -> np.ndarray:
        """Attend from x (B, T, d_model) to context (B, S, d_model; default x) -> (B, T, d_model).

        `causal=True` lets a query see keys at positions <= its own. `mask`: boolean, True = may
        attend, (T, S), (B, T, S) or (B|1, h|1, T, S). `positions` (T,) or (B, T) ints (default
        0..T-1, or after the cache; negative = padding). `cache` (self-attention; a KVCache, or a
        PagedKVCache: no `mask`) keeps k, v; `backend` overrides the module's. Weights: `self.attn`.
        """
        B, T, S, backend = self._checked(x, context, mask, cache, backend)
        causal = compose.require_causal(causal, self.options.window)
        q_pos = compose.query_positions(positions, B, T, cache, x)  # (T,) or (B, T)
        k_pos = q_pos if context is None else np.arange(S)  # (T,)|(B, T), or the context's 0..S-1
        ctx = x if context is None else context
        q = steps.linear(x, self.Wq, self.bq)  # 1) (B, T, d_model): three views of the tokens
        k = steps.linear(ctx, self.Wk, self.bk)  #    (B, S, h_kv * d_k)
        v = steps.linear(ctx, self.Wv, self.bv)  #    (B, S, h_kv * d_k)
        q = steps.split_heads(q, self.n_heads)  # 2) (B, h, T, d_k)
        k, v = (steps.split_heads(a, self.n_kv_heads) for a in (k, v))  # (B, h_kv, S, d_k)
        q, k = compose.rotate(q, q_pos, self.options), compose.rotate(k, k_pos, self.options)
        if cache is not None:  # the past joins: k, v (B, h_kv, S_all, d_k), k_pos (B, S_all)
            k, v, k_pos = cache.update(k, v, np.broadcast_to(k_pos, (B, T)))
        spec = compose.mask_spec(q_pos, k_pos, causal, self.options.window, mask, B, self.n_heads)
        bias = compose.alibi(self.options, self.n_heads, q_pos, k_pos)  # None without ALiBi
        heads, self.attn = attention(q, k, v, spec, bias, backend=backend)  # 3-6) on the backend
        merged = steps.merge_heads(heads)  # 7) (B, h, T, d_k) -> (B, T, d_model) ...
        return steps.linear(merged, self.Wo, self.bo)  # ... then the output projection

    def trace(self, x, context=None, causal=False, mask=None) -> list[LedgerRow]:
        """Run forward once and return the shape ledger of every tensor it made."""
        with ledger.recording(steps, LEDGER_LABELS) as rows:
            self.forward(x, context=context, causal=causal, mask=mask)
        return ledger.input_rows(x, context) + rows

    def new_cache(self, B: int, max_len: int) -> KVCache:
        """A KV cache for this module: (B, h_kv, max_len, d_k), or a ring of `window` slots."""
        return KVCache(B, self.n_kv_heads, max_len, self.d_k, self.dtype, window=self.options.window)

    def allowed(self, B: int, T: int, S: int, causal: bool, mask) -> np.ndarray | None:
        """Combine `causal` and `mask` into one boolean array that broadcasts to (B, h, T, S)."""
        return compose.allowed(np.arange(T), np.arange(S), causal, None, mask, B, self.n_heads)

    def set_backend(self, backend: str) -> str:
        """Run steps 3-6 on `backend` from now on (refused, nothing changed, if it cannot serve)."""
        self.backend = self._check_backend(backend)
        return self.backend

    def _check_backend(self, backend: str) -> str:
        """backend, if it can serve this module's options (GQA, ALiBi, window) and dtype."""
        needs = {f for f, used in (("gqa", self.n_kv_heads != self.n_heads),
                                   ("bias", self.options.alibi),
                                   ("window", self.options.window is not None)) if used}
        BACKENDS.check(backend, Call(dtype=str(self.dtype), needs=frozenset(needs)))
        return backend

    def _checked(self, x, context, mask, cache, backend) -> tuple[int, int, int, str]:
        """(B, T, S) of checked inputs and the backend the call runs: "flash" decodes by split-KV."""
        backend = self.backend if backend is None else self._check_backend(backend)
        B, T, S = self._check_inputs(x, context, mask, cache)
        if backend == "flash" and cache is not None and T == 1:
            backend = "split_kv"  # flash decoding: one query, so the keys are split instead
        return B, T, S, backend

    def _check_inputs(self, x, context, mask=None, cache=None) -> tuple[int, int, int]:
        B, T, S = require_query_and_context(x, context, self.d_model)
        for name, a in (("x", x), ("context", context)):
            if a is not None and a.dtype != self.dtype:
                require_float(name, a)
                raise TypeError(
                    f"{name} must be {self.dtype} to match the weights, got {a.dtype} "
                    f"(convert with .astype(np.{self.dtype}) or build the module with "
                    f"dtype=np.{a.dtype})"
                )
        compose.check_cache(self, cache, (KVCache, PagedKVCache), B, T, context, mask)
        if mask is not None and not isinstance(mask, MaskSpec):  # a MaskSpec: compose checks it
            mask_shape(mask, B, self.n_heads, T, S if cache is None else len(cache) + T)
        return B, T, S
