"""Independent loop-based references: slow, obvious, and written without mha.steps."""

import math

import numpy as np


def attention_loops(mha, x, context=None, allowed=None) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention with explicit Python loops over batch, head, query and key.

    `allowed` is a boolean (B, h, T, S) array or None. Returns (output, weights).
    """
    ctx = x if context is None else context
    B, T, d_model = x.shape
    S = ctx.shape[1]
    h, d_k = mha.n_heads, mha.d_model // mha.n_heads
    q = np.einsum("btd,de->bte", x, mha.Wq) + mha.bq
    k = np.einsum("bsd,de->bse", ctx, mha.Wk) + mha.bk
    v = np.einsum("bsd,de->bse", ctx, mha.Wv) + mha.bv
    merged = np.zeros((B, T, d_model), dtype=x.dtype)
    weights = np.zeros((B, h, T, S), dtype=x.dtype)
    for b in range(B):
        for j in range(h):
            cols = slice(j * d_k, (j + 1) * d_k)  # head j owns these feature columns
            for t in range(T):
                logits = [float(q[b, t, cols] @ k[b, s, cols]) / math.sqrt(d_k) for s in range(S)]
                ok = [allowed is None or bool(allowed[b, j, t, s]) for s in range(S)]
                if not any(ok):
                    continue  # nothing to attend to: weights and output stay zero
                top = max(lg for lg, o in zip(logits, ok, strict=True) if o)
                ex = [math.exp(lg - top) if o else 0.0 for lg, o in zip(logits, ok, strict=True)]
                total = sum(ex)
                for s in range(S):
                    weights[b, j, t, s] = ex[s] / total
                    merged[b, t, cols] += weights[b, j, t, s] * v[b, s, cols]
    out = np.einsum("btd,de->bte", merged, mha.Wo) + mha.bo
    return out, weights
