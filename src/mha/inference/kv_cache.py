"""KV cache: decode one token (or a chunk) at a time without recomputing the past keys and values.

Shape legend: B batch, h_kv key/value heads (h for plain MHA), d_k = d_model // h, t_new new
tokens this call, S = keys the new queries read, max_len the most tokens a cache takes.

The idea: under a causal mask, the keys and values of positions 0..S-1 never change once
computed, so keep them in preallocated (B, h_kv, max_len, d_k) arrays and, per step, project
only the new tokens. Each slot also keeps its token's POSITION. The module's forward masks by
positions (`mha.modules.compose.allowed`: key position <= query position), so a chunk of t_new queries
after S - t_new cached keys is aligned bottom-right without any offset arithmetic, a
left-padded batch (pads at position -1) is never read, and a sliding window needs only the
last `window` keys: `window=` makes the cache a ring of `window` slots, O(window) memory (of
max_len slots when the window is longer: such a ring never wraps).
Top-left alignment (what SDPA's `is_causal=True` does when t_new != S) lets the chunk see only
the first keys: wrong, and shown by `align="top_left"`.

numpy and torch twins, same signatures:
    KVCache       / TorchKVCache        keys, values and positions for ONE attention layer
                                        (several layers: a list of caches, one per layer)
    decode_step   / torch_decode_step   (module, cache, x_new (B, t_new, d_model)) -> (B, t_new, d_model):
                                        module.forward(x_new, causal=True, cache=cache)

And what a decoding step costs on an accelerator: `decode_step_cost` counts the FLOPs of one new
token's attention and the bytes of cache it reads, against a peak compute rate and a memory
bandwidth (an H100 SXM's by default, `hardware.H100_SXM`): about 1 FLOP per byte in bf16, far
below the ~295 FLOP per byte where the H100 stops being bound by memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mha.perf.hardware import H100_SXM
from mha.validate import (  # lazy
    is_torch,
    require_float,
    require_int,
    require_shape,
    shape_of,
    torch,
)

ALIGNMENTS = ("bottom_right", "top_left")
"""`align` values of the decode steps: bottom_right is correct; top_left shows the bug."""

EMPTY = -1
"""The position an empty slot (or a pad token) holds: negative positions are never attended."""

@dataclass(frozen=True)
class DecodeCost:
    """One decoding step's attention core on one accelerator: the work, the traffic, the two times."""

    flops: int
    bytes: int
    peak_flops: float
    bandwidth: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte read."""
        return self.flops / self.bytes

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which the accelerator stops being memory-bound: peak / bandwidth."""
        return self.peak_flops / self.bandwidth

    @property
    def compute_s(self) -> float:
        """Seconds the FLOPs take at the peak rate (a lower bound)."""
        return self.flops / self.peak_flops

    @property
    def memory_s(self) -> float:
        """Seconds the bytes take at full bandwidth (a lower bound)."""
        return self.bytes / self.bandwidth

    @property
    def bound(self) -> str:
        """"memory" or "compute": which of the two lower bounds is the larger."""
        return "memory" if self.memory_s >= self.compute_s else "compute"


def decode_step_cost(B: int, h: int, S: int, d_k: int, itemsize: int, n_kv_heads: int | None = None,
                     peak_flops: float = H100_SXM.peak_flops,
                     bandwidth: float = H100_SXM.bandwidth) -> DecodeCost:
    """FLOPs and cache bytes of one layer's attention for one new token per sequence, S positions cached.

    FLOPs: each of the h query heads scores S keys (2 d_k FLOPs each) and sums S values (2 d_k):
    4 * B * h * S * d_k. Bytes: the whole cache, K and V of S positions in n_kv_heads heads,
    read once: 2 * B * n_kv_heads * S * d_k * itemsize. The new q, k, v and the output add
    O(B * h * d_k) and are left out. n_kv_heads None: h (plain multi-head attention).
    """
    B, h, S, d_k = (require_int(n, x) for n, x in (("B", B), ("h", h), ("S", S), ("d_k", d_k)))
    itemsize = require_int("itemsize", itemsize)
    h_kv = h if n_kv_heads is None else require_int("n_kv_heads", n_kv_heads)
    if h % h_kv:
        raise ValueError(f"h={h} must be a multiple of n_kv_heads={h_kv}: each key/value head serves "
                         f"a whole group of query heads")
    for name, rate in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise ValueError(f"{name} must be a positive number, got {rate!r}")
    flops = 4 * B * h * S * d_k  # (B, h, 1, d_k) @ (B, h, d_k, S), then (B, h, 1, S) @ (B, h, S, d_k)
    nbytes = 2 * B * h_kv * S * d_k * itemsize  # K and V, each (B, h_kv, S, d_k)
    return DecodeCost(flops, nbytes, float(peak_flops), float(bandwidth))


