"""Ulysses (DeepSpeed-style) sequence parallelism: all-to-all between sequence and head sharding.

Before attention, each of the U members of a Ulysses group trades its local sequence of all
heads for the group's whole sequence of H/U heads; after attention the inverse all-to-all
restores sequence sharding. K/V move at kv-head count when U divides the kv heads; when the
degree exceeds the kv heads (U % Hkv == 0) they are replicated to U heads first, so that each
member gets the single kv head its query heads use (the replication's gradient is the sum).

Any other head count (U does not divide Hq, or Hkv is neither a multiple nor a divisor of U)
takes the range form: member u gets the contiguous query heads and the kv heads they use that
heads.HeadShards assigns (ceil or floor of Hq/U; a kv head shared by two members is sent to
both), moved by a variable-size all-to-all (scatter_ranges / gather_ranges).

Layout. With CP rank p = j*U + u (Ulysses index u inner, ring index j outer) and the global
zigzag layout over P = U*R ranks, the union of a Ulysses group's chunks is exactly the ring
zigzag shard j of R (chunks j and 2R-1-j of 2R). After the all-to-all the received pieces
are reordered into [ring chunk j | ring chunk 2R-1-j], which for R = 1 is the natural order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from longctx.parallel.comm import all_to_all, all_to_all_v
from longctx.parallel.heads import Range

Tensor = torch.Tensor


@dataclass
class UlyssesSpec:
    peers: List[int]  # global ranks of the Ulysses group, by Ulysses index
    index: int
    group: Optional[dist.ProcessGroup]  # parent (CP) group the peers belong to

    @property
    def size(self) -> int:
        return len(self.peers)


def _halves(U: int, half: int):
    """(member, which half, sequence slice) of the reordered sequence: the first chunks of
    members 0..U-1, then the second chunks of members U-1..0 (the ring zigzag order)."""
    for u in range(U):
        yield u, 0, slice(u * half, (u + 1) * half)
        yield u, 1, slice((2 * U - 1 - u) * half, (2 * U - u) * half)


def scatter_heads(x: Tensor, spec: UlyssesSpec) -> Tensor:
    """(B, H, T, D) sequence-sharded -> (B, H/U, U*T, D) head-sharded, reordered."""
    x = x.contiguous()
    B, H, T, D = x.shape
    U, half = spec.size, T // 2
    send = x.view(B, U, H // U, T, D).transpose(0, 1)  # send[u'] goes to member u' (a view when B == 1)
    recv = all_to_all(send, spec.peers, spec.index, spec.group)  # recv[u'] = (B, H/U, T, D) from u'
    out = x.new_empty(B, H // U, U * T, D)
    for u, which, seq in _halves(U, half):  # received halves written straight into place
        out[:, :, seq] = recv[u, :, :, which * half:(which + 1) * half]
    return out


def gather_heads(y: Tensor, spec: UlyssesSpec) -> Tensor:
    """Inverse of scatter_heads: (B, H/U, U*T, D) -> (B, H, T, D)."""
    B, Hl, L, D = y.shape
    U = spec.size
    T = L // U
    half = T // 2
    send = y.new_empty(U, B, Hl, T, D)  # send[u'] = member u''s two sequence chunks of these heads
    for u, which, seq in _halves(U, half):
        send[u, :, :, which * half:(which + 1) * half] = y[:, :, seq]
    recv = all_to_all(send, spec.peers, spec.index, spec.group)  # recv[u'] = heads of member u'
    return recv.transpose(0, 1).reshape(B, U * Hl, T, D)


def replicate_kv_heads(k: Tensor, degree: int) -> Tensor:
    """(B, Hkv, T, D) -> (B, max(Hkv, degree), T, D): replicate kv heads when the Ulysses degree
    exceeds them (degree % Hkv == 0), so every member receives the kv head its queries use."""
    Hkv = k.shape[1]
    return k if Hkv % degree == 0 else k.repeat_interleave(degree // Hkv, dim=1)


def _tiles(ranges: Sequence[Range], H: int) -> bool:
    """Whether the ranges are [0, H) cut in order (then the head-major input is the send buffer)."""
    return ranges[0][0] == 0 and ranges[-1][1] == H and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def scatter_ranges(x: Tensor, ranges: Sequence[Range], spec: UlyssesSpec) -> Tensor:
    """(B, H, T, D) sequence-sharded -> (B, n, U*T, D): heads ranges[index] (n of them) of the
    group's whole sequence, reordered as scatter_heads. Member u receives heads ranges[u]; the
    ranges may differ in size, overlap (replicated heads) or be empty."""
    B, H, T, D = x.shape
    U, half = spec.size, T // 2
    by_head = x.transpose(0, 1)  # (H, B, T, D): a view, contiguous when B == 1
    send = by_head if _tiles(ranges, H) else torch.cat([by_head[lo:hi] for lo, hi in ranges])
    lo, hi = ranges[spec.index]
    n = hi - lo
    recv = all_to_all_v(send, [b - a for a, b in ranges], [n] * U, spec.peers, spec.index, spec.group)
    recv = recv.view(U, n, B, T, D)  # recv[u'] = these heads of member u''s sequence shard
    out = x.new_empty(B, n, U * T, D)
    for u, which, seq in _halves(U, half):
        out[:, :, seq] = recv[u, :, :, which * half:(which + 1) * half].transpose(0, 1)
    return out


def gather_ranges(y: Tensor, ranges: Sequence[Range], spec: UlyssesSpec, out: Tensor,
                  accumulate: bool = False) -> Tensor:
    """Inverse of scatter_ranges: y (B, n, U*T, D) holds heads ranges[index] of the whole
    sequence; every member's heads of this member's shard are written (accumulate: added, for
    the gradients of replicated kv heads) into out[:, lo:hi] (B, H, T, D). Returns out."""
    B, n, L, D = y.shape
    U = spec.size
    T = L // U
    half = T // 2
    send = y.new_empty(U, n, B, T, D)  # send[u'] = member u''s two sequence chunks of these heads
    for u, which, seq in _halves(U, half):
        send[u, :, :, which * half:(which + 1) * half] = y[:, :, seq].transpose(0, 1)
    sizes = [hi - lo for lo, hi in ranges]
    recv = all_to_all_v(send.view(U * n, B, T, D), [n] * U, sizes, spec.peers, spec.index, spec.group)
    offset = 0
    for lo, hi in ranges:  # recv holds member u''s heads at its offset, head-major
        piece = recv[offset:offset + hi - lo].transpose(0, 1)  # (B, hi - lo, T, D)
        if accumulate:
            out[:, lo:hi] += piece
        else:
            out[:, lo:hi] = piece
        offset += hi - lo
    return out
