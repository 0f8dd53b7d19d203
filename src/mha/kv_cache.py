"""KV cache: decode one token (or a chunk) at a time without recomputing the past keys and values.

Shape legend: B batch, h heads, d_k = d_model // h, t_new new tokens this call,
S = positions cached so far (the new ones included), max_len the cache's capacity.

The idea: under a causal mask, the keys and values of positions 0..S-1 never change once
computed, so keep them in preallocated (B, h, max_len, d_k) arrays and, per step, project only
the new tokens. The new queries attend to ALL S cached keys; query i of a chunk of t_new sits
at absolute position S - t_new + i, so the causal mask is aligned bottom-right:
`steps.causal_mask(t_new, S, offset=S - t_new)`. Top-left alignment (offset 0, which is what
SDPA's `is_causal=True` does when t_new != S) lets the chunk see only the first keys: wrong.

numpy and torch twins, same signatures:
    KVCache       / TorchKVCache        preallocated keys and values for ONE attention layer
                                        (several layers: a list of caches, one per layer)
    decode_step   / torch_decode_step   (module, cache, x_new (B, t_new, d_model)) -> (B, t_new, d_model)
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from . import numpy_mha, steps, torch_mha
from .validate import require_float, require_int, require_shape, shape_of

ALIGNMENTS = ("bottom_right", "top_left")
"""`align` values of the decode steps: bottom_right is correct; top_left shows the bug."""


class _Cache:
    """Shared logic of KVCache and TorchKVCache; subclasses only allocate and check array types."""

    DEFAULT_DTYPE = None  # each backend's module default: numpy float64, torch float32

    def __init__(self, B: int, n_heads: int, max_len: int, d_k: int, dtype=None, device=None):
        dtype = self.DEFAULT_DTYPE if dtype is None else dtype
        self.B, self.n_heads = require_int("B", B), require_int("n_heads", n_heads)
        self.max_len, self.d_k = require_int("max_len", max_len), require_int("d_k", d_k)
        self.dtype, self.length = self._dtype(dtype), 0
        shape = (self.B, self.n_heads, self.max_len, self.d_k)  # (B, h, max_len, d_k)
        self.K, self.V = self._zeros(shape, device), self._zeros(shape, device)

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(B={self.B}, n_heads={self.n_heads}, max_len={self.max_len}, "
                f"d_k={self.d_k}, dtype={self.dtype}, length={self.length})")

    @property
    def nbytes(self) -> int:
        """Memory of K and V together: 2 * B * h * max_len * d_k * itemsize (allocated, not used)."""
        return 2 * self.B * self.n_heads * self.max_len * self.d_k * self.dtype.itemsize

    def append(self, k, v):
        """Write k, v (B, h, t_new, d_k) into the next slots; return views K, V (B, h, S, d_k) of all so far.

        Every check runs before the first write, so a bad chunk leaves the cache unchanged.
        The returned views share memory with the cache: a later append or reset changes them.
        """
        t_new = self._check_chunk(k, v)
        start, stop = self.length, self.length + t_new
        self.K[:, :, start:stop] = k  # (B, h, t_new, d_k) into slots start..stop-1
        self.V[:, :, start:stop] = v
        self.length = stop
        return self.K[:, :, :stop], self.V[:, :, :stop]  # 2 x (B, h, S, d_k), S = stop

    def reset(self) -> None:
        """Empty the cache (and zero the buffers, so stale keys cannot be mistaken for live ones)."""
        self.K[...] = 0
        self.V[...] = 0
        self.length = 0

    def _check_chunk(self, k, v) -> int:
        """Check k, v against the cache (array type, dtype, shape, room left); return t_new."""
        expected = (("B", self.B), ("h", self.n_heads), ("t_new", None), ("d_k", self.d_k))
        for name, a in (("k", k), ("v", v)):
            self._check_array(name, a)
            require_float(name, a)
            if a.dtype != self.dtype:
                raise TypeError(f"{name} must be {self.dtype} to match the cache, got {a.dtype}")
            require_shape(name, a, expected)
        if shape_of(v) != shape_of(k):
            raise ValueError(f"v must have the shape of k {shape_of(k)}, got {shape_of(v)}")
        t_new = shape_of(k)[2]
        if t_new == 0:
            raise ValueError(f"k must add at least one position (t_new >= 1), got {shape_of(k)}")
        if self.length + t_new > self.max_len:
            raise ValueError(f"cache holds at most max_len={self.max_len} positions; "
                             f"{self.length} are used and the chunk adds {t_new}")
        return t_new


class KVCache(_Cache):
    """Preallocated numpy keys and values K, V (B, h, max_len, d_k) of one layer, and the length used."""

    DEFAULT_DTYPE = np.float64

    @classmethod
    def for_module(cls, module: numpy_mha.MultiHeadAttention, B: int, max_len: int) -> KVCache:
        """A cache that fits `module` (its n_heads, d_k and dtype)."""
        return cls(B, module.n_heads, max_len, module.d_k, module.dtype)

    @staticmethod
    def _dtype(dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"dtype must be a floating-point type, got {dtype}")
        return dtype

    def _zeros(self, shape, device) -> np.ndarray:
        if device is not None:
            raise ValueError(f"a numpy cache lives in host memory; got device={device!r}")
        return np.zeros(shape, self.dtype)

    def _check_array(self, name: str, a) -> None:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")


class TorchKVCache(_Cache):
    """Preallocated torch keys and values K, V (B, h, max_len, d_k) of one layer, on one device."""

    DEFAULT_DTYPE = torch.float32

    @classmethod
    def for_module(cls, module: torch_mha.MultiHeadAttention, B: int, max_len: int) -> TorchKVCache:
        """A cache that fits `module` (its n_heads, d_k, dtype and device)."""
        device = module.out_proj.weight.device
        return cls(B, module.n_heads, max_len, module.d_k, module.dtype, device)

    @staticmethod
    def _dtype(dtype) -> torch.dtype:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        return dtype

    def _zeros(self, shape, device) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=device)

    def _check_array(self, name: str, a) -> None:
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(a).__name__}")
        if a.device != self.K.device:
            raise ValueError(f"{name} is on {a.device} but the cache is on {self.K.device}")

    @torch.no_grad()  # decoding is inference: the buffers must not grow an autograd graph
    def append(self, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, h, t_new, d_k) into the next slots; return views K, V (B, h, S, d_k) of all so far."""
        return super().append(k, v)


