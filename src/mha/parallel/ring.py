"""Attention across devices: ring attention and DeepSpeed-Ulysses, one rank's algorithm, two transports.

When one sequence no longer fits one device, its T tokens are split over W ranks:
- **Ring attention** keeps each rank's queries and passes the key/value blocks round a ring,
  one step per rank; each rank merges the partial results with the logsumexp merge of
  12_flash_attention.ipynb (`torch_attention.merge_partials`: from each part's output o and logsumexp L,
  L = logaddexp(L_A, L_B) and o = exp(L_A - L) o_A + exp(L_B - L) o_B), so the answer is exact.
- **Ulysses** trades the sequence split for a head split with one all-to-all: each rank then
  holds every token of h / W heads, runs the ordinary core, and a second all-to-all trades back.

Each rank's algorithm is written once, as a two-way generator: `got = yield sent` hands `sent`
to whoever drives it and resumes with what they pass to `send()` (`ring_rank`, `ulysses_rank`). `simulate` drives W of them in one process, with
ranks as list entries; `mha.parallel.launch` drives one per process over torch.distributed. The block
attention is the torch core's manual path with its logsumexp (`torch_attention.attention_lse`).

Layouts: "contiguous" gives rank r tokens [r T/W, (r+1) T/W); "zigzag" cuts T into 2W chunks
and gives rank r chunks r and 2W-1-r. A rank scores only the part of a block its mask lets it
see when that part is one rectangle (`visible_tile`): under a causal mask in the zigzag layout a
block from an earlier rank is read on its first half of keys, one from a later rank by the
second half of the queries, so every rank scores the same number of (query, key) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from mha.attention.torch_attention import (
    attention,
    attention_lse,
    compute_dtype,
    masked_scores,
    merge_partials,
    repeat_kv,
    upcast,
)
from mha.modules.torch_mha import MultiHeadAttention
from mha.validate import require_int, require_shape, require_tensor

LAYOUTS = ("contiguous", "zigzag")


def _require_tensor(name: str, x: Any, what: str) -> None:
    """Raise TypeError unless x is a floating-point torch.Tensor (`what` names its expected shape)."""
    require_tensor(name, x, what)
    if not x.is_floating_point():
        raise TypeError(f"{name} must hold floating-point numbers, got dtype {x.dtype}")


def check_qkv(q: Any, k: Any, v: Any, dout: Any = None) -> tuple[int, int, int, int, int]:
    """Check q (B, h, T, d_k), k, v (B, h_kv, T, d_k) and an optional dout like q; -> (B, h, h_kv, T, d_k).

    One dtype and device for all, h_kv dividing h (grouped-query attention), every size >= 1:
    a clear error naming what was expected and what arrived, before any work starts.
    """
    given = [("q", q), ("k", k), ("v", v)] + ([("dout", dout)] if dout is not None else [])
    for name, t in given:
        _require_tensor(name, t, "(B, h, T, d_k)" if name in ("q", "dout") else "(B, h_kv, T, d_k)")
    require_shape("q", q, (("B", None), ("h", None), ("T", None), ("d_k", None)))
    B, h, T, d_k = (int(n) for n in q.shape)
    require_shape("k", k, (("B", B), ("h_kv", None), ("T", T), ("d_k", d_k)))
    h_kv = int(k.shape[1])
    require_shape("v", v, (("B", B), ("h_kv", h_kv), ("T", T), ("d_k", d_k)))
    if min(B, h, T, d_k, h_kv) < 1:
        raise ValueError(f"q (B, h, T, d_k) and k (B, h_kv, T, d_k) need every size >= 1, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}")
    if dout is not None:
        require_shape("dout", dout, (("B", B), ("h", h), ("T", T), ("d_k", d_k)))
    if h % h_kv:
        raise ValueError(f"k and v must have a number of heads h_kv that divides q's h={h} "
                         f"(grouped-query attention), got h_kv={h_kv}")
    for name, t in given[1:]:
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{name} must have q's dtype and device ({q.dtype} on {q.device}), got "
                            f"{t.dtype} on {t.device}")
    return B, h, h_kv, T, d_k


def check_split(T: int, world_size: int, layout: str) -> int:
    """Check that T tokens split over world_size ranks in `layout`; return the tokens per rank."""
    T = require_int("T", T)
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    pieces = world_size * (2 if layout == "zigzag" else 1)
    if T % pieces:
        raise ValueError(f"the {layout} layout cuts T into {pieces} equal pieces for world_size="
                         f"{world_size}, but T={T} is not divisible by {pieces}")
    return T // world_size


def rank_positions(T: int, world_size: int, layout: str = "contiguous") -> list[torch.Tensor]:
    """The global token positions each rank holds, [(T / W,) int64 tensor per rank]."""
    check_split(T, world_size, layout)
    if layout == "contiguous":
        return list(torch.arange(T).chunk(world_size))
    chunks = torch.arange(T).chunk(2 * world_size)  # 2W chunks of T / 2W positions
    return [torch.cat([chunks[r], chunks[2 * world_size - 1 - r]]) for r in range(world_size)]


def shard(x: torch.Tensor, world_size: int, layout: str = "contiguous", dim: int = 2
          ) -> list[torch.Tensor]:
    """Split x along its sequence axis `dim` into the ranks' pieces (contiguous copies)."""
    require_tensor("x", x)
    dim = _check_dim(dim, x.ndim, "x")
    pos = rank_positions(x.shape[dim], world_size, layout)
    return [x.index_select(dim, p).contiguous() for p in pos]


