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


def autograd_grads(module, x, dout, context=None, causal=False, mask=None, use_sdpa=False):
    """The gradients of mha.training.grad.backward from torch autograd on the module's weights (float64)."""
    import torch  # only the gradient tests need it

    from mha.modules.torch_mha import MultiHeadAttention as TorchMHA
    from mha.training.grad import Grads

    tm = TorchMHA.from_numpy(module, dtype=torch.float64, use_sdpa=use_sdpa)
    xt = torch.from_numpy(x).requires_grad_()
    ct = None if context is None else torch.from_numpy(context).requires_grad_()
    tm(xt, context=ct, causal=causal, mask=mask).backward(torch.from_numpy(dout))
    # nn.Linear keeps its weight as (out, in): transpose its gradient to numpy's (in, out)
    W = {n: (getattr(tm, p).weight.grad.T.numpy(), getattr(tm, p).bias.grad.numpy())
         for n, p in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj"))}
    return Grads(xt.grad.numpy(), *W["q"], *W["k"], *W["v"], *W["o"],
                 dcontext=None if ct is None else ct.grad.numpy())