class _NumpyArrays:
    """The numpy side of a twin (dense cache or block pool): its dtype, its buffers, its array checks."""

    _noun = "cache"  # what the errors call the object: "cache" or "pool"

    @staticmethod
    def _default_dtype():
        return np.float64

    @staticmethod
    def _dtype(dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"dtype must be a floating-point type, got {dtype}")
        return dtype

    @classmethod
    def _zeros(cls, shape, dtype, device) -> np.ndarray:
        if device is not None:
            raise ValueError(f"a numpy {cls._noun} lives in host memory; got device={device!r}")
        return np.zeros(shape, dtype)

    def _check_array(self, name: str, a) -> None:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")


class _TorchArrays:
    """The torch side of a twin: its dtype, its buffers on one device, its tensor checks."""

    _noun = "cache"

    @staticmethod
    def _default_dtype():
        return torch.float32

    @staticmethod
    def _dtype(dtype):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        return dtype

    @staticmethod
    def _zeros(shape, dtype, device):
        dtype = torch.int64 if dtype == "int64" else dtype
        return torch.zeros(shape, dtype=dtype, device=device)

    def _check_array(self, name: str, a) -> None:
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(a).__name__}")
        if a.device != self.K.device:
            raise ValueError(f"{name} is on {a.device} but the {self._noun} is on {self.K.device}")


