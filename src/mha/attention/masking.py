"""One description of what may be attended (`MaskSpec`), lowered for each attention backend.

A query may read a key when every rule the spec holds allows it (True = may attend):

    causal      k_pos <= q_pos (compare POSITIONS, so a chunk after a cache is bottom-right for free)
    window      q_pos - k_pos < window (a causal band: the query's own key and window - 1 before it)
    padding     a NEGATIVE key position marks a pad token: no query reads it
    documents   q_doc == k_doc (packed sequences attend within their own document); a negative
                document id marks padding: such a query reads nothing, such a key is never read
    user        a boolean mask, True = may attend, broadcast to (B, h, T, S)

Positions are (T,) / (S,) for the whole batch or (B, T) / (B, S) per sequence, numpy or torch;
the spec keeps the framework it was given. Each backend asks for the form it can use:

    spec.dense()                    bool (B|1, h|1, T, S), or None when every key is allowed
                                    (full=True: always the whole (B, H, T, S) array)
    spec.all_allowed()              every key allowed? decided in O(T + S), no (T, S) array
    spec.sdpa_args()                (attn_mask, is_causal) for F.scaled_dot_product_attention:
                                    (None, True) for the exact top-left staircase, (None, False)
                                    when all is allowed (a decode step), else (dense(), False)
    spec.mask_mod()                 FlexAttention's mask_mod(b, h, q_idx, kv_idx): lookups in the
                                    per-position tensors, never a dense (T, S) table (but a user mask)
    spec.block_mask(B, h, T, S)     FlexAttention's BlockMask (create_block_mask; compile=True
                                    builds it under torch.compile), or None
    spec.tile_kinds(bq, bk)         SKIPPED / PARTIAL / FULL per tile, from position ranges alone
    spec.block(t0, t1, s0, s1)      the bool block (B|1, h|1, t1-t0, s1-s0) of one tile, or None if FULL
    spec.tile(b, t0, t1, s0, s1)    the same for batch item b as (t1-t0, s1-s0)

Builders: `MaskSpec.plain(T, S, causal)`, `MaskSpec.padded(lengths, T)` (right padding),
`MaskSpec.packed(lengths)` (documents from cu_seqlens-style lengths), `packed_positions(lengths)`
and `document_ids(lengths)`; `spec.with_(...)` changes fields. The lessons' masks
(`masks.padding_mask`, `masks.sliding_window_mask`), the modules' (`compose.mask_spec`), Flex's
(`positions.flex_spec`) and flash's tile schedule (`flash.tile_schedule`) are lowerings of it.
Shape legend: B batch, h heads, T queries, S keys.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mha import steps
from mha.validate import is_torch, require_bool, require_int, shape_of, torch  # torch: lazy

SKIPPED, PARTIAL, FULL = 0, 1, 2
"""Tile kinds: never computed, computed with some keys masked, computed without a mask."""

ALIGNMENTS = ("top_left", "bottom_right")


# ---- small helpers, numpy and torch alike -----------------------------------------------------------
def _ints(name: str, x: Any) -> Any:
    """x as an int array (lists become int64 numpy); refuse floats, bools and anything not 1-D/2-D."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        if not isinstance(x, list | tuple | range):
            raise TypeError(f"{name} must be an int array (n,) or (B, n), or a list of ints, got "
                            f"{type(x).__name__} {x!r}")
        x = np.asarray(x)
        if x.size == 0:
            x = x.astype(np.int64)
    kind = str(x.dtype).replace("torch.", "")
    if "int" not in kind:
        raise TypeError(f"{name} must hold whole numbers (an int array), got dtype {kind}")
    if len(shape_of(x)) not in (1, 2):
        raise ValueError(f"{name} must be (n,) or (B, n), got shape {shape_of(x)}")
    return x.long() if is_torch(x) else x.astype(np.int64, copy=False)


def as_numpy(x: Any) -> np.ndarray:
    """numpy view of an array or tensor."""
    return x.detach().cpu().numpy() if is_torch(x) else np.asarray(x)