def unshard(pieces: Sequence[torch.Tensor], layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The inverse of `shard`: put the ranks' pieces back in sequence order."""
    if isinstance(pieces, torch.Tensor) or not isinstance(pieces, Sequence) or not pieces:
        raise TypeError(f"pieces must be a non-empty list of tensors (one per rank), got "
                        f"{type(pieces).__name__}")
    if not all(isinstance(p, torch.Tensor) for p in pieces):
        raise TypeError(f"pieces must all be torch.Tensors, got "
                        f"{[type(p).__name__ for p in pieces]}")
    dim = _check_dim(dim, pieces[0].ndim, "pieces[0]")
    shapes = [tuple(p.shape) for p in pieces]
    if len(set(shapes)) > 1 or len({p.dtype for p in pieces}) > 1:
        raise ValueError(f"every rank's piece must have one shape and dtype (shard cuts equal "
                         f"pieces), got shapes {shapes} and dtypes {[str(p.dtype) for p in pieces]}")
    W = len(pieces)
    T = sum(p.shape[dim] for p in pieces)
    order = torch.cat(rank_positions(T, W, layout))  # (T,) global position of each gathered row
    return torch.cat(list(pieces), dim=dim).index_select(dim, torch.argsort(order))


def _check_dim(dim: Any, ndim: int, name: str) -> int:
    """dim as a non-negative axis of a tensor with ndim axes, or a clear error."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"dim must be an axis of {name}, an int in [-{ndim}, {ndim}), got {dim!r}")
    return dim % ndim


def block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """(T_q, T_k) True where a query at q_pos may see a key at k_pos (None: every key)."""
    for name, t in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not isinstance(t, torch.Tensor) or t.ndim != 1:
            got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 1-d tensor of global positions, got {got}")
    return (k_pos[None, :] <= q_pos[:, None]) if causal else None  # (T_q, T_k)


Rule = Callable[[torch.Tensor, torch.Tensor], tuple[Any, Any]]  # (q_pos, k_pos) -> (allowed, bias)
RingMessage = tuple[torch.Tensor, ...]  # (k, v, k_pos) passed on; + (dk, dv) going backward


def causal_rule(causal: bool) -> Rule:
    """The rule of plain attention: (q_pos, k_pos) -> (causal block mask or None, no bias)."""
    return lambda q_pos, k_pos: (block_mask(q_pos, k_pos, causal), None)


Tile = tuple[slice, slice, Any]  # (query rows, key columns, mask or None) of a block to score


def visible_tile(allowed: Any) -> Tile | None:
    """The part of a block to score, from its mask (.., T_q, S): None when it hides every pair.

    Where the allowed pairs fill one rectangle, rows r0:r1 by keys c0:c1 (the same for every
    batch item and head), only that rectangle is scored, with no mask: it is exact, because
    every pair outside it is masked and every pair inside it allowed. This is ring-flash-
    attention's rule for the zigzag layout under a causal mask: a block from an earlier rank is
    read by all the queries on its first half of keys, one from a later rank by the second half
    of the queries on all its keys. Any other mask (the own block's staircase, a window's band)
    gets the whole block, masked; allowed None (no mask) the whole block, unmasked.
    """
    whole = slice(None)
    if allowed is None:
        return whole, whole, None
    if not bool(allowed.any()):
        return None
    flat = allowed.reshape(-1, *allowed.shape[-2:])  # (n, T_q, S): every batch item and head
    rows = flat.any(-1).any(0).nonzero().flatten()  # queries that see some key
    cols = flat.any(-2).any(0).nonzero().flatten()  # keys some query sees
    box = slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1)
    if bool(flat[:, box[0], box[1]].all()):  # the bounding box is all allowed: it is the set
        return box[0], box[1], None
    return whole, whole, allowed


def _cut(t: Any, rows: slice, cols: slice) -> Any:
    """A mask or bias (.., T_q|1, S|1) cut to a tile's rows and columns (a broadcast axis stays)."""
    if t is None:
        return None
    return t[..., rows if t.shape[-2] > 1 else slice(None), cols if t.shape[-1] > 1 else slice(None)]


def _span(part: slice, n: int) -> tuple[int, int]:
    """(start, stop) of a tile's slice over n rows or columns."""
    start, stop, _ = part.indices(n)
    return start, stop


def _count(stats: dict | None, q: torch.Tensor, rows: slice, keys: slice, S: int,
           tile: tuple | None = None) -> None:
    """Add one computed tile to stats: "blocks" + 1, "scores" + B h rows keys (entries scored)."""
    if stats is None:
        return
    r0, r1 = _span(rows, q.shape[-2])
    c0, c1 = _span(keys, S)
    stats["blocks"] = stats.get("blocks", 0) + 1
    stats["scores"] = stats.get("scores", 0) + q.shape[0] * q.shape[1] * (r1 - r0) * (c1 - c0)
    if "tiles" in stats and tile is not None:
        stats["tiles"].append(tile)  # (query positions, key positions, masked?) for a picture


def _merge_rows(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, o_lse: torch.Tensor,
                rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge a tile's (o (B,h,R,d_k), o_lse (B,h,R)) into rows `rows` of the running (out, lse)."""
    r0, r1 = _span(rows, out.shape[-2])
    m_out, m_lse = merge_partials(out[..., r0:r1, :], lse[..., r0:r1], o, o_lse)  # (B, h, R, ..)
    return (torch.cat([out[..., :r0, :], m_out, out[..., r1:, :]], dim=-2),  # (B, h, T_r, d_k)
            torch.cat([lse[..., :r0], m_lse, lse[..., r1:]], dim=-1))  # (B, h, T_r)


def _widen(g: torch.Tensor, part: slice, n: int) -> torch.Tensor:
    """A tile's gradient (B, h, R, d_k) as the whole block's (B, h, n, d_k): zeros elsewhere."""
    start, stop = _span(part, n)
    return F.pad(g, (0, 0, start, n - stop))  # (B, h, n, d_k)


def _check_rank(q: Any, k: Any, v: Any, pos: Any, world_size: int) -> None:
    """The checks of one rank's generator: its shards as `check_qkv`, pos (T_r,), world_size."""
    require_int("world_size", world_size)
    T_r = check_qkv(q, k, v)[3]
    if not isinstance(pos, torch.Tensor) or pos.shape != (T_r,) or pos.is_floating_point():
        got = tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__
        raise ValueError(f"pos must be the rank's global positions, an int tensor of shape "
                         f"(T_r={T_r},), got {got}")


def _full_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v (B, h_kv, S, d_k) repeated to q's h heads (grouped-query attention), else as they are."""
    n_rep = q.shape[1] // k.shape[1]
    return repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, h, S, d_k) each


def ring_rank(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
              world_size: int, causal: bool = False, stats: dict | None = None,
              rule: Rule | None = None, out_dtype: torch.dtype | None = None,
              ) -> Generator[RingMessage, RingMessage, tuple[torch.Tensor, torch.Tensor]]:
    """One rank of ring attention: q (B, h, T_r, d_k), k, v (B, h_kv, T_r, d_k) at global positions pos (T_r,).

    At each of the W steps it attends to the part of the block it holds that its queries may see
    (`visible_tile`: nothing, one unmasked rectangle, or the whole block masked), then yields the
    block to send on to rank + 1 and receives rank - 1's. `rule(q_pos, k_pos) -> (allowed, bias)`
    gives the mask and bias of a block (default: causal or none, `causal_rule`). Returns
    (out (B, h, T_r, d_k) in `out_dtype` (default q's), lse (B, h, T_r) in the compute dtype);
    stats: "blocks" computed, "scores" entries scored. The backward takes out unrounded
    (out_dtype=compute_dtype(q.dtype)): its rowsum(dO * O) then carries no bfloat16 rounding.
    """
    _check_rank(q, k, v, pos, world_size)
    rule = causal_rule(causal) if rule is None else rule
    B, h, T_r, d_k = q.shape
    work = compute_dtype(q.dtype)  # float32 for bfloat16 / float16: merge in float32, round once
    out = torch.zeros_like(q, dtype=work)  # (B, h, T_r, d_k): no keys yet ...
    lse = torch.full((B, h, T_r), float("-inf"), dtype=work, device=q.device)  # ... no mass
    k_pos = pos
    for step in range(world_size):
        allowed, bias = rule(pos, k_pos)  # (.., T_r, T_r) or None each
        tile = visible_tile(allowed)
        if tile is not None:
            rows, keys, mask = tile  # only the rectangle the mask shows, or the whole block masked
            kt, vt = _full_heads(q, k[..., keys, :], v[..., keys, :])  # (B, h, S_t, d_k) each
            o, o_lse = attention_lse(q[..., rows, :], kt, vt, mask, _cut(bias, rows, keys))
            out, lse = _merge_rows(out, lse, o, o_lse, rows)  # (B,h,T_r,d_k), (B,h,T_r)
            _count(stats, q, rows, keys, T_r, (pos[rows], k_pos[keys], mask is not None))
        if step < world_size - 1:
            k, v, k_pos = yield (k, v, k_pos)  # send on, receive the left neighbour's block
    return out.to(q.dtype if out_dtype is None else out_dtype), lse


def block_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                   dout: torch.Tensor, delta: torch.Tensor, allowed: Any = None, bias: Any = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients from one key block: -> (dq (B,h,T,d_k), dk, dv (B,h_kv,S,d_k)).

    The softmax backward of 15_backward_pass.ipynb, block by block as FlashAttention-2 does it:
    P = exp(scores - lse) is recomputed from the final logsumexp lse (B, h, T), so it is this
    block's share of the whole row; delta = rowsum(dout * out) (B, h, T) stands in for the sum
    over every key of P * dP. All three come in the compute dtype (float32 for float16 /
    bfloat16): they are partial sums, to be added up over blocks and rounded once at the end.
    """
    q, k, v, lse, dout, delta, bias = upcast(q, k, v, lse, dout, delta, bias)  # float32 if low
    kr, vr = _full_heads(q, k, v)  # (B, h, S, d_k)
    base = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # rows with no key: P = 0
    p = torch.exp(masked_scores(q, kr, allowed, bias) - base[..., None])  # (B, h, T, S)
    dp = dout @ vr.transpose(-2, -1)  # (B,h,T,d_k) @ (B,h,d_k,S) -> (B,h,T,S)
    ds = p * (dp - delta[..., None]) / math.sqrt(q.shape[-1])  # (B, h, T, S): d scores, scaled
    dq = ds @ kr  # (B,h,T,S) @ (B,h,S,d_k) -> (B,h,T,d_k)
    dk = ds.transpose(-2, -1) @ q  # (B,h,S,T) @ (B,h,T,d_k) -> (B,h,S,d_k)
    dv = p.transpose(-2, -1) @ dout  # (B,h,S,T) @ (B,h,T,d_k) -> (B,h,S,d_k)
    B, h_kv, S, d_k = k.shape
    fold = (B, h_kv, q.shape[1] // h_kv, S, d_k)  # a shared K/V head sums its group's gradients
    return dq, dk.reshape(fold).sum(2), dv.reshape(fold).sum(2)  # (B, h_kv, S, d_k)


def ring_rank_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor, world_size: int,
                       causal: bool = False, stats: dict | None = None, rule: Rule | None = None,
                       block_grads: Callable[..., tuple] | None = None,
                       ) -> Generator[RingMessage, RingMessage, tuple[torch.Tensor, ...]]:
    """One rank of ring attention's backward (hand-derived): -> (dq, dk, dv) of its own shard.

    The K/V blocks go round the ring again, each with the dk, dv gathered so far: every rank adds
    what its queries contribute (`block_backward`) and passes the block on. After W - 1 steps a
    rank holds its right neighbour's block, so one more step (dk, dv only) brings every block's
    gradient home. dq stays on its rank. Arguments as `ring_rank`, plus its out, lse and dout;
    `block_grads` is the per-block gradient (default `block_backward`; a lesson passes a wrong one),
    given the tile of the block that the forward scored (`visible_tile`). dq, dk and dv add up,
    and dk, dv travel, in the compute dtype (float32 for float16 / bfloat16), rounded at the end.
    """
    _check_rank(q, k, v, pos, world_size)
    legend = tuple(zip(("B", "h", "T", "d_k"), q.shape, strict=True))  # q's (B, h, T_r, d_k)
    for name, t, want in (("out", out, legend), ("lse", lse, legend[:3]), ("dout", dout, legend)):
        _require_tensor(name, t, "like q" if name != "lse" else "(B, h, T)")
        require_shape(name, t, want)
    rule = causal_rule(causal) if rule is None else rule
    block_grads = block_backward if block_grads is None else block_grads
    T_r = q.shape[2]
    delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(-1)  # (B, h, T_r): rowsum(dO * O), 15_backward_pass.ipynb
    dq = torch.zeros_like(q, dtype=lse.dtype)  # (B, h, T_r, d_k), summed in float32 if low
    dk, dv = (torch.zeros_like(t, dtype=lse.dtype) for t in (k, v))  # (B, h_kv, T_r, d_k): so are
    k_pos = pos  # the held block's dk, dv, and they travel in float32: rounded once, at home
    for step in range(world_size):
        allowed, bias = rule(pos, k_pos)
        tile = visible_tile(allowed)  # the same part of the block as the forward scored
        if tile is not None:
            rows, keys, mask = tile
            g_q, g_k, g_v = block_grads(q[..., rows, :], k[..., keys, :], v[..., keys, :],
                                        lse[..., rows], dout[..., rows, :], delta[..., rows],
                                        mask, _cut(bias, rows, keys))
            dq = dq + _widen(g_q, rows, T_r)  # (B, h, T_r, d_k)
            dk, dv = dk + _widen(g_k, keys, T_r), dv + _widen(g_v, keys, T_r)  # (B, h_kv, T_r, d_k)
            _count(stats, q, rows, keys, T_r)
        if step < world_size - 1:
            k, v, k_pos, dk, dv = yield (k, v, k_pos, dk, dv)  # the block and its gradient move on
    if world_size > 1:
        dk, dv = yield (dk, dv)  # one more step: each block's gradient reaches its owner
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def ulysses_rank(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                 world_size: int, causal: bool = False, rule: Rule | None = None,
                 rank: int = 0) -> Generator[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """One rank of Ulysses: q (B, h, T_r, d_k), k, v (B, h_kv, T_r, d_k) of its tokens at positions pos (T_r,).

    All-to-all 1 sends head group j of its tokens to rank j and receives every rank's tokens
    of its own head group: q (B, h / W, T, d_k), k, v (B, h_kv / W, T, d_k). The core attends
    over the whole sequence; all-to-all 2 sends each rank's tokens back. `rule` as in
    `ring_rank`; `rank` picks this rank's heads of a per-head bias. Returns out (B, h, T_r, d_k).
    """
    _check_rank(q, k, v, pos, world_size)
    B, h, T_r, d_k = q.shape
    for name, heads in (("h", h), ("h_kv", k.shape[1])):
        if heads % world_size:
            raise ValueError(f"Ulysses gives each of the world_size={world_size} ranks {name} / W "
                             f"heads, but {name}={heads} is not divisible by {world_size}")
    rule = causal_rule(causal) if rule is None else rule
    g, g_kv = h // world_size, k.shape[1] // world_size  # heads per rank after the exchange
    groups = [t[:, j * n:(j + 1) * n].contiguous() for t, n in ((q, g), (k, g_kv), (v, g_kv))
              for j in range(world_size)]  # 3 runs of W: head group j of my tokens, for rank j
    got = yield groups + [pos.contiguous()] * world_size  # every rank: its group, all tokens
    W = world_size
    qg, kg, vg = (torch.cat(got[i * W:(i + 1) * W], dim=2) for i in range(3))  # (B, g|g_kv, T, d_k)
    all_pos = torch.cat(got[3 * W:])  # (T,) their global positions, in rank order
    mask, bias = rule(all_pos, all_pos)  # (.., T, T): the global mask, any layout
    if bias is not None and bias.shape[-3] == h:
        bias = bias[..., rank * g:(rank + 1) * g, :, :]  # (B|1, g, T, T): my heads' bias
    heads, _ = attention(qg, kg, vg, mask, bias, backend="manual")  # (B, g, T, d_k): the core
    back = yield list(heads.split(T_r, dim=2))  # rank j's tokens back to rank j
    return torch.cat(back, dim=1)  # (B, h, T_r, d_k): head groups in order


def simulate(ranks: Sequence[Generator], pattern: str) -> list[Any]:
    """Drive W rank generators in one process; pattern "ring" (send to r+1) or "all_to_all".

    A ring message goes from rank r to rank r + 1; an all-to-all message is a list whose entry
    j goes to rank j (entries W.. are a second list of W). Returns each rank's result.
    """
    if pattern not in ("ring", "all_to_all"):
        raise ValueError(f"pattern must be 'ring' or 'all_to_all', got {pattern!r}")
    if isinstance(ranks, Generator) or not ranks or not all(isinstance(g, Generator) for g in ranks):
        raise TypeError(f"ranks must be a non-empty list of rank generators (ring_rank(...), "
                        f"ulysses_rank(...)), got {type(ranks).__name__}")
    W, results, sent = len(ranks), [None] * len(ranks), [None] * len(ranks)
    for r in range(W):
        sent[r] = _advance(ranks[r], None, results, r)
    while any(s is not None for s in sent):
        got = _deliver(sent, pattern)
        sent = [_advance(ranks[r], got[r], results, r) if sent[r] is not None else None
                for r in range(W)]
    return results


def _advance(gen: Generator, message: Any, results: list, r: int) -> Any:
    """Send `message` into rank r's generator; its next outgoing message, or None when it returned."""
    try:
        return next(gen) if message is None else gen.send(message)
    except StopIteration as done:
        results[r] = done.value
        return None


def _deliver(sent: list, pattern: str) -> list:
    """What each rank receives, given what every rank sent."""
    W = len(sent)
    if any(s is None for s in sent):
        raise RuntimeError("ranks out of step: some finished while others still send")
    if pattern == "ring":
        return [sent[(r - 1) % W] for r in range(W)]  # from the left neighbour
    n = len(sent[0]) // W  # lists of W entries, n lists back to back
    return [[sent[src][block * W + r] for block in range(n) for src in range(W)]
            for r in range(W)]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int,
                   layout: str = "contiguous", causal: bool = False,
                   ) -> tuple[torch.Tensor, list[int]]:
    """Ring attention on W simulated ranks: q, k, v (B, h, T, d_k) -> (out (B, h, T, d_k), blocks per rank).

    k, v may have h_kv heads dividing h. A block counts when some part of it is scored.
    """
    _refuse_before_launch("ring", check_qkv(q, k, v)[3], q.shape[1:2] + k.shape[1:2], world_size,
                          layout)
    stats = [{} for _ in range(world_size)]
    pos = rank_positions(q.shape[2], world_size, layout)
    qs, ks, vs = (shard(t, world_size, layout) for t in (q, k, v))  # W x (B, h, T / W, d_k)
    ranks = [ring_rank(qs[r], ks[r], vs[r], pos[r], world_size, causal, stats[r])
             for r in range(world_size)]
    outs = [out for out, _ in simulate(ranks, "ring")]
    return unshard(outs, layout), [s.get("blocks", 0) for s in stats]


