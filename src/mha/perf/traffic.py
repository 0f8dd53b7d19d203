"""Where the time goes on a GPU: the HBM bytes and FLOPs of attention, and the roofline.

A kernel needs at least max(FLOPs / peak FLOP/s, bytes / bandwidth) seconds. Their ratio,
the arithmetic intensity (FLOPs per byte of HBM traffic), decides which bound it meets: below
the accelerator's ridge point (peak / bandwidth) it waits for memory, above it for arithmetic.

The counts, all for one attention core (B batch, h heads, T queries, S keys, d = d_k = d_v,
`itemsize` bytes per element; lse and delta in float32):
- `forward_math`: the materialised path (FlashAttention's "standard attention"): scores written
  to HBM and read back for the softmax, the weights written and read back for P V. The mask
  does not save work there: the whole (T, S) is computed and stored.
- `forward_tiled`: FlashAttention-2's forward, one query block at a time. `reuse=False` counts
  every re-read of a K/V tile from HBM (each query block streams the keys again: an upper
  bound); `reuse=True` counts q, k, v read and out written once, as when the re-reads hit the
  L2 cache (the lower bound). Causal tiles above the diagonal are skipped (`flash.tile_schedule`;
  the diagonal aligned bottom-right: query t sees keys s <= t + S - T, as in a KV-cache prefill).
  A ragged last block counts the rows or keys it has, no more: its masked loads read nothing past
  the end. FLOPs count the (query, key) products of the computed tiles, the masked ones of a
  diagonal tile included, the padding of a ragged tile not (a GPU multiplies that by zeros).
- `backward_tiled`: FlashAttention-2's backward: 5 matmuls per tile (the scores recomputed, then
  dV, dP, dQ, dK) where the forward has 2, so 2.5x the forward's FLOPs; q, dout, lse and delta
  re-read per tile and dq read and written back in float32 (FA-2's atomic adds), or, with
  reuse, every tensor read or written once.
- decoding: `kv_cache.decode_step_cost` (one new token reads the whole cache).

Accelerators: `hardware.Accelerator` rows (`hardware.H100_SXM`, `hardware.H200_SXM`: dense bf16
tensor-core peaks and HBM bandwidths from NVIDIA's data sheets, same GH100 chip, the H200 with
HBM3e at 4.8 TB/s instead of HBM3 at 3.35 TB/s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mha.attention.flash import SKIPPED, tile_schedule
from mha.perf.hardware import Accelerator
from mha.validate import require_bool, require_int


def _require_accelerator(acc: object) -> Accelerator:
    if not isinstance(acc, Accelerator):
        raise TypeError(f"acc must be a hardware.Accelerator (e.g. hardware.H100_SXM), got "
                        f"{type(acc).__name__} {acc!r}")
    return acc


@dataclass(frozen=True)
class Traffic:
    """FLOPs and HBM bytes of one kernel."""

    flops: int
    bytes: int

    def __post_init__(self) -> None:
        require_int("flops", self.flops, minimum=0)
        require_int("bytes", self.bytes)  # at least one byte: the intensity divides by it

    @property
    def intensity(self) -> float:
        """FLOPs per byte of HBM traffic."""
        return self.flops / self.bytes

    def seconds(self, acc: Accelerator) -> float:
        """The roofline's lower bound on the time: max(FLOPs / peak, bytes / bandwidth)."""
        peak, bandwidth = _require_accelerator(acc).figures("peak_flops", "bandwidth")
        return max(self.flops / peak, self.bytes / bandwidth)

    def bound(self, acc: Accelerator) -> str:
        """"memory" or "compute": the bound this kernel meets on `acc`."""
        return "memory" if self.intensity < _require_accelerator(acc).ridge else "compute"


LSE_BYTES = 4  # lse and delta stay float32 whatever the inputs' dtype


def _check(B: int, h: int, T: int, S: int, d: int, itemsize: int) -> None:
    for name, value in (("B", B), ("h", h), ("T", T), ("S", S), ("d", d), ("itemsize", itemsize)):
        require_int(name, value)


def forward_math(B: int, h: int, T: int, S: int, d: int, itemsize: int) -> Traffic:
    """The materialised forward: QK^T written, read by the softmax, P written, read by P V."""
    _check(B, h, T, S, d, itemsize)
    per_head = (T * d + S * d + T * S)  # read q, k; write the scores (T, S)
    per_head += 2 * T * S  # softmax: read the scores, write the weights
    per_head += T * S + S * d + T * d  # read the weights and v, write the output
    return Traffic(4 * B * h * T * S * d, itemsize * B * h * per_head)  # causal: still all of (T, S)


def _tiles(T: int, S: int, block_q: int, block_k: int, causal: bool) -> list[tuple[int, int]]:
    """(rows, keys) of each tile a tiled kernel computes: all, or those not above the diagonal.

    A ragged last block counts the rows or keys it really has: its masked loads read nothing
    beyond the end (S = 65 with 64-key blocks is 64 + 1 keys, not 2 x 64).
    """
    block_q, block_k = require_int("block_q", block_q), require_int("block_k", block_k)
    causal = require_bool("causal", causal)
    kinds = tile_schedule(T, S, block_q, block_k, causal=causal, offset=S - T if causal else 0)
    return [(min(block_q, T - i * block_q), min(block_k, S - j * block_k))
            for i, j in zip(*np.nonzero(kinds != SKIPPED), strict=True)]


def forward_tiled(B: int, h: int, T: int, S: int, d: int, itemsize: int, causal: bool = False,
                  block_q: int = 128, block_k: int = 64, reuse: bool = False) -> Traffic:
    """FlashAttention-2's forward: q read and out, lse written once; K/V tiles once per computed tile (or once, reuse)."""
    _check(B, h, T, S, d, itemsize)
    tiles = _tiles(T, S, block_q, block_k, causal)
    pairs = sum(rows * keys for rows, keys in tiles)  # (query, key) products computed
    flops = 4 * B * h * pairs * d  # 2 matmuls of 2 d FLOPs per (query, key) pair
    once = itemsize * (2 * T * d) + LSE_BYTES * T  # q read, out written, lse written
    if require_bool("reuse", reuse):
        kv = itemsize * 2 * S * d  # K and V read once
    else:
        kv = itemsize * 2 * d * sum(keys for _, keys in tiles)  # K and V tiles, per computed tile
    return Traffic(flops, B * h * (once + kv))


def backward_tiled(B: int, h: int, T: int, S: int, d: int, itemsize: int, causal: bool = False,
                   block_q: int = 128, block_k: int = 64, reuse: bool = False) -> Traffic:
    """FlashAttention-2's backward (key blocks outside): FLOPs 2.5x the forward's, bytes as in the module docstring."""
    _check(B, h, T, S, d, itemsize)
    tiles = _tiles(T, S, block_q, block_k, causal)
    flops = 10 * B * h * d * sum(rows * keys for rows, keys in tiles)  # 5 matmuls of 2 d per pair
    if require_bool("reuse", reuse):  # read q, k, v, out, dout, lse, delta once; write dq, dk, dv once
        nbytes = itemsize * (3 * T * d + 2 * S * d + T * d + 2 * S * d) + 2 * LSE_BYTES * T
    else:  # per key block: K, V read and dK, dV written; per tile: q, dout, lse, delta read, dq in float32 read + written
        rows = sum(r for r, _ in tiles)  # query rows summed over the computed tiles
        nbytes = itemsize * 4 * S * d + rows * (itemsize * 2 * d + 2 * LSE_BYTES + 2 * LSE_BYTES * d)
    return Traffic(flops, B * h * nbytes)
