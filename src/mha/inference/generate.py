"""Generation end to end: greedy decoding of a left-padded batch, with and without the KV cache.

The tiny model of 10_attention_that_learns.ipynb (`mha.training.train.TinyTransformer`) and its numpy twin `NumpyTinyTransformer`
(the same weights, `mha.modules.numpy_mha.MultiHeadAttention` inside) share one interface,

    model(tokens (B, T), positions (T,)|(B, T), caches) -> logits (B, T, vocab)
    model.new_caches(B, max_len) -> one KV cache per layer

so `generate` runs either. Prompts of different lengths are LEFT-padded: every prompt ends in
the last column, so each step appends one token to all of them; the pads get position -1
(`mha.modules.compose.padded_positions`), which the attention never reads. Two ways to decode:

    cache=True    prefill the prompts once, then feed one token per step (O(S) work per token)
    cache=False   run the whole sequence again at every step (O(S^2) per token): the reference

Shape legend: B batch, T tokens in a call, S tokens so far, V vocabulary, d_model width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from mha.modules import compose
from mha.modules.numpy_mha import MultiHeadAttention, float_dtype
from mha.perf.bench import Timing, time_fn
from mha.validate import is_torch, require_bool, require_int, torch  # torch: lazy

PAD = 0
"""Token id written in pad slots (never read: pads have position -1)."""


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """nn.LayerNorm's forward over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
    mean = x.mean(-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # biased variance, as torch uses
    return (x - mean) / np.sqrt(var + eps) * weight + bias  # (..., d_model)


class NumpyTinyTransformer:
    """The numpy twin of an attention-only TinyTransformer: same weights, same logits (float64).

    `backend` names the attention kernel of every layer (`numpy_attention.BACKENDS`).
    """

    def __init__(self, model: Any, dtype=np.float64, backend: str = "reference"):
        missing = [a for a in ("tok", "pos", "blocks", "ln_f", "head", "vocab", "T", "causal")
                   if not hasattr(model, a)]
        if missing:
            raise TypeError(f"model must be an mha.training.train.TinyTransformer, got {type(model).__name__} "
                            f"(it has no {', '.join(missing)})")
        dtype = float_dtype(dtype)
        if any(b.mlp is not None for b in model.blocks):
            raise ValueError("the numpy twin runs attention-only models (mlp=False): numpy has no "
                             "erf for nn.GELU's exact form")
        def arr(t): return t.detach().cpu().double().numpy().astype(dtype)  # noqa: E306
        self.vocab, self.T, self.causal = model.vocab, model.T, model.causal
        self.tok = arr(model.tok.weight)  # (V, d_model)
        self.pos = None if model.pos is None else arr(model.pos.weight)  # (T, d_model) or None
        self.blocks = [(arr(b.ln1.weight), arr(b.ln1.bias), b.attn.to_numpy(dtype))
                       for b in model.blocks]
        for _, _, attn in self.blocks:  # "flash": tiled prefill, split-KV decoding (numpy_attention)
            attn.set_backend(backend)
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
        positions = None if positions is None else compose.as_positions(positions)
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"caches must hold one cache per layer ({len(self.blocks)}), got "
                             f"{len(caches)}")
        self._check_table(tokens.shape[1], positions, caches)
        x = self.tok[tokens]  # (B, T, d_model)
        if self.pos is not None:
            at = np.arange(tokens.shape[1]) if positions is None else np.maximum(positions, 0)
            x = x + self.pos[at]  # (B, T, d_model) + (T|B,T, d_model)
        for (w, b, attn), cache in zip(self.blocks, caches or [None] * len(self.blocks), strict=True):
            x = x + attn(layer_norm(x, w, b), causal=self.causal, positions=positions, cache=cache)
        W, b = self.head
        return layer_norm(x, *self.ln_f) @ W + b  # (B, T, d_model) @ (d_model, V) -> (B, T, V)

    def _check_table(self, T: int, positions: Any, caches: list | None) -> None:
        """The torch model's check: a learned position table has rows 0..self.T - 1 only."""
        if self.pos is None:
            return
        last = T - 1 if positions is None or np.size(positions) == 0 else int(np.max(positions))
        if caches and positions is None:  # positions follow the cache (given ones are what is read;
            last = max(last, len(caches[0]) + T - 1)  # a paged batch's rows differ in length)
        if last >= self.T:
            raise ValueError(f"tokens must have positions < {self.T} (the learned position table), "
                             f"got position {last}; a model with rope= runs at any length")

    def new_caches(self, B: int, max_len: int) -> list:
        """One numpy KV cache per layer."""
        return [attn.new_cache(B, max_len) for _, _, attn in self.blocks]

    @property
    def attention_layers(self) -> list[MultiHeadAttention]:
        """The numpy attention module of every layer."""
        return [attn for _, _, attn in self.blocks]