def ring_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                  world_size: int, layout: str = "contiguous", causal: bool = False,
                  block_grads: Callable[..., tuple] | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ring attention's hand-derived backward on W simulated ranks: -> (dq, dk, dv), each (B, h, T, d_k).

    The forward ring first (each rank keeps its out and lse), then `ring_rank_backward`
    (with `block_grads`, default `block_backward`). dout (B, h, T, d_k) like q.
    """
    _refuse_before_launch("ring", check_qkv(q, k, v, dout)[3], q.shape[1:2] + k.shape[1:2],
                          world_size, layout)
    pos = rank_positions(q.shape[2], world_size, layout)
    qs, ks, vs, dos = (shard(t, world_size, layout) for t in (q, k, v, dout))  # W x (B,h,T/W,d_k)
    work = compute_dtype(q.dtype)  # the forward's out kept unrounded for the backward's delta
    fwd = simulate([ring_rank(qs[r], ks[r], vs[r], pos[r], world_size, causal, out_dtype=work)
                    for r in range(world_size)], "ring")
    grads = simulate([ring_rank_backward(qs[r], ks[r], vs[r], pos[r], *fwd[r], dos[r], world_size,
                                         causal, block_grads=block_grads)
                      for r in range(world_size)], "ring")
    return tuple(unshard([g[i] for g in grads], layout) for i in range(3))


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int,
                      layout: str = "contiguous", causal: bool = False) -> torch.Tensor:
    """Ulysses on W simulated ranks: q, k, v (B, h, T, d_k) -> out (B, h, T, d_k)."""
    _refuse_before_launch("ulysses", check_qkv(q, k, v)[3], q.shape[1:2] + k.shape[1:2],
                          world_size, layout)
    pos = rank_positions(q.shape[2], world_size, layout)
    qs, ks, vs = (shard(t, world_size, layout) for t in (q, k, v))  # W x (B, h, T / W, d_k)
    ranks = [ulysses_rank(qs[r], ks[r], vs[r], pos[r], world_size, causal, rank=r)
             for r in range(world_size)]
    return unshard(simulate(ranks, "all_to_all"), layout)


def causal_work(T: int, world_size: int, layout: str) -> list[int]:
    """Allowed (query, key) pairs of each rank's queries under a causal mask: the least work it can do.

    What the ring code really scores, masked entries included, is `ring_stats`' "scores".
    """
    pos = rank_positions(T, world_size, layout)
    every = torch.arange(T)
    return [int((every[None, :] <= p[:, None]).sum()) for p in pos]


def ring_stats(T: int, world_size: int, layout: str = "contiguous", causal: bool = True
               ) -> list[dict]:
    """What each rank of the simulated ring computes for T tokens (B = h = 1): the code's own count.

    One dict per rank: "blocks" (blocks with something scored), "scores" (score entries
    computed, masked ones included) and "tiles", a list of (query positions, key positions,
    masked?) of each rectangle it scored. It runs `ring_rank` on zeros of width 1.
    """
    check_split(T, world_size, layout)
    x = torch.zeros(1, 1, T, 1)  # (B, h, T, d_k): the work does not depend on the values
    pos = rank_positions(T, world_size, layout)
    xs = shard(x, world_size, layout)  # W x (1, 1, T / W, 1)
    stats: list[dict] = [{"tiles": []} for _ in range(world_size)]
    with torch.no_grad():
        simulate([ring_rank(xs[r], xs[r], xs[r], pos[r], world_size, causal, stats[r])
                  for r in range(world_size)], "ring")
    return [{"blocks": 0, "scores": 0, **s} for s in stats]



def run_rank(gen: Generator, pattern: str, stats: dict | None = None) -> Any:
    """Drive this process's rank generator over torch.distributed (the default process group).

    "ring": each message (a tuple of tensors) goes to rank + 1 and rank - 1's arrives, with one
    `batch_isend_irecv`. "all_to_all": a message of n * W tensors, entry j of each W for rank j,
    exchanged with one `all_to_all_single` per W (entries of one W share a shape on all ranks).
    `stats["bytes_sent"]` adds up what this rank sent. Returns the generator's result.
    """
    import torch.distributed as dist

    rank, W = dist.get_rank(), dist.get_world_size()
    try:
        message = next(gen)
        while True:
            if pattern == "ring":
                got = _ring_exchange(message, rank, W)
            elif pattern == "all_to_all":
                got = _all_to_all_exchange(message, W)
            else:
                raise ValueError(f"pattern must be 'ring' or 'all_to_all', got {pattern!r}")
            if stats is not None:
                sent = message if pattern == "ring" else [m for i, m in enumerate(message)
                                                          if i % W != rank]
                stats["bytes_sent"] = stats.get("bytes_sent", 0) + sum(
                    t.numel() * t.element_size() for t in sent)
            message = gen.send(got)
    except StopIteration as done:
        return done.value


def _ring_exchange(message: Sequence[torch.Tensor], rank: int, W: int) -> tuple[torch.Tensor, ...]:
    """Send every tensor of `message` to rank + 1 and receive the same shapes from rank - 1."""
    import torch.distributed as dist

    got = tuple(torch.empty_like(t) for t in message)
    ops = [dist.P2POp(dist.isend, t.contiguous(), (rank + 1) % W) for t in message]
    ops += [dist.P2POp(dist.irecv, t, (rank - 1) % W) for t in got]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return got


def _all_to_all_exchange(message: Sequence[torch.Tensor], W: int) -> list[torch.Tensor]:
    """Entry j of each run of W tensors goes to rank j; returns what every rank sent to this one.

    Differentiable (`_AllToAll`), so autograd carries Ulysses' backward through both exchanges.
    """
    if len(message) % W:
        raise ValueError(f"an all-to-all message holds a multiple of world_size={W} tensors, "
                         f"got {len(message)}")
    got = []
    for start in range(0, len(message), W):
        block = torch.stack([t.contiguous() for t in message[start:start + W]])  # (W, ...)
        got += list(_AllToAll.apply(block).unbind(0))  # entry j: what rank j sent to this rank
    return got


class RingAttention(torch.autograd.Function):
    """Ring attention across processes with its hand-derived backward (autograd cannot see sends).

    forward: `ring_rank` over torch.distributed, keeping out and lse; backward:
    `ring_rank_backward`, a second trip round the ring. Call through `ring_core`.
    """

    @staticmethod
    def forward(ctx, q, k, v, pos, world_size, rule, stats):
        """q (B, h, T_r, d_k), k, v (B, h_kv, T_r, d_k) of this rank -> out (B, h, T_r, d_k)."""
        out, lse = run_rank(ring_rank(q, k, v, pos, world_size, False, stats, rule,
                                      out_dtype=compute_dtype(q.dtype)), "ring", stats)
        ctx.save_for_backward(q, k, v, pos, out, lse)  # out unrounded: the backward's delta
        ctx.world_size, ctx.rule, ctx.stats = world_size, rule, stats
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        """dout (B, h, T_r, d_k) -> dq, dk, dv of this rank's shard (and None for the rest)."""
        q, k, v, pos, out, lse = ctx.saved_tensors
        back: dict = {}
        dq, dk, dv = run_rank(ring_rank_backward(q, k, v, pos, out, lse, dout.contiguous(),
                                                 ctx.world_size, False, back, ctx.rule),
                              "ring", back)
        if ctx.stats is not None:
            ctx.stats.update({f"backward_{key}": n for key, n in back.items()})
        return dq, dk, dv, None, None, None, None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with its backward: the adjoint of an all-to-all is the all-to-all."""

    @staticmethod
    def forward(ctx, block):
        """block (W, ...): entry j goes to rank j -> (W, ...): entry j came from rank j."""
        import torch.distributed as dist

        out = torch.empty_like(block)
        dist.all_to_all_single(out, block.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        """The gradient of entry j came from rank j's use of it: send it back the same way."""
        return _AllToAll.apply(grad.contiguous())


