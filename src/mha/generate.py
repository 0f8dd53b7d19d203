"""Generation end to end: greedy decoding of a left-padded batch, with and without the KV cache.

The tiny model of 10_attention_that_learns.ipynb (`mha.train.TinyTransformer`) and its numpy twin `NumpyTinyTransformer`
(the same weights, `mha.numpy_mha.MultiHeadAttention` inside) share one interface,

    model(tokens (B, T), positions (T,)|(B, T), caches) -> logits (B, T, vocab)
    model.new_caches(B, max_len) -> one KV cache per layer

so `generate` runs either. Prompts of different lengths are LEFT-padded: every prompt ends in
the last column, so each step appends one token to all of them; the pads get position -1
(`mha.compose.padded_positions`), which the attention never reads. Two ways to decode:

    cache=True    prefill the prompts once, then feed one token per step (O(S) work per token)
    cache=False   run the whole sequence again at every step (O(S^2) per token): the reference

Shape legend: B batch, T tokens in a call, S tokens so far, V vocabulary, d_model width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import compose
from .bench import Timing, time_fn
from .numpy_mha import MultiHeadAttention
from .validate import is_torch, require_int, torch  # torch: lazy

PAD = 0
"""Token id written in pad slots (never read: pads have position -1)."""


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """nn.LayerNorm's forward over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
    mean = x.mean(-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # biased variance, as torch uses
    return (x - mean) / np.sqrt(var + eps) * weight + bias  # (..., d_model)


class NumpyTinyTransformer:
    """The numpy twin of an attention-only TinyTransformer: same weights, same logits (float64)."""

    def __init__(self, model: Any, dtype=np.float64):
        if any(b.mlp is not None for b in model.blocks):
            raise ValueError("the numpy twin runs attention-only models (mlp=False): numpy has no "
                             "erf for nn.GELU's exact form")
        def arr(t): return t.detach().cpu().double().numpy().astype(dtype)  # noqa: E306
        self.vocab, self.T, self.causal = model.vocab, model.T, model.causal
        self.tok = arr(model.tok.weight)  # (V, d_model)
        self.pos = None if model.pos is None else arr(model.pos.weight)  # (T, d_model) or None
        self.blocks = [(arr(b.ln1.weight), arr(b.ln1.bias), b.attn.to_numpy(dtype))
                       for b in model.blocks]
        self.ln_f = (arr(model.ln_f.weight), arr(model.ln_f.bias))
        self.head = (arr(model.head.weight).T, arr(model.head.bias))  # (d_model, V), (V,)

    def __call__(self, tokens: np.ndarray, positions: np.ndarray | None = None,
                 caches: list | None = None) -> np.ndarray:
        """tokens (B, T) ints -> logits (B, T, V); positions and caches as the torch model takes."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must be (B, T) whole numbers, got {tokens.dtype} {tokens.shape}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab):
            raise ValueError(f"tokens must be ids in 0..{self.vocab - 1} (vocab={self.vocab})")
        x = self.tok[tokens]  # (B, T, d_model)
        if self.pos is not None:
            at = np.arange(tokens.shape[1]) if positions is None else np.maximum(positions, 0)
            x = x + self.pos[at]  # (B, T, d_model) + (T|B,T, d_model)
        for (w, b, attn), cache in zip(self.blocks, caches or [None] * len(self.blocks), strict=True):
            x = x + attn(layer_norm(x, w, b), causal=self.causal, positions=positions, cache=cache)
        W, b = self.head
        return layer_norm(x, *self.ln_f) @ W + b  # (B, T, d_model) @ (d_model, V) -> (B, T, V)

    def new_caches(self, B: int, max_len: int) -> list:
        """One numpy KV cache per layer."""
        return [attn.new_cache(B, max_len) for _, _, attn in self.blocks]

    @property
    def attention_layers(self) -> list[MultiHeadAttention]:
        """The numpy attention module of every layer."""
        return [attn for _, _, attn in self.blocks]


def left_pad(prompts: Sequence[Sequence[int]], like: Any = None) -> tuple[Any, Any]:
    """Prompts of different lengths -> tokens (B, T) left-padded with PAD, and positions (B, T).

    numpy by default; torch tensors when `like` is a torch model or tensor.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    T = max(len(p) for p in prompts)
    tokens = np.full((len(prompts), T), PAD, dtype=np.int64)  # (B, T)
    for i, p in enumerate(prompts):
        tokens[i, T - len(p):] = p  # right-aligned: every prompt ends in the last column
    lengths = np.array([len(p) for p in prompts])
    positions = compose.padded_positions(lengths, T)  # (B, T): -1 on pads
    if _is_torch_model(like):
        return torch.from_numpy(tokens), torch.from_numpy(positions)
    return tokens, positions


def _is_torch_model(like: Any) -> bool:
    return is_torch(like) or (like is not None and hasattr(like, "parameters")
                              and not isinstance(like, NumpyTinyTransformer))


def generate(model: Any, prompts: Sequence[Sequence[int]], n_new: int, cache: bool = True,
             max_len: int | None = None) -> Any:
    """Greedy decoding: n_new tokens after each prompt -> (B, n_new) ids (numpy or torch, as the model).

    cache=True prefills the prompts once and then feeds one token per step; cache=False
    recomputes the whole sequence every step. Both must give the same tokens.
    """
    n_new = require_int("n_new", n_new)
    tokens, positions = left_pad(prompts, model)
    B, T = tokens.shape
    caches = model.new_caches(B, max_len or T + n_new) if cache else None
    out = []
    with _inference(model):
        logits = model(tokens, positions, caches)  # (B, T, V): the prefill
        for _ in range(n_new):
            nxt = logits[:, -1].argmax(-1)  # (B,) greedy: the most likely next token
            out.append(nxt)
            step = positions[:, -1:] + 1  # (B, 1): each sequence's next position
            positions = _cat(positions, step)  # (B, S + 1)
            tokens = _cat(tokens, nxt[:, None])  # (B, S + 1)
            if cache:
                logits = model(nxt[:, None], step, caches)  # (B, 1, V): one new token
            else:
                logits = model(tokens, positions)  # (B, S + 1, V): everything again
    return torch.stack(out, 1) if is_torch(out[0]) else np.stack(out, 1)  # (B, n_new)


def _cat(a: Any, b: Any) -> Any:
    return torch.cat([a, b], 1) if is_torch(a) else np.concatenate([a, b], 1)


def _inference(model: Any) -> Any:
    """torch.no_grad() for a torch model; a context that does nothing for numpy."""
    return torch.no_grad() if _is_torch_model(model) else contextlib.nullcontext()


def token_seconds(model: Any, context: int, cache: bool, repeats: int = 5, B: int = 1) -> Timing:
    """Seconds to compute the next token's logits after `context` tokens, with or without the cache.

    With the cache: prefill `context` tokens once, then time one step, rolling the caches back
    after each (`truncate`). Without: time one forward over all context + 1 tokens.
    """
    context = require_int("context", context)
    torch_model = _is_torch_model(model)
    ids = np.random.default_rng(0).integers(0, model.vocab, (B, context + 1))  # (B, context + 1)
    tokens = torch.from_numpy(ids) if torch_model else ids
    with _inference(model):
        if not cache:
            return time_fn(lambda: model(tokens), repeats=repeats)
        caches = model.new_caches(B, context + 1)
        model(tokens[:, :context], None, caches)  # the prefill, not timed

        def step():
            model(tokens[:, context:], None, caches)  # (B, 1, V): one token against the cache
            for c in caches:
                c.truncate(context)
        return time_fn(step, repeats=repeats)


def cache_bytes(model: Any, B: int, max_len: int) -> int:
    """What the caches of `model` hold for B sequences: sum over layers of 2 B h_kv slots d_k itemsize."""
    return sum(c.nbytes for c in model.new_caches(B, max_len))


def cache_bytes_formula(n_layers: int, B: int, n_kv_heads: int, slots: int, d_k: int,
                        itemsize: int) -> int:
    """2 (K and V) * layers * B * h_kv * slots * d_k * bytes per number; slots = max_len or window."""
    return 2 * n_layers * B * n_kv_heads * slots * d_k * itemsize