class _Cache:
    """Shared logic of KVCache and TorchKVCache; subclasses only allocate and check array types."""

    def __init__(self, B: int, n_heads: int, max_len: int, d_k: int, dtype=None, device=None,
                 window: int | None = None):
        dtype = self._default_dtype() if dtype is None else dtype
        self.B, self.n_heads = require_int("B", B), require_int("n_heads", n_heads)
        self.max_len, self.d_k = require_int("max_len", max_len), require_int("d_k", d_k)
        self.window = None if window is None else require_int("window", window)
        self.dtype, self.length = self._dtype(dtype), 0
        # a ring of `window` slots; a window longer than max_len never wraps in max_len tokens,
        # so max_len slots keep every key it can reach (Mistral's 4,096 for a short generation)
        self.slots = self.max_len if self.window is None else min(self.window, self.max_len)
        shape = (self.B, self.n_heads, self.slots, self.d_k)  # (B, h_kv, slots, d_k)
        self.K, self.V = self._zeros(shape, self.dtype, device), self._zeros(shape, self.dtype, device)
        self.positions = self._zeros((self.B, self.slots), "int64", device) + EMPTY  # (B, slots)

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        ring = f", window={self.window}" if self.window is not None else ""
        return (f"{type(self).__name__}(B={self.B}, n_heads={self.n_heads}, max_len={self.max_len}, "
                f"d_k={self.d_k}, dtype={self.dtype}{ring}, length={self.length})")

    @property
    def nbytes(self) -> int:
        """Memory of K and V together: 2 * B * h_kv * slots * d_k * itemsize (allocated, not used).

        slots = max_len, or min(window, max_len) for a rolling cache. The positions add
        B * slots * 8 bytes.
        """
        return 2 * self.B * self.n_heads * self.slots * self.d_k * self.dtype.itemsize

    def append(self, k, v):
        """Write k, v (B, h, t_new, d_k) at the next positions; return K, V (B, h, S, d_k) of all so far."""
        t_new = self._check_chunk(k, v)
        K, V, _ = self.update(k, v, self.next_positions()[:, None] + self._arange(t_new))
        return K, V

    def update(self, k, v, positions):
        """Store k, v (B, h, t_new, d_k) at positions (B, t_new); return (K, V, key positions) to read.

        A plain cache returns views of slots 0..S-1 (they change with the next update). A rolling
        cache returns its slots followed by the new chunk, (B, h, slots + t_new, d_k), then keeps
        only the newest `slots` keys (slots = min(window, max_len)). Every check runs before the
        first write, so a bad chunk leaves the cache unchanged.
        """
        t_new = self._check_chunk(k, v)
        positions = self._check_positions(positions, t_new)
        if self.window is None:
            start, stop = self.length, self.length + t_new
            self.K[:, :, start:stop], self.V[:, :, start:stop] = k, v  # slots start..stop-1
            self.positions[:, start:stop] = positions
            self.length = stop
            return self.K[:, :, :stop], self.V[:, :, :stop], self.positions[:, :stop]
        K, V = self._cat(self.K, k, 2), self._cat(self.V, v, 2)  # (B, h, slots + t_new, d_k)
        pos = self._cat(self.positions, positions, 1)  # (B, slots + t_new)
        keep = min(t_new, self.slots)  # only the newest `slots` keys can be read again
        slots = [(self.length + t_new - keep + i) % self.slots for i in range(keep)]
        self.K[:, :, slots], self.V[:, :, slots] = k[:, :, t_new - keep:], v[:, :, t_new - keep:]
        self.positions[:, slots] = positions[:, t_new - keep:]
        self.length += t_new
        return K, V, pos

    def next_positions(self):
        """(B,) the position each sequence's next token takes: one past the largest it holds."""
        if self.length == 0:
            return self._arange(self.B) * 0
        return self.positions.amax(-1) + 1 if is_torch(self.positions) else self.positions.max(-1) + 1

    def truncate(self, length: int) -> None:
        """Forget every token after the first `length` (a plain cache only): they are written again next."""
        length = require_int("length", length, minimum=0)
        if self.window is not None or length > self.length:
            raise ValueError(f"truncate needs a plain cache and length <= {self.length}, got "
                             f"length={length} (window={self.window})")
        self.positions[:, length:] = EMPTY
        self.length = length

    def reset(self) -> None:
        """Empty the cache (and zero the buffers, so stale keys cannot be mistaken for live ones)."""
        self.K[...] = 0
        self.V[...] = 0
        self.positions[...] = EMPTY
        self.length = 0

    def _check_chunk(self, k, v) -> int:
        """Check k, v against the cache (array type, dtype, shape, room left); return t_new."""
        expected = (("B", self.B), ("h", self.n_heads), ("t_new", None), ("d_k", self.d_k))
        t_new = check_kv(k, v, expected, self.dtype, self._check_array, "cache")
        self.check_room(t_new)
        return t_new

    def check_room(self, t_new: int) -> None:
        """Raise unless t_new more tokens fit (max_len tokens in all, rolling or not)."""
        if self.length + t_new > self.max_len:
            raise ValueError(f"cache holds at most max_len={self.max_len} positions; "
                             f"{self.length} are used and the chunk adds {t_new}")

    def _check_positions(self, positions, t_new: int):
        """positions (B, t_new) whole numbers, after every position already cached in that row."""
        self._check_array("positions", positions)
        require_shape("positions", positions, (("B", self.B), ("t_new", t_new)))
        if "int" not in str(positions.dtype):
            raise TypeError(f"positions must hold whole numbers, got dtype {positions.dtype}")
        if self.length:
            last = self.next_positions() - 1  # (B,): the latest position each row holds
            clash = (positions >= 0) & (positions <= last[:, None])  # (B, t_new); pads exempt
            if bool(clash.any()):
                b, t = (int(i) for i in np.argwhere(_host(clash))[0])
                raise ValueError(f"positions must come after the cached ones: sequence {b} holds up "
                                 f"to position {int(last[b])}, and the chunk has {int(positions[b, t])}")
        return positions