def ring_core(world_size: int, stats: dict | None = None) -> Callable[..., torch.Tensor]:
    """A `core=` for `MultiHeadAttention.forward` on one process of a ring (forward and backward)."""
    def core(q, k, v, q_pos, k_pos, rule):
        """q (B, h, T_r, d_k), k, v (B, h_kv, T_r, d_k) -> heads (B, h, T_r, d_k) over every rank's keys."""
        return RingAttention.apply(q, k.contiguous(), v.contiguous(), q_pos, world_size, rule, stats)
    return core


def ulysses_core(world_size: int, stats: dict | None = None) -> Callable[..., torch.Tensor]:
    """A `core=` for `MultiHeadAttention.forward` on one process of Ulysses (autograd through both all-to-alls)."""
    import torch.distributed as dist

    def core(q, k, v, q_pos, k_pos, rule):
        """q (B, h, T_r, d_k), k, v (B, h_kv, T_r, d_k) -> heads (B, h, T_r, d_k)."""
        gen = ulysses_rank(q, k, v, q_pos, world_size, rule=rule, rank=dist.get_rank())
        return run_rank(gen, "all_to_all", stats)
    return core


def check_ranks_agree(**facts: Any) -> None:
    """Compare `facts` (shapes, sizes, options) across all ranks; on a mismatch every rank raises.

    One all_gather_object comes first, so every rank sees every rank's facts and all of them
    raise the same error (naming each rank's value) instead of some waiting in a later collective.
    """
    import torch.distributed as dist

    W = dist.get_world_size()
    every: list = [None] * W
    dist.all_gather_object(every, facts)  # every[r]: rank r's facts
    keys = dict.fromkeys(key for f in every for key in f)
    differ = [key for key in keys if any(f.get(key) != every[0].get(key) for f in every)]
    if differ:
        detail = "; ".join(f"{key}: " + ", ".join(f"rank {r} has {f.get(key)}"
                                                  for r, f in enumerate(every)) for key in differ)
        raise ValueError(f"the ranks must agree before attention starts, but they differ: {detail}")
    if "world_size" in facts and facts["world_size"] != W:
        raise ValueError(f"every rank was told world_size={facts['world_size']}, but the process "
                         f"group has {W} ranks")


