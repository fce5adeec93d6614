"""Attention kernels with an explicit forward (returning the log-sum-exp) and backward.

Context-parallel code needs more than `out = attn(q, k, v)`: it computes attention block by
block, merges blocks through their log-sum-exp (LSE), and runs the backward of each block
with the *final* output and LSE. An `AttentionKernel` provides exactly that:

    kernel.forward(q, k, v, causal=, scale=, segment_ids=, kv_segment_ids=) -> (out, lse)
    kernel.backward(dout, q, k, v, out, lse, causal=, scale=, ...)        -> (dq, dk, dv)

Shapes follow core.py: q (B, Hq, T, D), k/v (B, Hkv, S, D) at kv-head count (GQA handled by
the kernel, dk/dv come back at kv-head count), lse fp32 (B, Hq, T). Causal masking is
bottom-right aligned. `out`/`lse` given to backward may come from a larger merged
computation: each block's gradient is then its exact share of the full gradient.

Subclasses implement two primitives on one key block, either unmasked-causal on a square
block, unmasked non-causal, or with a boolean keep-mask:

    _fwd(q, k, v, scale, is_causal, mask) -> (out, lse)
    _bwd(dout, q, k, v, out, lse, scale, is_causal, mask) -> (dq, dk, dv)

The shared planner below turns (causal, T, S, segment ids) into such blocks: a causal query
block shorter than its keys is split into an unmasked prefix plus a square causal block
(no T x S mask is built), and document masks are dropped when a block lies inside one
document or skipped when the block has no pair in the same document.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch

from longctx.attention.lse import NEG_INF, lse_for_backward, merge_attention

Tensor = torch.Tensor


def resolve_scale(scale: Optional[float], head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


DEFAULT_TILE = 1024  # document masks are built per (tile x tile) block, never T x S


@dataclass
class Tile:
    """Queries [q0, q1) x keys [k0, k1), run by one primitive call."""
    q0: int
    q1: int
    k0: int
    k1: int
    is_causal: bool  # square block, top-left == bottom-right causal, no mask
    mask: Optional[Tensor]  # (B or 1, 1, q1 - q0, k1 - k0) bool keep-mask, or None
    row: Optional[int] = None  # one batch row (document-run tiles), or None: every row


def _kv_ids(T: int, S: int, segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor]) -> Optional[Tensor]:
    """The keys' segment ids: the queries' own when not given (only valid for T == S)."""
    if segment_ids is not None and kv_segment_ids is None:
        if T != S:
            raise ValueError("kv_segment_ids is required when query and key lengths differ")
        return segment_ids
    return kv_segment_ids


def _whole(tiles: List[Tile], T: int, S: int) -> bool:
    """One tile covering every row and the whole (T, S) block: one call, no accumulators."""
    if len(tiles) != 1:
        return False
    t = tiles[0]
    return t.row is None and (t.q0, t.q1, t.k0, t.k1) == (0, T, 0, S)


def plan_tiles(
    T: int,
    S: int,
    *,
    causal: bool,
    segment_ids: Optional[Tensor],
    kv_segment_ids: Optional[Tensor],
    device: torch.device,
    tile: int = DEFAULT_TILE,
) -> List[Tile]:
    """Cover the visible (query, key) pairs with tiles the primitives can run.

    Without documents no mask is ever built: causal attention with T < S is an unmasked
    prefix plus a square causal block (T > S: the last S queries form the square, the first
    T - S see nothing). With documents the pairs are tiled (tile x tile); a tile inside one
    document runs unmasked (causal only on an aligned diagonal square), a tile without any
    same-document pair is skipped, and only tiles straddling a boundary carry a small mask.
    Adjacent unmasked tiles of a query row are merged into one call.
    """
    kv_segment_ids = _kv_ids(T, S, segment_ids, kv_segment_ids)
    off = S - T  # query i sits at key position i + off (bottom-right alignment)
    if segment_ids is not None:
        lo, hi = segment_ids.min(), segment_ids.max()
        if bool((lo == hi) & (kv_segment_ids.min() == lo) & (kv_segment_ids.max() == lo)):
            segment_ids = kv_segment_ids = None  # a single document: no mask at all
    if segment_ids is None:
        return _unmasked_tiles(T, S, causal)
    tiles: List[Tile] = []
    for qa in range(0, T, tile):
        tiles.extend(_document_row(qa, min(T, qa + tile), S, off, causal, segment_ids, kv_segment_ids, device, tile))
    return tiles


def _unmasked_tiles(T: int, S: int, causal: bool) -> List[Tile]:
    """Causal attention with T < S: an unmasked prefix and a square causal block; T > S: the
    last S queries form the square, the first T - S see nothing."""
    off = S - T
    if not causal:
        return [Tile(0, T, 0, S, False, None)]
    if T == S:
        return [Tile(0, T, 0, S, True, None)]
    if T < S:
        return [Tile(0, T, 0, off, False, None), Tile(0, T, off, S, True, None)]
    return [Tile(T - S, T, 0, S, True, None)] if S > 0 else []


def _document_row(qa: int, qb: int, S: int, off: int, causal: bool, segment_ids: Tensor, kv_segment_ids: Tensor,
                  device: torch.device, tile: int) -> List[Tile]:
    """The tiles of query rows [qa, qb) under document masking (see plan_tiles)."""
    row: List[Tile] = []
    for ka in range(0, S, tile):
        kb = min(S, ka + tile)
        if causal and ka > qb - 1 + off:
            break  # this and all later key tiles lie after every query of the row
        same = segment_ids[:, qa:qb, None] == kv_segment_ids[:, None, ka:kb]  # (B, tq, tk)
        if not bool(same.any()):
            continue
        partial = causal and kb - 1 > qa + off  # some keys lie after some queries
        if partial and qa + off == ka and qb - qa == kb - ka and bool(same.all()):
            row.append(Tile(qa, qb, ka, kb, True, None))
            continue
        if partial:
            qpos = torch.arange(qa + off, qb + off, device=device)
            same = same & (torch.arange(ka, kb, device=device)[None, :] <= qpos[:, None])
            if not bool(same.any()):
                continue
        if not partial and bool(same.all()):
            prev = row[-1] if row else None
            if prev is not None and prev.mask is None and not prev.is_causal and prev.k1 == ka:
                prev.k1 = kb  # extend the previous unmasked tile
            else:
                row.append(Tile(qa, qb, ka, kb, False, None))
            continue
        row.append(Tile(qa, qb, ka, kb, False, same[:, None]))
    return row


def row_runs(ids: Tensor) -> List[List[Tuple[int, int, int]]]:
    """(B, n) segment ids -> per row, [(start, end, id)] of its constant runs."""
    B, n = ids.shape
    starts: List[List[int]] = [[0] for _ in range(B)]
    for b, i in (ids[:, 1:] != ids[:, :-1]).nonzero().tolist():  # a new run starts at i + 1
        starts[b].append(i + 1)
    rows = [b for b in range(B) for _ in starts[b]]
    values = iter(ids[rows, [p for b in range(B) for p in starts[b]]].tolist())
    return [[(a, z, next(values)) for a, z in zip(st, st[1:] + [n])] for st in starts]


def _visible_tiles(qa: int, qb: int, ka: int, kb: int, off: int, causal: bool, row: int) -> List[Tile]:
    """Unmasked tiles covering what queries [qa, qb) see of keys [ka, kb) (query i sits at key
    position i + off): a fully visible prefix, an aligned causal square, and a fully visible
    tail (queries past the last key); nothing for queries before the first key."""
    if not causal or kb - 1 <= qa + off:
        return [Tile(qa, qb, ka, kb, False, None, row)]
    if ka > qb - 1 + off:
        return []
    q0 = max(qa, ka - off)  # earlier queries see none of these keys
    s0 = q0 + off  # key position of query q0: the square's corner
    q_sq = min(qb, kb - off)  # queries [q0, q_sq) see keys up to their own position
    tiles = [Tile(q0, qb, ka, s0, False, None, row)] if s0 > ka else []
    tiles.append(Tile(q0, q_sq, s0, s0 + (q_sq - q0), True, None, row))
    if q_sq < qb:
        tiles.append(Tile(q_sq, qb, s0, kb, False, None, row))
    return tiles


def plan_document_tiles(
    B: int,
    T: int,
    S: int,
    *,
    causal: bool,
    segment_ids: Optional[Tensor],
    kv_segment_ids: Optional[Tensor],
) -> List[Tile]:
    """Varlen attention by tiles: per batch row, each document run of the queries against the
    run(s) of the same document in the keys, unmasked (causal only on aligned squares). No
    mask is built and no cross-document pair is computed: a row of documents of lengths n_i
    costs sum(n_i^2) instead of T x S. Segment ids must be contiguous runs per document
    within the block (packed rows and zigzag-local sequences are). Without segment ids each
    row is one document: one tile per row (on CPU, per-row calls of the flash backward are
    faster than one batched call, whose fp32 scratch outgrows the cache)."""
    tiles: List[Tile] = []
    for b, qa, qb, ka, kb in document_pairs(B, T, S, segment_ids, kv_segment_ids):
        tiles.extend(_visible_tiles(qa, qb, ka, kb, S - T, causal, b))
    return tiles


def document_pairs(B: int, T: int, S: int, segment_ids: Optional[Tensor],
                   kv_segment_ids: Optional[Tensor]) -> Iterator[Tuple[int, int, int, int, int]]:
    """(row, q0, q1, k0, k1) for every query run and key run of the same document in a row
    (without segment ids: the whole row once). Reads the ids on the host."""
    kv_segment_ids = _kv_ids(T, S, segment_ids, kv_segment_ids)
    if segment_ids is None:
        q_runs, k_runs = [[(0, T, 0)]] * B, [[(0, S, 0)]] * B
    else:
        q_runs, k_runs = row_runs(segment_ids.expand(B, T)), row_runs(kv_segment_ids.expand(B, S))
    for b in range(B):
        keys: dict = {}
        for ka, kb, doc in k_runs[b]:
            keys.setdefault(doc, []).append((ka, kb))
        for qa, qb, doc in q_runs[b]:
            for ka, kb in keys.get(doc, ()):
                yield b, qa, qb, ka, kb


def _disjoint(tiles: List[Tile]) -> bool:
    """True when no two tiles share a query or a key of the same row (each output and each
    gradient entry comes from at most one tile: no merging, no fp32 accumulators)."""
    for lo, hi in (("q0", "q1"), ("k0", "k1")):
        spans = sorted((-1 if t.row is None else t.row, getattr(t, lo), getattr(t, hi)) for t in tiles)
        if any(a[0] == b[0] and b[1] < a[2] for a, b in zip(spans, spans[1:])):
            return False
    return True


class AttentionKernel:
    """Base class: tile planning, LSE merging and gradient accumulation."""

    name = "base"
    tile = DEFAULT_TILE  # tile edge for document-masked attention
    # plan by document runs per batch row (plan_document_tiles) instead of masked tiles
    document_runs = False

    # -- primitives (one key block) -------------------------------------------------------
    def _fwd(self, q: Tensor, k: Tensor, v: Tensor, scale: float, is_causal: bool,
             mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _bwd(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float,
             is_causal: bool, mask: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def _use_document_runs(self, q: Tensor) -> bool:
        return self.document_runs

    def plan(self, q: Tensor, k: Tensor, causal: bool, segment_ids: Optional[Tensor],
             kv_segment_ids: Optional[Tensor]) -> List[Tile]:
        B, T, S = q.shape[0], q.shape[2], k.shape[2]
        if T > 1 and self._use_document_runs(q):  # decode steps (T == 1) stay one batched call
            return plan_document_tiles(B, T, S, causal=causal, segment_ids=segment_ids,
                                       kv_segment_ids=kv_segment_ids)
        return plan_tiles(T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                          device=q.device, tile=self.tile)

    # -- public ---------------------------------------------------------------------------
    def forward(
        self,
        q: Tensor,  # (B, Hq, T, D)
        k: Tensor,  # (B, Hkv, S, D)
        v: Tensor,  # (B, Hkv, S, D)
        *,
        causal: bool = True,
        scale: Optional[float] = None,
        segment_ids: Optional[Tensor] = None,
        kv_segment_ids: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tensor]:
        """-> out (B, Hq, T, D) in q.dtype, lse (B, Hq, T) fp32 (-inf where no key is visible)."""
        _check_shapes(q, k, v)
        scale = resolve_scale(scale, q.shape[-1])
        B, H, T, D = q.shape
        S = k.shape[2]
        tiles = self.plan(q, k, causal, segment_ids, kv_segment_ids)
        if _whole(tiles, T, S):
            t = tiles[0]  # the common case: one call, no accumulators
            out, lse = self._fwd(q, k, v, scale, t.is_causal, t.mask)
            return _fix_empty_rows(out, lse.float(), t.mask)
        direct = _disjoint(tiles)  # each output row from one tile: write it, no merge
        out = torch.zeros(B, H, T, D, dtype=q.dtype if direct else torch.float32, device=q.device)
        lse = torch.full((B, H, T), NEG_INF, dtype=torch.float32, device=q.device)
        for t in tiles:
            b = slice(None) if t.row is None else slice(t.row, t.row + 1)
            o, tile_lse = self._fwd(q[b, :, t.q0:t.q1], k[b, :, t.k0:t.k1], v[b, :, t.k0:t.k1], scale, t.is_causal,
                                    t.mask)
            o, tile_lse = _fix_empty_rows(o, tile_lse.float(), t.mask)
            rows = slice(t.q0, t.q1)
            if direct:
                out[b, :, rows], lse[b, :, rows] = o, tile_lse
            else:
                out[b, :, rows], lse[b, :, rows] = merge_attention(out[b, :, rows], lse[b, :, rows], o, tile_lse)
        return out.to(q.dtype), lse

    def backward(
        self,
        dout: Tensor,  # (B, Hq, T, D)
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,  # (B, Hq, T, D) final output of the whole attention these keys are part of
        lse: Tensor,  # (B, Hq, T) fp32 final lse
        *,
        causal: bool = True,
        scale: Optional[float] = None,
        segment_ids: Optional[Tensor] = None,
        kv_segment_ids: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """-> dq (B, Hq, T, D), dk, dv (B, Hkv, S, D), in the dtypes of q, k, v."""
        _check_shapes(q, k, v)
        scale = resolve_scale(scale, q.shape[-1])
        T, S = q.shape[2], k.shape[2]
        tiles = self.plan(q, k, causal, segment_ids, kv_segment_ids)
        lse = lse_for_backward(lse)
        # no contiguous(): every kernel takes strided q/k/v/out/dout (the CPU flash kernel reads its
        # own (B, T, H, D) output layout and the o_proj gradient's as they are; flash transposes)
        dout, out = dout.to(q.dtype), out.to(q.dtype)
        if _whole(tiles, T, S):
            t = tiles[0]
            return self._bwd(dout, q, k, v, out, lse, scale, t.is_causal, t.mask)
        direct = _disjoint(tiles)  # each gradient entry from one tile: write it in place
        acc = (lambda x: x.dtype) if direct else (lambda x: torch.float32)
        dq = torch.zeros(q.shape, dtype=acc(q), device=q.device)
        dk = torch.zeros(k.shape, dtype=acc(k), device=k.device)
        dv = torch.zeros(v.shape, dtype=acc(v), device=v.device)
        for t in tiles:
            b = slice(None) if t.row is None else slice(t.row, t.row + 1)
            rows, cols = slice(t.q0, t.q1), slice(t.k0, t.k1)
            gq, gk, gv = self._bwd(dout[b, :, rows], q[b, :, rows], k[b, :, cols], v[b, :, cols], out[b, :, rows],
                                   lse[b, :, rows], scale, t.is_causal, t.mask)
            if direct:
                dq[b, :, rows], dk[b, :, cols], dv[b, :, cols] = gq, gk, gv
            else:
                dq[b, :, rows] += gq
                dk[b, :, cols] += gk
                dv[b, :, cols] += gv
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _fix_empty_rows(out: Tensor, lse: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Rows with no visible key in a masked call: (0, -inf), whatever the kernel returned."""
    if mask is None:
        return out, lse
    empty = ~mask.any(-1)  # (B, 1, T)
    return out.masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, NEG_INF)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention expects 4-D (B, H, T, D) tensors, got q{tuple(q.shape)} k{tuple(k.shape)}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of kv heads {k.shape[1]}")


def float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean keep-mask -> additive mask (0 / -inf) in `dtype`."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, NEG_INF)