def _like(x: Any, ref: Any) -> Any:
    """x in ref's framework (and on its device when torch); None stays None."""
    if x is None:
        return None
    if is_torch(ref):
        return torch.as_tensor(x, device=ref.device)
    return as_numpy(x)


def _arange(n: int, like: Any) -> Any:
    """0..n-1 as int64, numpy or torch (on like's device)."""
    return torch.arange(n, device=like.device) if is_torch(like) else np.arange(n)


def _where(cond: Any, a: Any, b: Any) -> Any:
    """np.where / torch.where with scalar a, b."""
    return torch.where(cond, a, b) if is_torch(cond) else np.where(cond, a, b)


def _first(x: Any) -> int | None:
    """x[0] if x (n,) is x[0] + 0..n-1 (a contiguous run), else None; checked in O(n)."""
    if x.ndim != 1 or shape_of(x)[0] == 0:
        return None
    start = int(x[0])
    return start if bool(((x - _arange(shape_of(x)[0], x)) == start).all()) else None


def _rows(x: Any) -> int:
    """The batch size a (n,) or (B, n) array brings: 1 for (n,)."""
    return shape_of(x)[0] if x.ndim == 2 else 1


def _pair(a: Any, b: Any) -> tuple[Any, Any]:
    """(.., T, 1) and (.., 1, S) views of two (T,)|(B, T) and (S,)|(B, S) arrays."""
    return a[..., :, None], b[..., None, :]


def _as4(p: Any) -> Any:
    """A (T, S) or (B, T, S) part as (1|B, 1, T, S): the same for every head."""
    if p.ndim == 2:
        return p[None, None]
    return p[:, None] if p.ndim == 3 else p