def _on_cpu(result: dict) -> dict:
    """The result's "grads" moved to the CPU (to travel back to the caller), if it has any."""
    return {"grads": [g.cpu() for g in result["grads"]]} if "grads" in result else {}


def _rank_device() -> torch.device:
    """This rank's device: its GPU under NCCL (mha.parallel.launch sets it), else the CPU (gloo)."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _forward_and_backward(rank: int, world_size: int, run: Callable, leaves: Sequence[torch.Tensor],
                          dout: torch.Tensor | None, layout: str) -> dict:
    """Run `run()` on this rank; with dout (the full gradient), backpropagate this rank's slice of it."""
    out = run()
    if dout is None:
        return {"out": out.detach().cpu()}
    dmine = shard(dout, world_size, layout, dim=out.ndim - 2)[rank]  # the sequence axis
    grads = torch.autograd.grad(out, list(leaves), dmine)
    return {"out": out.detach().cpu(), "grads": [g.detach() for g in grads]}


def rank_worker(rank: int, world_size: int, kind: str, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, layout: str = "contiguous", causal: bool = False,
                dout: torch.Tensor | None = None) -> dict:
    """One process of ring attention or Ulysses (for mha.parallel.launch.run_workers): its shard's out and stats.

    Each rank takes its own shard of the full q, k, v (B, h, T, d_k); stats: "blocks" computed
    (ring) and "bytes_sent". With dout (B, h, T, d_k) it also returns "grads", this rank's
    slices of dq, dk, dv (ring: `ring_rank_backward`; Ulysses: autograd through the all-to-alls).
    """
    check_ranks_agree(world_size=world_size, kind=kind, layout=layout, causal=causal,
                      q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape), dtype=str(q.dtype))
    check_split(q.shape[2], world_size, layout)
    device = _rank_device()
    pos = rank_positions(q.shape[2], world_size, layout)[rank].to(device)
    mine = [shard(t, world_size, layout)[rank].to(device).requires_grad_(dout is not None)
            for t in (q, k, v)]  # (B, h, T / W, d_k) each, on this rank's device
    dout = None if dout is None else dout.to(device)
    stats: dict = {}
    core = ring_core if kind == "ring" else ulysses_core
    rule = causal_rule(causal)
    result = _forward_and_backward(rank, world_size, lambda: core(world_size, stats)(
        *mine, pos, pos, rule), mine, dout, layout)
    return {**result, **_on_cpu(result), **stats}