def check_kv(k, v, expected: tuple, dtype, check_array, noun: str) -> int:
    """Check a chunk k, v (B, h_kv, t_new, d_k) for a cache or pool: array type, dtype, shape; -> t_new.

    `expected` names each axis and its size (None: any); `check_array(name, a)` is the twin's
    array-type check; `noun` ("cache" or "pool") is what the dtype error says it must match.
    """
    for name, a in (("k", k), ("v", v)):
        check_array(name, a)
        require_float(name, a)
        if a.dtype != dtype:
            raise TypeError(f"{name} must be {dtype} to match the {noun}, got {a.dtype}")
        require_shape(name, a, expected)
    if shape_of(v) != shape_of(k):
        raise ValueError(f"v must have the shape of k {shape_of(k)}, got {shape_of(v)}")
    t_new = shape_of(k)[2]
    if t_new == 0:
        raise ValueError(f"k must add at least one position (t_new >= 1), got {shape_of(k)}")
    return t_new


def _host(a):
    """a as a numpy array (a torch tensor is copied to the host)."""
    return a.detach().cpu().numpy() if is_torch(a) else a


class KVCache(_NumpyArrays, _Cache):
    """numpy keys and values K, V (B, h_kv, slots, d_k) of one layer, their positions, the length used."""

    @classmethod
    def for_module(cls, module, B: int, max_len: int) -> KVCache:
        """A cache that fits `module` (its n_kv_heads, d_k, dtype; a ring if it has a window)."""
        return module.new_cache(B, max_len)

    @staticmethod
    def _arange(n: int) -> np.ndarray:
        return np.arange(n)

    @staticmethod
    def _cat(a, b, axis: int) -> np.ndarray:
        return np.concatenate([a, b], axis=axis)



class TorchKVCache(_TorchArrays, _Cache):
    """torch keys and values K, V (B, h_kv, slots, d_k) of one layer on one device, and their positions."""

    @classmethod
    def for_module(cls, module, B: int, max_len: int) -> TorchKVCache:
        """A cache that fits `module` (its n_kv_heads, d_k, dtype, device; a ring if it has a window)."""
        return module.new_cache(B, max_len)

    def _arange(self, n: int):
        return torch.arange(n, device=self.K.device)

    @staticmethod
    def _cat(a, b, axis: int):
        return torch.cat([a, b], dim=axis)

    def update(self, k, v, positions):
        """Store k, v (B, h, t_new, d_k) at positions (B, t_new); return (K, V, key positions) to read."""
        with torch.no_grad():  # decoding is inference: the buffers must not grow an autograd graph
            return super().update(k, v, positions)


def _top_left(module, cache: _Cache, x_new, align: str):
    """None for the correct alignment; for "top_left", the staircase from key 0 that shows the bug."""
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")
    if align == "bottom_right":
        return None
    t_new = shape_of(x_new)[1] if len(shape_of(x_new)) == 3 else 1
    tril = np.tril(np.ones((t_new, len(cache) + t_new), dtype=bool))  # (t_new, S): offset 0
    return torch.as_tensor(tril, device=x_new.device) if is_torch(x_new) else tril


def decode_step(module, cache: KVCache, x_new: np.ndarray, align: str = "bottom_right") -> np.ndarray:
    """Causal attention for x_new (B, t_new, d_model) after the cached positions -> (B, t_new, d_model).

    The module's own forward with the cache: its causal mask compares positions, so query i of
    the chunk (at position S - t_new + i) sees keys 0..S - t_new + i. `align="top_left"` masks
    with the staircase from key 0 instead (offset 0): the bug this module exists to avoid.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    top_left = _top_left(module, cache, x_new, align)
    return module.forward(x_new, causal=top_left is None, mask=top_left, cache=cache)


def torch_decode_step(module, cache: TorchKVCache, x_new, align: str = "bottom_right"):
    """Twin of decode_step on the torch module: x_new (B, t_new, d_model) -> (B, t_new, d_model).

    Inference only (no autograd graph across steps). `align="top_left"` is what SDPA's
    `is_causal=True` does when t_new != S: the bug, shown.
    """
    if not isinstance(cache, TorchKVCache):
        raise TypeError(f"cache must be a TorchKVCache, got {type(cache).__name__}")
    top_left = _top_left(module, cache, x_new, align)
    with torch.no_grad():
        return module.forward(x_new, causal=top_left is None, mask=top_left, cache=cache)