# ---- the description ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class MaskSpec:
    """What may be attended, from positions (True = may attend); see the module docstring."""

    q_pos: Any  # (T,) | (B, T) ints
    k_pos: Any  # (S,) | (B, S) ints; negative = padding, never read
    causal: bool = False  # k_pos <= q_pos
    window: int | None = None  # q_pos - k_pos < window (needs causal)
    q_doc: Any = None  # (T,) | (B, T) document ids; negative = a pad query (reads nothing)
    k_doc: Any = None  # (S,) | (B, S) document ids; negative = a pad key (never read)
    user: Any = None  # bool, True = may attend; stored as (B|1, h|1, T, S)

    def __post_init__(self) -> None:
        q_pos, k_pos = _ints("q_pos", self.q_pos), _ints("k_pos", self.k_pos)
        ref = q_pos if is_torch(q_pos) else k_pos  # torch wins: the spec follows the tensors
        q_pos, k_pos = _like(q_pos, ref), _like(k_pos, ref)
        T, S = shape_of(q_pos)[-1], shape_of(k_pos)[-1]
        causal = require_bool("causal", self.causal)
        window = None if self.window is None else require_int("window", self.window)
        if window is not None and not causal:
            raise ValueError(f"window={window} is a causal band (a query reads its last {window} "
                             f"keys): give causal=True with it")
        if (self.q_doc is None) != (self.k_doc is None):
            raise ValueError("q_doc and k_doc come together (document ids of queries and of keys), "
                             "got only one of them")
        q_doc = k_doc = None
        if self.q_doc is not None:
            q_doc = _like(_ints("q_doc", self.q_doc), ref)
            k_doc = _like(_ints("k_doc", self.k_doc), ref)
            for name, d, n in (("q_doc", q_doc, T), ("k_doc", k_doc, S)):
                if shape_of(d)[-1] != n:
                    raise ValueError(f"{name} must have one id per {'query' if n == T else 'key'} "
                                     f"({n}), got shape {shape_of(d)}")
        user = None if self.user is None else _like(self._user4(self.user, T, S), ref)
        sizes = {n for n in (_rows(q_pos), _rows(k_pos), *(() if q_doc is None else
                 (_rows(q_doc), _rows(k_doc))), 1 if user is None else shape_of(user)[0])}
        if len(sizes - {1}) > 1:
            raise ValueError(f"the batch sizes of q_pos, k_pos, the document ids and the user mask "
                             f"must agree (or be 1), got {sorted(sizes)}")
        for name, value in (("q_pos", q_pos), ("k_pos", k_pos), ("causal", causal),
                            ("window", window), ("q_doc", q_doc), ("k_doc", k_doc), ("user", user)):
            object.__setattr__(self, name, value)

    @staticmethod
    def _user4(user: Any, T: int, S: int) -> Any:
        """The user mask as (B|1, h|1, T, S); refuse non-boolean masks and wrong shapes."""
        if not hasattr(user, "dtype") or str(user.dtype) not in ("bool", "torch.bool"):
            raise TypeError(f"user must be a boolean mask (True = may attend), got "
                            f"{getattr(user, 'dtype', type(user).__name__)}")
        got = shape_of(user)
        if len(got) not in (2, 3, 4) or got[-2:] != (T, S):
            raise ValueError(f"user must be (T={T}, S={S}), (B, T, S) or (B|1, h|1, T, S), "
                             f"got {got}")
        return _as4(user)

    # ---- builders ----------------------------------------------------------------------------------
    @classmethod
    def plain(cls, T: int, S: int | None = None, causal: bool = False, like: Any = None,
              aligned: str = "top_left", window: int | None = None) -> MaskSpec:
        """Queries at 0..T-1 (or S-T..S-1 when aligned="bottom_right"), keys at 0..S-1."""
        T = require_int("T", T, minimum=0)
        S = T if S is None else require_int("S", S, minimum=0)
        if aligned not in ALIGNMENTS:
            raise ValueError(f"aligned must be one of {ALIGNMENTS}, got {aligned!r}")
        ref = np.zeros(0) if like is None else like
        q_pos = _arange(T, ref) + (S - T if aligned == "bottom_right" else 0)  # (T,)
        return cls(q_pos, _arange(S, ref), causal=causal, window=window)

    @classmethod
    def padded(cls, lengths: Any, T: int, S: int | None = None, kv_lengths: Any = None,
               causal: bool = False, queries: bool = True) -> MaskSpec:
        """Right-padded batch: real queries t < lengths[b] read real keys s < kv_lengths[b].

        queries=False leaves padded query rows reading the real keys (their output is garbage a
        loss must ignore); queries=True gives them document -1, so they read nothing.
        """
        from mha.attention.masks import (  # masks lowers to this module
            key_padding_mask,
            query_padding_mask,
        )

        T = require_int("T", T, minimum=0)
        S = T if S is None else require_int("S", S, minimum=0)
        kv = lengths if kv_lengths is None else kv_lengths
        k_real = key_padding_mask(kv, S)  # (B, S): key s < kv_lengths[b]
        q_real = query_padding_mask(lengths, T, B=shape_of(k_real)[0])  # (B, T)
        q_doc = _where(q_real, 0, -1) if queries else 0 * q_real  # (B, T): -1 = a pad query
        return cls(_arange(T, q_real), _arange(S, k_real), causal=causal,
                   q_doc=q_doc, k_doc=_where(k_real, 0, -1))  # (B, S): -1 = a pad key

    @classmethod
    def packed(cls, lengths: Any = None, causal: bool = True, total: int | None = None,
               doc_ids: Any = None, window: int | None = None) -> MaskSpec:
        """One packed row of documents: token i of document j attends only within document j.

        Give cu_seqlens-style `lengths` (L_0, L_1, ...) or the `doc_ids` (T,)|(B, T) directly.
        `total` pads the row to that many tokens (document -1: read by none, reading none).
        Positions restart at 0 in each document (`packed_positions`): each document sees the
        positions it would see alone.
        """
        if (lengths is None) == (doc_ids is None):
            raise ValueError("packed needs exactly one of lengths (per document) or doc_ids "
                             "(per token)")
        if doc_ids is None:
            doc_ids = document_ids(lengths, total)  # (T,)
        doc_ids = _ints("doc_ids", doc_ids)
        pos = _document_positions(doc_ids)  # (T,)|(B, T): 0.. within each document
        return cls(pos, pos, causal=causal, window=window, q_doc=doc_ids, k_doc=doc_ids)

    # ---- what it holds -------------------------------------------------------------------------------
    @property
    def T(self) -> int:
        """Number of queries."""
        return shape_of(self.q_pos)[-1]

    @property
    def S(self) -> int:
        """Number of keys."""
        return shape_of(self.k_pos)[-1]

    @property
    def B(self) -> int:
        """The batch size the spec varies over (1 when it is the same for every sequence)."""
        rows = [_rows(self.q_pos), _rows(self.k_pos)]
        rows += [] if self.q_doc is None else [_rows(self.q_doc), _rows(self.k_doc)]
        rows += [] if self.user is None else [shape_of(self.user)[0]]
        return max(rows)

    @property
    def H(self) -> int:
        """The number of heads the spec varies over (only a user mask can: else 1)."""
        return 1 if self.user is None else shape_of(self.user)[1]

    @property
    def is_torch(self) -> bool:
        """True when the spec holds torch tensors (its lowerings are then torch too)."""
        return is_torch(self.q_pos)

    def with_(self, **changes: Any) -> MaskSpec:
        """A copy with some fields replaced (checked again)."""
        return replace(self, **changes)

    # ---- cheap facts from positions alone (no (T, S) array) ------------------------------------------
    def _has_padding(self) -> bool:
        """Some key is padding (a negative position or document id)."""
        pads = bool((self.k_pos < 0).any()) if self.S else False
        if self.k_doc is not None and self.S:
            pads = pads or bool((self.k_doc < 0).any())
        return pads

    def _one_document(self) -> bool:
        """Every query and key is in the same (non-negative) document, or there are no documents."""
        if self.q_doc is None or not (self.T and self.S):
            return True
        lo = min(int(self.q_doc.min()), int(self.k_doc.min()))
        hi = max(int(self.q_doc.max()), int(self.k_doc.max()))
        return lo == hi and lo >= 0

    def _user_all(self) -> bool:
        """No user mask, or one that allows everything."""
        return self.user is None or bool(self.user.all())

    def _window_binds(self) -> bool:
        """Some causal pair (k_pos <= q_pos) lies window or more positions back."""
        if self.window is None or not (self.T and self.S):
            return False
        return int(self.q_pos.max()) - int(self.k_pos.min()) >= self.window

    def all_allowed(self) -> bool:
        """True when every query may read every key, decided from positions and ids in O(T + S).

        Conservative: False may still be a mask of all True (per-sequence cases), never the reverse.
        """
        if not (self.T and self.S):
            return True
        if self._has_padding() or not self._one_document() or not self._user_all():
            return False
        if self.causal and int(self.k_pos.max()) > int(self.q_pos.min()):
            return False  # some key lies after some query
        return not self._window_binds()

    def is_top_left_causal(self) -> bool:
        """True when the spec is exactly SDPA's is_causal staircase tril(ones(T, S)): s <= t."""
        if not self.causal or self._window_binds() or self._has_padding():
            return False
        if not (self._one_document() and self._user_all()):
            return False
        q0, k0 = _first(self.q_pos), _first(self.k_pos)
        return q0 is not None and q0 == k0  # k0 + s <= q0 + t  <=>  s <= t

    def causal_offset(self) -> int | None:
        """o when q = o + 0..T-1 and k = 0..S-1 (one row for all): causal is then "s <= t + o"."""
        if self.k_pos.ndim != 1 or (self.S and _first(self.k_pos) != 0):
            return None
        return _first(self.q_pos) if self.T else (0 if self.q_pos.ndim == 1 else None)

    def needs(self) -> set[str]:
        """The backend features (`backends.FEATURES`) this description asks for.

        Causal alone on a staircase with an offset (`causal_offset`) asks none: every kernel has it.
        """
        needs = {"mask"} if self.user is not None else set()
        needs |= {"documents"} if self.q_doc is not None or self.k_doc is not None else set()
        needs |= {"window"} if self.window is not None else set()
        if self._has_padding() or (self.causal and self.causal_offset() is None):
            needs.add("mask")  # pad keys never read, or causal over positions no staircase describes
        return needs

    # ---- lowering 1: a dense boolean mask ------------------------------------------------------------
    def dense(self, full: bool = False) -> Any:
        """Bool (B|1, h|1, T, S), True = may attend; None when every key is allowed.

        full=True: never None, and materialised as (B, H, T, S) (the spec's own B and H).
        """
        if full:
            out = self.dense()
            shape = (self.B, self.H, self.T, self.S)
            if out is None:
                return (torch.ones(shape, dtype=torch.bool, device=self.q_pos.device)
                        if self.is_torch else np.ones(shape, dtype=bool))
            return out.expand(shape).clone() if self.is_torch else np.broadcast_to(out, shape).copy()
        if self.all_allowed():
            return None
        qp, kp = _pair(self.q_pos, self.k_pos)  # (.., T, 1), (.., 1, S)
        parts = []
        if self.causal:
            parts.append(self._staircase())  # (.., T, S): no key after the query
        if self.window is not None:
            parts.append(qp - kp < self.window)  # (.., T, S): at most window - 1 keys back
        if bool((self.k_pos < 0).any()):
            parts.append(kp >= 0)  # (.., 1, S): pad tokens (negative positions) are never read
        if self.q_doc is not None:
            qd, kd = _pair(self.q_doc, self.k_doc)  # (.., T, 1), (.., 1, S)
            parts.append((qd == kd) & (qd >= 0))  # (.., T, S): one document; -1 = padding
        if self.user is not None:
            parts.append(self.user)  # (B|1, h|1, T, S)
        out = None
        for p in parts:
            p = _as4(p)  # (B|1, h|1, T|1, S)
            out = p if out is None else out & p
        if shape_of(out)[-2] != self.T:  # only the padding part: spread it over the query rows
            out = out & _as4(_arange(self.T, out)[:, None] >= 0)  # (.., 1, S) & (1, 1, T, 1)
        return out  # (B|1, h|1, T, S)

    def _staircase(self) -> Any:
        """k_pos <= q_pos (.., T, S); for numpy queries offset + 0..T-1 and keys 0..S-1,
        the lessons' steps.causal_mask (05_causal_mask.ipynb), bottom-right after a cache."""
        if not self.is_torch and _first(self.k_pos) == 0:
            offset = _first(self.q_pos)
            if offset is not None:
                return (steps.causal_mask(self.T, self.S, offset=offset) if offset
                        else steps.causal_mask(self.T, self.S))  # (T, S)
        qp, kp = _pair(self.q_pos, self.k_pos)
        return kp <= qp  # (.., T, S): compare positions

    # ---- lowering 2: SDPA's two arguments -----------------------------------------------------------
    def sdpa_args(self) -> tuple[Any, bool]:
        """(attn_mask, is_causal) for F.scaled_dot_product_attention, keeping its fast kernels.

        (None, True) only for the exact top-left staircase; (None, False) when every key is
        allowed (a cached one-token decode step); otherwise (dense(), False).
        """
        if self.all_allowed():
            return None, False
        if self.is_top_left_causal():
            return None, True
        return self.dense(), False

    # ---- lowering 3: FlexAttention -------------------------------------------------------------------
    def _tensors(self, device: Any = None) -> dict[str, Any]:
        """The spec's per-position arrays as torch tensors on `device` (default: where they are)."""
        if device is None:
            device = self.q_pos.device if self.is_torch else "cpu"
        out = {}
        for name in ("q_pos", "k_pos", "q_doc", "k_doc", "user"):
            a = getattr(self, name)
            out[name] = None if a is None else torch.as_tensor(as_numpy(a) if not is_torch(a) else a,
                                                               device=device)
        return out

    def mask_mod(self, device: Any = None) -> Callable:
        """FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> bool, True = may attend.

        Index lookups in the small per-position tensors (q_pos, k_pos, document ids: O(T + S)),
        or the indices themselves when positions run 0, 1, 2, ...: torch.compile can fuse it.
        Only a user mask is a dense (B|1, h|1, T, S) lookup.
        """
        t = self._tensors(device)
        q_at, k_at = _lookup(t["q_pos"]), _lookup(t["k_pos"])
        causal, window = self.causal, self.window
        pads = bool((self.k_pos < 0).any()) if self.S else False
        docs = None if t["q_doc"] is None else (_lookup(t["q_doc"]), _lookup(t["k_doc"]))
        user = t["user"]

        def mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            qp, kp = q_at(b, q_idx), k_at(b, kv_idx)
            ok = torch.ones_like(q_idx, dtype=torch.bool)  # no rule: every key
            if pads:
                ok = ok & (kp >= 0)  # pad keys are never read
            if causal:
                ok = ok & (kp <= qp)
            if window is not None:
                ok = ok & (qp - kp < window)
            if docs is not None:
                qd, kd = docs[0](b, q_idx), docs[1](b, kv_idx)
                ok = ok & (qd == kd) & (qd >= 0)  # one document; -1 = padding
            if user is not None:  # the one dense lookup: a user mask is (B|1, h|1, T, S) anyway
                ok = ok & user[b if user.shape[0] > 1 else 0, h if user.shape[1] > 1 else 0,
                               q_idx, kv_idx]
            return ok
        return mod

    def block_mask(self, B: int | None = None, h: int | None = None, T: int | None = None,
                   S: int | None = None, device: Any = None, block_size: int = 128,
                   compile: bool = False) -> Any:
        """FlexAttention's BlockMask for this spec (None when every key is allowed).

        B and H are passed as None (one mask for every batch item / head) when the spec is
        the same for all of them, which saves memory and time. `compile=True` builds it with
        torch.compile (fast for long sequences; the eager build forms a (T, S) mask once).
        """
        from torch.nn.attention.flex_attention import create_block_mask

        T = self.T if T is None else T
        S = self.S if S is None else S
        if (T, S) != (self.T, self.S):
            raise ValueError(f"block_mask(T, S) must match the spec's (T={self.T}, S={self.S}), "
                             f"got (T={T}, S={S})")
        if B is not None and self.B > 1 and B != self.B:
            raise ValueError(f"block_mask(B=...) must be the spec's batch size {self.B}, got {B}")
        if h is not None and self.H > 1 and h != self.H:
            raise ValueError(f"block_mask(h=...) must be the spec's head count {self.H}, got {h}")
        if self.all_allowed():
            return None
        if device is None:
            device = self.q_pos.device if self.is_torch else "cpu"
        Bm = self.B if self.B > 1 else None  # None: broadcast over the batch
        Hm = self.H if self.H > 1 else None  # None: broadcast over the heads
        return create_block_mask(self.mask_mod(device), Bm, Hm, T, S, device=str(device),
                                 BLOCK_SIZE=block_size, _compile=compile)

    # ---- lowering 4: the tile schedule for tiled kernels ---------------------------------------------
    def tile_kinds(self, block_q: int, block_k: int) -> np.ndarray:
        """(B|1, n_q_blocks, n_k_blocks) int8 of SKIPPED / PARTIAL / FULL, from position ranges.

        Each tile is judged from the smallest and largest position (and document id) of its
        queries and keys, so no (T, S) array is formed; a user mask is read tile by tile.
        SKIPPED: no pair may attend (after the diagonal, left of a window's band, another
        document, all padding). FULL: every pair may. Tiles it cannot decide are PARTIAL.
        """
        bq, bk = require_int("block_q", block_q), require_int("block_k", block_k)
        rules = [self._position_tiles(bq, bk)]  # each rule: (none allowed, all allowed) per tile
        rules += [self._document_tiles(bq, bk)] if self.q_doc is not None else []
        rules += [self._user_tiles(bq, bk)] if self.user is not None else []
        none = functools.reduce(np.logical_or, [r[0] for r in rules])  # one rule forbids all
        every = functools.reduce(np.logical_and, [r[1] for r in rules])  # every rule allows all
        kinds = np.where(none, SKIPPED, np.where(every, FULL, PARTIAL)).astype(np.int8)
        shape = (kinds.shape[0], -(-self.T // bq), -(-self.S // bk))
        return np.broadcast_to(kinds, shape).copy()  # (B|1, nq, nk)

    def _position_tiles(self, bq: int, bk: int) -> tuple[np.ndarray, np.ndarray]:
        """Per tile (B|1, nq|1, nk): no pair / every pair allowed by padding, causal and window."""
        qp, kp = as_numpy(self.q_pos), as_numpy(self.k_pos)
        k_real = kp >= 0 if self.k_doc is None else (kp >= 0) & (as_numpy(self.k_doc) >= 0)
        big = np.iinfo(np.int64).max
        q_lo = _blocks(qp, bq, np.min)[:, :, None]  # (B|1, nq, 1)
        q_hi = _blocks(qp, bq, np.max)[:, :, None]
        k_lo = _blocks(np.where(k_real, kp, big), bk, np.min)[:, None]  # (B|1, 1, nk): real keys
        k_hi = _blocks(np.where(k_real, kp, -big), bk, np.max)[:, None]
        n_real = _blocks(k_real.astype(np.int64), bk, np.sum)[:, None]  # (B|1, 1, nk)
        none = n_real == 0  # only padding in the key block
        every = n_real == np.minimum(bk, self.S - bk * np.arange(n_real.shape[-1]))  # no padding
        if self.causal:
            none = none | (k_lo > q_hi)  # every key after every query
            every = every & (k_hi <= q_lo)  # every key at or before every query
        if self.window is not None:
            none = none | (q_lo - k_hi >= self.window)  # left of the band
            every = every & (q_hi - k_lo < self.window)
        return none, every

    def _document_tiles(self, bq: int, bk: int) -> tuple[np.ndarray, np.ndarray]:
        """Per tile (B|1, nq, nk): no pair / every pair in one document, from the ids' ranges."""
        qd, kd = as_numpy(self.q_doc), as_numpy(self.k_doc)
        qd_lo, qd_hi = _blocks(qd, bq, np.min)[:, :, None], _blocks(qd, bq, np.max)[:, :, None]
        kd_lo, kd_hi = _blocks(kd, bk, np.min)[:, None], _blocks(kd, bk, np.max)[:, None]
        none = (qd_hi < kd_lo) | (kd_hi < qd_lo) | (qd_hi < 0)  # disjoint ids, or pad queries
        every = (qd_lo == qd_hi) & (kd_lo == kd_hi) & (qd_lo == kd_lo) & (qd_lo >= 0)
        return none, every

    def _user_tiles(self, bq: int, bk: int) -> tuple[np.ndarray, np.ndarray]:
        """Per tile (B|1, nq, nk): the user mask allows no pair for any head / every pair for all."""
        u = as_numpy(self.user)  # (B|1, h|1, T, S)
        some = _blocks2(u.any(axis=1), bq, bk, np.max) == 1  # (B|1, nq, nk)
        return ~some, _blocks2(u.all(axis=1), bq, bk, np.min) == 1

    def block(self, t0: int, t1: int, s0: int, s1: int) -> Any:
        """The bool block (B|1, h|1, t1-t0, s1-s0) of queries t0:t1 and keys s0:s1; None if all allowed."""
        sub = MaskSpec(self.q_pos[..., t0:t1], self.k_pos[..., s0:s1], self.causal, self.window,
                       None if self.q_doc is None else self.q_doc[..., t0:t1],
                       None if self.k_doc is None else self.k_doc[..., s0:s1],
                       None if self.user is None else self.user[..., t0:t1, s0:s1])
        return sub.dense()  # (B|1, h|1, t1-t0, s1-s0) or None

    def tile(self, b: int, t0: int, t1: int, s0: int, s1: int, head: int = 0) -> np.ndarray | None:
        """numpy bool (t1-t0, s1-s0) of batch item b (and `head`, for a per-head user mask); None if FULL."""
        m = self.block(t0, t1, s0, s1)
        if m is None:
            return None
        m = as_numpy(m)  # (B|1, h|1, bq, bk)
        out = m[b if m.shape[0] > 1 else 0, head if m.shape[1] > 1 else 0]  # (bq, bk)
        return None if out.all() else out


def _lookup(pos: Any) -> Callable:
    """idx -> position, for a (n,) or (B, n) tensor: the index itself (+ start) when it is a run."""
    start = _first(pos)
    if start is not None:
        return (lambda b, i: i + start) if start else (lambda b, i: i)
    if pos.ndim == 1:
        return lambda b, i: pos[i]
    if pos.shape[0] == 1:
        return lambda b, i: pos[0, i]
    return lambda b, i: pos[b, i]


def _blocks(a: np.ndarray, n: int, reduce: Callable) -> np.ndarray:
    """(B|1, ceil(L/n)): `reduce` over each run of n entries along the last axis of a (L,)|(B, L)."""
    a = np.atleast_2d(a)  # (B|1, L)
    L = a.shape[-1]
    if L == 0:
        return np.zeros((a.shape[0], 0), dtype=a.dtype)
    starts = np.arange(0, L, n)
    ufunc = {np.min: np.minimum, np.max: np.maximum, np.sum: np.add}[reduce]
    return ufunc.reduceat(a, starts, axis=-1)  # (B|1, nblocks)


def _blocks2(a: np.ndarray, bq: int, bk: int, reduce: Callable) -> np.ndarray:
    """(B|1, nq, nk): `reduce` over each (bq, bk) tile of a (B|1, T, S) array."""
    ufunc = {np.min: np.minimum, np.max: np.maximum}[reduce]
    a = a.astype(np.int8)
    rows = ufunc.reduceat(a, np.arange(0, a.shape[1], bq), axis=1)  # (B|1, nq, S)
    return ufunc.reduceat(rows, np.arange(0, a.shape[2], bk), axis=2)  # (B|1, nq, nk)


# ---- packed sequences ----------------------------------------------------------------------------------
def _lengths(lengths: Any) -> np.ndarray:
    """cu_seqlens-style lengths as a (n_docs,) int64 numpy array of whole numbers >= 0."""
    arr = as_numpy(lengths) if hasattr(lengths, "shape") else np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"lengths must be a 1-D list of whole numbers (one per document), got "
                        f"{arr.dtype} of shape {arr.shape}")
    if (arr < 0).any():
        raise ValueError(f"lengths must be >= 0, got {arr.tolist()}")
    return arr.astype(np.int64)


def document_ids(lengths: Any, total: int | None = None, like: Any = None) -> Any:
    """(T,) document id of each packed token: [0]*L_0 + [1]*L_1 + ..., then -1 up to `total`."""
    lens = _lengths(lengths)
    n = int(lens.sum())
    total = n if total is None else require_int("total", total, minimum=0)
    if total < n:
        raise ValueError(f"total={total} is shorter than the documents' {n} tokens")
    ids = np.full(total, -1, dtype=np.int64)
    ids[:n] = np.repeat(np.arange(lens.size), lens)  # (n,)
    like = lengths if like is None else like
    return torch.as_tensor(ids, device=like.device) if is_torch(like) else ids


def _document_positions(doc_ids: Any) -> Any:
    """Position of each token within its document (0, 1, ...; pads -1), (T,)|(B, T), numpy or torch."""
    d = as_numpy(doc_ids)
    d2 = np.atleast_2d(d)  # (B|1, T)
    T = d2.shape[-1]
    idx = np.broadcast_to(np.arange(T), d2.shape)  # (B|1, T)
    new = np.ones(d2.shape, dtype=bool)
    new[:, 1:] = d2[:, 1:] != d2[:, :-1]  # (B|1, T): a document starts here
    start = np.maximum.accumulate(np.where(new, idx, 0), axis=-1)  # (B|1, T): where it started
    pos = np.where(d2 >= 0, idx - start, -1).reshape(d.shape)  # (T,)|(B, T)
    return torch.as_tensor(pos, device=doc_ids.device) if is_torch(doc_ids) else pos


def packed_positions(lengths: Any, total: int | None = None) -> Any:
    """(T,) positions that restart at 0 in each packed document (RoPE's document-relative ones)."""
    return _document_positions(document_ids(lengths, total))