def memory_worker(rank: int, world_size: int, kind: str, q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, layout: str = "contiguous", causal: bool = False) -> int:
    """Peak bytes this rank allocates during its forward (`bench.peak_memory_bytes`), shards given.

    It runs the rank's generator under `run_rank` directly, not through `RingAttention`: the
    profiler books every free inside a Python-level op such as an autograd Function at that op's
    end, which would add up all of the ring's steps instead of the largest one.
    """
    from mha.perf.bench import peak_memory_bytes

    pos = rank_positions(q.shape[2], world_size, layout)[rank]
    mine = [shard(t, world_size, layout)[rank] for t in (q, k, v)]  # (B, h, T / W, d_k) each
    if kind == "ring":
        work = lambda: run_rank(ring_rank(*mine, pos, world_size, causal), "ring")  # noqa: E731
    else:
        work = lambda: run_rank(ulysses_rank(*mine, pos, world_size, causal, rank=rank),  # noqa: E731
                                "all_to_all")
    with torch.no_grad():
        return peak_memory_bytes(work)


def peak_bytes_per_rank(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        world_size: int, layout: str = "contiguous", causal: bool = False,
                        timeout_s: float = 60.0) -> list[int]:
    """Each rank's measured peak allocation in bytes during the forward, on world_size processes."""
    from mha.parallel.launch import run_workers

    _refuse_before_launch(kind, check_qkv(q, k, v)[3], (q.shape[1], k.shape[1]), world_size, layout)
    return run_workers(memory_worker, world_size, (kind, q, k, v, layout, causal),
                       timeout_s=timeout_s)


