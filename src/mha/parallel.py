"""Attention across devices: ring attention and DeepSpeed-Ulysses, one rank's algorithm, two transports.

When one sequence no longer fits one device, its T tokens are split over W ranks:
- **Ring attention** keeps each rank's queries and passes the key/value blocks round a ring,
  one step per rank; each rank merges the partial results with the logsumexp rule of the
  FlashAttention lesson (`merge_partials`), so the answer is exact.
- **Ulysses** trades the sequence split for a head split with one all-to-all: each rank then
  holds every token of h / W heads, runs the ordinary core, and a second all-to-all trades back.

Each rank's algorithm is written once, as a generator that yields what it sends and receives
what arrives (`ring_rank`, `ulysses_rank`). `simulate` drives W of them in one process, with
ranks as list entries; `mha.launch` drives one per process over torch.distributed. The block
attention is the torch core's manual path with its logsumexp (`torch_mha.attention_lse`).

Layouts: "contiguous" gives rank r tokens [r T/W, (r+1) T/W); "zigzag" cuts T into 2W chunks
and gives rank r chunks r and 2W-1-r, so that under a causal mask every rank does the same work.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import torch

from .torch_mha import attention, attention_lse

LAYOUTS = ("contiguous", "zigzag")


def check_split(T: int, world_size: int, layout: str) -> int:
    """Check that T tokens split over world_size ranks in `layout`; return the tokens per rank."""
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
    pos = rank_positions(x.shape[dim], world_size, layout)
    return [x.index_select(dim, p).contiguous() for p in pos]


def unshard(pieces: Sequence[torch.Tensor], layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The inverse of `shard`: put the ranks' pieces back in sequence order."""
    W = len(pieces)
    T = sum(p.shape[dim] for p in pieces)
    order = torch.cat(rank_positions(T, W, layout))  # (T,) global position of each gathered row
    return torch.cat(list(pieces), dim=dim).index_select(dim, torch.argsort(order))


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A and B from each side's normalised (out (..., T, d), lse (..., T)).

    The torch twin of `mha.flash.merge_partials`: out = share_a * out_a + share_b * out_b with
    share = exp(lse_side - lse), lse = logaddexp(lse_a, lse_b); a side with lse -inf counts 0.
    """
    if out_a.shape != out_b.shape or lse_a.shape != out_a.shape[:-1] or lse_b.shape != lse_a.shape:
        raise ValueError(f"expected out_a, out_b of one shape (..., T, d) and lse_a, lse_b of shape "
                         f"(..., T), got {tuple(out_a.shape)}, {tuple(out_b.shape)}, "
                         f"{tuple(lse_a.shape)}, {tuple(lse_b.shape)}")
    lse = torch.logaddexp(lse_a, lse_b)  # (..., T)
    base = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # both empty: shares 0
    share_a = torch.exp(lse_a - base)[..., None]  # (..., T, 1): A's part of the softmax mass
    share_b = torch.exp(lse_b - base)[..., None]  # (..., T, 1)
    return share_a * out_a + share_b * out_b, lse


def block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """(T_q, T_k) True where a query at q_pos may see a key at k_pos (None: every key)."""
    return (k_pos[None, :] <= q_pos[:, None]) if causal else None  # (T_q, T_k)


RingMessage = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (k, v, k_pos) passed on


def ring_rank(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
              world_size: int, causal: bool = False, stats: dict | None = None,
              ) -> Generator[RingMessage, RingMessage, tuple[torch.Tensor, torch.Tensor]]:
    """One rank of ring attention: q, k, v (B, h, T_r, d_k) at global positions pos (T_r,).

    At each of the W steps it attends to the block it holds, then yields that block to send on
    to rank + 1 and receives rank - 1's. Blocks that the causal mask hides entirely are skipped.
    Returns (out (B, h, T_r, d_k), lse (B, h, T_r)); `stats["blocks"]` counts blocks computed.
    """
    B, h, T_r, d_k = q.shape
    out = torch.zeros_like(q)  # (B, h, T_r, d_k): no keys yet ...
    lse = torch.full((B, h, T_r), float("-inf"), dtype=q.dtype)  # ... so no softmax mass
    k_pos = pos
    for step in range(world_size):
        allowed = block_mask(pos, k_pos, causal)  # (T_r, T_r) or None
        if allowed is None or bool(allowed.any()):
            o, o_lse = attention_lse(q, k, v, allowed)  # (B, h, T_r, d_k), (B, h, T_r)
            out, lse = merge_partials(out, lse, o, o_lse)
            if stats is not None:
                stats["blocks"] = stats.get("blocks", 0) + 1
        if step < world_size - 1:
            k, v, k_pos = yield (k, v, k_pos)  # send on, receive the left neighbour's block
    return out, lse


def ulysses_rank(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                 world_size: int, causal: bool = False,
                 ) -> Generator[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """One rank of Ulysses: q, k, v (B, h, T_r, d_k) of its tokens at positions pos (T_r,).

    All-to-all 1 sends head group j of its tokens to rank j and receives every rank's tokens
    of its own head group: (B, h / W, T, d_k). The core attends over the whole sequence;
    all-to-all 2 sends each rank's tokens back. Returns out (B, h, T_r, d_k).
    """
    B, h, T_r, d_k = q.shape
    if h % world_size:
        raise ValueError(f"Ulysses gives each of the world_size={world_size} ranks h / W heads, but "
                         f"h={h} is not divisible by {world_size}")
    g = h // world_size  # heads per rank after the exchange
    groups = [torch.cat([t[:, j * g:(j + 1) * g] for t in (q, k, v)], dim=-1).contiguous()
              for j in range(world_size)]  # W x (B, g, T_r, 3 d_k): head group j, my tokens
    got = yield groups + [pos.contiguous()] * world_size  # every rank: its group, all tokens
    qkv = torch.cat(got[:world_size], dim=2)  # (B, g, T, 3 d_k) in rank order of tokens
    all_pos = torch.cat(got[world_size:])  # (T,) their global positions
    qg, kg, vg = qkv.split(d_k, dim=-1)  # (B, g, T, d_k) each
    mask = block_mask(all_pos, all_pos, causal)  # (T, T): the global causal mask, any layout
    heads, _ = attention(qg, kg, vg, mask, backend="manual")  # (B, g, T, d_k): the core
    back = yield list(heads.split(T_r, dim=2))  # rank j's tokens back to rank j
    return torch.cat(back, dim=1)  # (B, h, T_r, d_k): head groups in order


def simulate(ranks: Sequence[Generator], pattern: str) -> list[Any]:
    """Drive W rank generators in one process; pattern "ring" (send to r+1) or "all_to_all".

    A ring message goes from rank r to rank r + 1; an all-to-all message is a list whose entry
    j goes to rank j (entries W.. are a second list of W). Returns each rank's result.
    """
    if pattern not in ("ring", "all_to_all"):
        raise ValueError(f"pattern must be 'ring' or 'all_to_all', got {pattern!r}")
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
    """Ring attention on W simulated ranks: q, k, v (B, h, T, d_k) -> (out (B, h, T, d_k), blocks per rank)."""
    check_split(q.shape[2], world_size, layout)
    stats = [{} for _ in range(world_size)]
    pos = rank_positions(q.shape[2], world_size, layout)
    qs, ks, vs = (shard(t, world_size, layout) for t in (q, k, v))  # W x (B, h, T / W, d_k)
    ranks = [ring_rank(qs[r], ks[r], vs[r], pos[r], world_size, causal, stats[r])
             for r in range(world_size)]
    outs = [out for out, _ in simulate(ranks, "ring")]
    return unshard(outs, layout), [s.get("blocks", 0) for s in stats]


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int,
                      layout: str = "contiguous", causal: bool = False) -> torch.Tensor:
    """Ulysses on W simulated ranks: q, k, v (B, h, T, d_k) -> out (B, h, T, d_k)."""
    check_split(q.shape[2], world_size, layout)
    pos = rank_positions(q.shape[2], world_size, layout)
    qs, ks, vs = (shard(t, world_size, layout) for t in (q, k, v))  # W x (B, h, T / W, d_k)
    ranks = [ulysses_rank(qs[r], ks[r], vs[r], pos[r], world_size, causal) for r in range(world_size)]
    return unshard(simulate(ranks, "all_to_all"), layout)


def causal_work(T: int, world_size: int, layout: str) -> list[int]:
    """Allowed (query, key) pairs each rank scores under a causal mask: the work a rank cannot skip."""
    pos = rank_positions(T, world_size, layout)
    every = torch.arange(T)
    return [int((every[None, :] <= p[:, None]).sum()) for p in pos]



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
    """Entry j of each run of W tensors goes to rank j; returns what every rank sent to this one."""
    import torch.distributed as dist

    if len(message) % W:
        raise ValueError(f"an all-to-all message holds a multiple of world_size={W} tensors, "
                         f"got {len(message)}")
    got = []
    for start in range(0, len(message), W):
        block = torch.stack([t.contiguous() for t in message[start:start + W]])  # (W, ...)
        out = torch.empty_like(block)
        dist.all_to_all_single(out, block)  # out[j]: what rank j sent to this rank
        got += list(out.unbind(0))
    return got


def rank_worker(rank: int, world_size: int, kind: str, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, layout: str = "contiguous", causal: bool = False) -> dict:
    """One process of ring attention or Ulysses (for mha.launch.run_workers): its shard's out and stats.

    Each rank takes its own shard of the full q, k, v (B, h, T, d_k); stats: "blocks" computed
    (ring) and "bytes_sent".
    """
    pos = rank_positions(q.shape[2], world_size, layout)[rank]
    mine = [shard(t, world_size, layout)[rank] for t in (q, k, v)]  # (B, h, T / W, d_k) each
    stats: dict = {}
    if kind == "ring":
        out, _ = run_rank(ring_rank(*mine, pos, world_size, causal, stats), "ring", stats)
    else:
        out = run_rank(ulysses_rank(*mine, pos, world_size, causal), "all_to_all", stats)
    return {"out": out, **stats}


def ring_bytes_per_step(B: int, h_kv: int, T: int, world_size: int, d_k: int, itemsize: int) -> int:
    """Bytes one rank sends per ring step: its K and V blocks (B, h_kv, T / W, d_k) and their positions."""
    return 2 * B * h_kv * (T // world_size) * d_k * itemsize + (T // world_size) * 8  # int64 positions


def distributed_attention(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          world_size: int, layout: str = "contiguous", causal: bool = False,
                          timeout_s: float = 60.0) -> tuple[torch.Tensor, list[dict]]:
    """Ring ("ring") or Ulysses ("ulysses") on world_size processes: -> (out (B, h, T, d_k), per-rank stats).

    Checks the split in this process first, so a bad T, layout or head count is refused before
    any process starts or any collective runs.
    """
    from .launch import run_workers

    if kind not in ("ring", "ulysses"):
        raise ValueError(f"kind must be 'ring' or 'ulysses', got {kind!r}")
    check_split(q.shape[2], world_size, layout)
    if kind == "ulysses" and q.shape[1] % world_size:
        raise ValueError(f"Ulysses gives each of the world_size={world_size} ranks h / W heads, but "
                         f"h={q.shape[1]} is not divisible by {world_size}")
    ranks = run_workers(rank_worker, world_size, (kind, q, k, v, layout, causal),
                        timeout_s=timeout_s)
    return unshard([r.pop("out") for r in ranks], layout), ranks