def check_prompts(prompts: Any, vocab: int | None = None) -> list[list[int]]:
    """Prompts as lists of int token ids: a non-empty list of non-empty lists (or 1-D int arrays).

    Text, floats, bools, a flat list of ids and ids outside 0..vocab-1 are refused, naming what
    arrived: a float id would otherwise be truncated without a word.
    """
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence | np.ndarray) and \
            not is_torch(prompts):
        raise TypeError(f"prompts must be a list of token-id lists (ints), got "
                        f"{type(prompts).__name__} {prompts!r:.60}; encode text into ids first")
    if len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of non-empty token lists, got no prompt")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str | bytes):
            raise TypeError(f"prompt {i} must be a list of token ids (ints), got text {p!r:.60}; "
                            f"encode it into ids first")
        if isinstance(p, int | np.integer) and not isinstance(p, bool | np.bool_):
            raise TypeError(f"prompts must be a list of prompts, each a list of token ids; got a "
                            f"flat list of ids (prompt {i} is the int {p}): wrap one prompt as "
                            f"[prompt]")
        if is_torch(p) or isinstance(p, np.ndarray):
            arr = p.detach().cpu().numpy() if is_torch(p) else p
            if arr.ndim != 1 or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"prompt {i} must be a 1-D array of int token ids, got dtype "
                                f"{arr.dtype} shape {arr.shape}")
            ids = [int(v) for v in arr]
        elif isinstance(p, Sequence):
            bad = next((v for v in p if isinstance(v, bool | np.bool_)
                        or not isinstance(v, int | np.integer)), None)
            if bad is not None:
                raise TypeError(f"prompt {i} must hold token ids (ints), got {type(bad).__name__} "
                                f"{bad!r}" + (" (a float id would be truncated)"
                                              if isinstance(bad, float | np.floating) else ""))
            ids = [int(v) for v in p]
        else:
            raise TypeError(f"prompt {i} must be a list of token ids (ints), got "
                            f"{type(p).__name__} {p!r:.60}")
        if not ids:
            raise ValueError(f"prompts must be a non-empty list of non-empty token lists; prompt "
                             f"{i} is empty")
        if vocab is not None and (min(ids) < 0 or max(ids) >= vocab):
            bad_id = next(v for v in ids if not 0 <= v < vocab)
            raise ValueError(f"prompt {i} must hold ids in 0..{vocab - 1} (vocab={vocab}), got "
                             f"{bad_id}")
        out.append(ids)
    return out


def left_pad(prompts: Sequence[Sequence[int]], like: Any = None) -> tuple[Any, Any]:
    """Prompts of different lengths -> tokens (B, T) left-padded with PAD, and positions (B, T).

    numpy by default; torch tensors when `like` is a torch model or tensor.
    """
    prompts = check_prompts(prompts, getattr(like, "vocab", None))
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
    recomputes the whole sequence every step. Both must give the same tokens. The last new
    token is returned, not fed back, so the caches hold max_len = T + n_new - 1 positions by
    default (T the padded prompt width); a window longer than that just never wraps.
    """
    n_new = require_int("n_new", n_new)
    cache = require_bool("cache", cache)
    tokens, positions = left_pad(prompts, model)
    B, T = tokens.shape
    fed = T + n_new - 1  # the prompt columns, then every new token but the last
    if max_len is None:
        max_len = fed
    elif require_int("max_len", max_len) < fed:
        raise ValueError(f"max_len must hold the padded prompts and the new tokens fed back, "
                         f"T + n_new - 1 = {T} + {n_new} - 1 = {fed}, got max_len={max_len}")
    table = getattr(model, "T", None) if getattr(model, "pos", None) is not None else None
    if table is not None and T + n_new - 1 > table:  # the last new token is never fed back
        raise ValueError(f"tokens must have positions < {table} (the learned position table): "
                         f"prompts of {T} columns and n_new={n_new} reach position "
                         f"{T + n_new - 2}; a model with rope= runs at any length")
    caches = model.new_caches(B, max_len) if cache else None
    out = []
    with _inference(model):
        logits = model(tokens, positions, caches)  # (B, T, V): the prefill
        for i in range(n_new):
            nxt = logits[:, -1].argmax(-1)  # (B,) greedy: the most likely next token
            out.append(nxt)
            if i == n_new - 1:
                break  # the last new token is returned, never fed back
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
    cache = require_bool("cache", cache)
    repeats, B = require_int("repeats", repeats), require_int("B", B)
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
    """2 (K and V) * layers * B * h_kv * slots * d_k * bytes per number; slots = max_len or window.

    Every size must be a whole number >= 1 (a negative count gives negative bytes, silently).
    """
    sizes = dict(n_layers=n_layers, B=B, n_kv_heads=n_kv_heads, slots=slots, d_k=d_k,
                 itemsize=itemsize)
    n_layers, B, n_kv_heads, slots, d_k, itemsize = (require_int(k, v) for k, v in sizes.items())
    return 2 * n_layers * B * n_kv_heads * slots * d_k * itemsize