def module_worker(rank: int, world_size: int, kind: str, module: torch.nn.Module, x: torch.Tensor,
                  layout: str = "contiguous", causal: bool = False,
                  dout: torch.Tensor | None = None) -> dict:
    """One process of a sequence-parallel `MultiHeadAttention`: x (B, T, d_model), this rank's T / W tokens.

    The module is replicated; each rank projects its own tokens at their global positions and
    the core (`ring_core` or `ulysses_core`) attends across ranks. With dout (B, T, d_model) it
    backpropagates and sums the weight gradients over ranks (all_reduce), as data parallelism
    would: "grads" = [dx slice, then one per parameter, in named_parameters order].
    """
    import torch.distributed as dist

    check_ranks_agree(world_size=world_size, kind=kind, layout=layout, causal=causal,
                      x=tuple(x.shape), dtype=str(x.dtype), module=repr(module))
    check_split(x.shape[1], world_size, layout)
    device = _rank_device()
    module = module.to(device)
    pos = rank_positions(x.shape[1], world_size, layout)[rank].to(device)
    x_r = shard(x, world_size, layout, dim=1)[rank].to(device).requires_grad_(dout is not None)
    dout = None if dout is None else dout.to(device)  # x_r: (B, T / W, d_model) on this device
    stats: dict = {}
    core = (ring_core if kind == "ring" else ulysses_core)(world_size, stats)
    params = list(module.parameters())
    result = _forward_and_backward(rank, world_size, lambda: module(
        x_r, causal=causal, positions=pos, core=core), [x_r, *params], dout, layout)
    for g in result.get("grads", [])[1:]:
        dist.all_reduce(g)  # replicated weights: their gradient is the sum over every rank's tokens
    return {**result, **_on_cpu(result), **stats}


def _check_sizes(B: int, h_kv: int, T: int, world_size: int, d_k: int, itemsize: int) -> None:
    """Whole numbers >= 1 for the byte counts, and T / W ranks' tokens that divide evenly."""
    for name, n in (("B", B), ("h_kv", h_kv), ("T", T), ("world_size", world_size), ("d_k", d_k),
                    ("itemsize", itemsize)):
        require_int(name, n)
    check_split(T, world_size, "contiguous")