def _check_decode(module, cache: _Cache, cache_type: type, x_new, align: str) -> None:
    """Check x_new like module.forward does, and that the cache was built for this module and batch."""
    if not isinstance(cache, cache_type):
        raise TypeError(f"cache must be a {cache_type.__name__}, got {type(cache).__name__}")
    B, _, _ = module._check_inputs(x_new, None)  # same errors as forward: shape, dtype, device
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")
    want = (B, module.n_heads, module.d_k, module.dtype)
    got = (cache.B, cache.n_heads, cache.d_k, cache.dtype)
    if got != want:
        raise ValueError(f"cache must be built for (B={B}, n_heads={want[1]}, d_k={want[2]}, "
                         f"dtype={want[3]}) to take x_new {shape_of(x_new)}, got (B={got[0]}, "
                         f"n_heads={got[1]}, d_k={got[2]}, dtype={got[3]})")


def decode_step(module: numpy_mha.MultiHeadAttention, cache: KVCache, x_new: np.ndarray,
                align: str = "bottom_right") -> np.ndarray:
    """Causal attention for x_new (B, t_new, d_model) after the cached positions -> (B, t_new, d_model).

    `align="top_left"` uses offset 0 instead of S - t_new: the bug this module exists to avoid.
    """
    _check_decode(module, cache, KVCache, x_new, align)
    t_new, h = x_new.shape[1], module.n_heads
    # 1) project only the new tokens: the cached positions' k and v never change under a causal mask
    q = steps.linear(x_new, module.Wq, module.bq)  # (B, t_new, d_model)
    k = steps.linear(x_new, module.Wk, module.bk)  # (B, t_new, d_model)
    v = steps.linear(x_new, module.Wv, module.bv)  # (B, t_new, d_model)
    q, k, v = (steps.split_heads(a, h) for a in (q, k, v))  # 2) (B, h, t_new, d_k)
    K, V = cache.append(k, v)  # (B, h, S, d_k): the past and the new positions together
    S = K.shape[2]
    scores = steps.scaled_scores(q, K)  # 3) (B,h,t_new,d_k) @ (B,h,d_k,S) -> (B,h,t_new,S)
    # 4) query i of the chunk is at absolute position S - t_new + i: align the staircase bottom-right
    offset = S - t_new if align == "bottom_right" else 0
    scores = steps.apply_mask(scores, steps.causal_mask(t_new, S, offset=offset))  # (B,h,t_new,S)
    weights = steps.softmax(scores)  # 5) (B, h, t_new, S)
    heads = steps.weighted_sum(weights, V)  # 6) (B,h,t_new,S) @ (B,h,S,d_k) -> (B,h,t_new,d_k)
    merged = steps.merge_heads(heads)  # 7) (B, h, t_new, d_k) -> (B, t_new, d_model) ...
    return steps.linear(merged, module.Wo, module.bo)  # ... then the output projection


@torch.no_grad()  # decoding is inference: no autograd graph across steps
def torch_decode_step(module: torch_mha.MultiHeadAttention, cache: TorchKVCache,
                      x_new: torch.Tensor, align: str = "bottom_right") -> torch.Tensor:
    """Twin of decode_step on the torch module: x_new (B, t_new, d_model) -> (B, t_new, d_model).

    SDPA path: attn_mask=causal_lower_right(t_new, S) (bottom-right); `align="top_left"` passes
    is_causal=True instead, which torch aligns top-left when t_new != S: the bug, shown.
    Manual path (module.use_sdpa=False): the boolean mask from mha.steps.causal_mask.
    """
    _check_decode(module, cache, TorchKVCache, x_new, align)
    t_new, h = x_new.shape[1], module.n_heads
    q, k, v = torch_mha.project_qkv(module, x_new, x_new)  # 1) 3 x (B, t_new, d_model)
    q, k, v = (torch_mha.split_heads(a, h) for a in (q, k, v))  # 2) (B, h, t_new, d_k)
    K, V = cache.append(k, v)  # (B, h, S, d_k)
    S = K.shape[2]
    if module.use_sdpa:  # 3-6) one fused call
        if align == "top_left":
            heads = F.scaled_dot_product_attention(q, K, V, is_causal=True)  # (B, h, t_new, d_k)
        else:
            bias = causal_lower_right(t_new, S)  # query i may see keys s <= S - t_new + i
            heads = F.scaled_dot_product_attention(q, K, V, attn_mask=bias)  # (B, h, t_new, d_k)
    else:  # 3-6) written out, with the numpy staircase as the one source of the mask
        offset = S - t_new if align == "bottom_right" else 0
        allowed = torch.from_numpy(steps.causal_mask(t_new, S, offset=offset)).to(x_new.device)
        heads, _ = torch_mha.manual_attention(q, K, V, allowed)  # (B, h, t_new, d_k)
    merged = torch_mha.merge_heads(heads)  # 7) (B, h, t_new, d_k) -> (B, t_new, d_model) ...
    return module.out_proj(merged)  # ... then the output projection