def ring_bytes_per_step(B: int, h_kv: int, T: int, world_size: int, d_k: int, itemsize: int) -> int:
    """Bytes one rank sends per ring step: its K and V blocks (B, h_kv, T / W, d_k) and their positions."""
    _check_sizes(B, h_kv, T, world_size, d_k, itemsize)
    return 2 * B * h_kv * (T // world_size) * d_k * itemsize + (T // world_size) * 8  # int64 positions


def ring_backward_bytes(B: int, h_kv: int, T: int, world_size: int, d_k: int, itemsize: int,
                        grad_itemsize: int | None = None) -> int:
    """Bytes one rank sends in the whole backward ring: W - 1 steps of K, V, positions, dK, dV, then dK, dV once.

    dK and dV travel in the compute dtype: grad_itemsize defaults to 4 for 2-byte inputs
    (float16 / bfloat16 gradients are summed in float32), else itemsize.
    """
    _check_sizes(B, h_kv, T, world_size, d_k, itemsize)
    grad_itemsize = max(itemsize, 4) if grad_itemsize is None else require_int("grad_itemsize",
                                                                               grad_itemsize)
    block = B * h_kv * (T // world_size) * d_k  # numbers in one (B, h_kv, T / W, d_k) tensor
    if world_size == 1:
        return 0
    kv, grads = 2 * block * itemsize, 2 * block * grad_itemsize  # K and V; dK and dV
    return (world_size - 1) * (kv + grads + (T // world_size) * 8) + grads


def _refuse_before_launch(kind: str, T: int, heads: Sequence[int], world_size: int,
                          layout: str) -> None:
    """The checks every rank would make, made once here before any process starts."""
    if kind not in ("ring", "ulysses"):
        raise ValueError(f"kind must be 'ring' or 'ulysses', got {kind!r}")
    check_split(T, world_size, layout)  # world_size, layout, T / W (and T / 2W for zigzag)
    for name, n in zip(("h", "h_kv"), heads, strict=True):
        if kind == "ulysses" and n % world_size:
            raise ValueError(f"Ulysses gives each of the world_size={world_size} ranks {name} / W "
                             f"heads, but {name}={n} is not divisible by {world_size}")


def distributed_attention(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          world_size: int, layout: str = "contiguous", causal: bool = False,
                          timeout_s: float = 60.0) -> tuple[torch.Tensor, list[dict]]:
    """Ring ("ring") or Ulysses ("ulysses") on world_size processes: -> (out (B, h, T, d_k), per-rank stats).

    Checks the split in this process first, so a bad T, layout or head count is refused before
    any process starts or any collective runs.
    """
    from mha.parallel.launch import run_workers

    _refuse_before_launch(kind, check_qkv(q, k, v)[3], (q.shape[1], k.shape[1]), world_size, layout)
    ranks = run_workers(rank_worker, world_size, (kind, q, k, v, layout, causal),
                        timeout_s=timeout_s)
    return unshard([r.pop("out") for r in ranks], layout), ranks


def distributed_backward(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         dout: torch.Tensor, world_size: int, layout: str = "contiguous",
                         causal: bool = False, timeout_s: float = 60.0,
                         ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], list[dict]]:
    """Forward and backward on world_size processes: -> (out, (dq, dk, dv), per-rank stats), all (B, h, T, d_k)."""
    from mha.parallel.launch import run_workers

    T = check_qkv(q, k, v, dout)[3]  # dout (B, h, T, d_k): the output's shape and dtype
    _refuse_before_launch(kind, T, (q.shape[1], k.shape[1]), world_size, layout)
    ranks = run_workers(rank_worker, world_size, (kind, q, k, v, layout, causal, dout),
                        timeout_s=timeout_s)
    grads = [r.pop("grads") for r in ranks]
    full = tuple(unshard([g[i] for g in grads], layout) for i in range(3))
    return unshard([r.pop("out") for r in ranks], layout), full, ranks


def sequence_parallel(module: torch.nn.Module, x: torch.Tensor, world_size: int,
                      kind: str = "ring", layout: str = "contiguous", causal: bool = False,
                      dout: torch.Tensor | None = None, timeout_s: float = 60.0) -> dict:
    """A `MultiHeadAttention` over x (B, T, d_model) split across world_size processes.

    Returns {"out": (B, T, d_model), "ranks": per-rank stats} and, with dout (B, T, d_model),
    "dx" (B, T, d_model) and "grads" {parameter name: gradient summed over ranks}.
    """
    from mha.parallel.launch import run_workers

    if not isinstance(module, MultiHeadAttention):
        raise ValueError(f"expected an mha MultiHeadAttention and x (B, T, d_model), got "
                         f"{type(module).__name__}")
    module._check_inputs(x, None)  # x (B, T, d_model): a tensor of the weights' dtype and device
    _refuse_before_launch(kind, x.shape[1], (module.n_heads, module.n_kv_heads), world_size, layout)
    if dout is not None:
        _require_tensor("dout", dout, "(B, T, d_model)")
        if dout.shape != x.shape or dout.dtype != x.dtype:
            raise ValueError(f"dout must have the output's shape {tuple(x.shape)} and dtype {x.dtype}, "
                             f"got {tuple(dout.shape)} and {dout.dtype}")
    ranks = run_workers(module_worker, world_size, (kind, module, x, layout, causal, dout),
                        timeout_s=timeout_s)
    result = {"out": unshard([r.pop("out") for r in ranks], layout, dim=1), "ranks": ranks}
    if dout is not None:
        grads = [r.pop("grads") for r in ranks]
        result["dx"] = unshard([g[0] for g in grads], layout, dim=1)
        names = [name for name, _ in module.named_parameters()]
        result["grads"] = dict(zip(names, grads[0][1:], strict=True))  # all ranks hold the sum
    return result
