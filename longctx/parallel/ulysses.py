"""Ulysses (DeepSpeed-style) sequence parallelism: all-to-all between sequence and head sharding.

Before attention, each of the U members of a Ulysses group trades its local sequence of all
heads for the group's whole sequence of H/U heads; after attention the inverse all-to-all
restores sequence sharding. K/V move at kv-head count when U divides the kv heads; when the
degree exceeds the kv heads (U % Hkv == 0) they are replicated to U heads first, so that each
member gets the single kv head its query heads use (the replication's gradient is the sum).

Layout. With CP rank p = j*U + u (Ulysses index u inner, ring index j outer) and the global
zigzag layout over P = U*R ranks, the union of a Ulysses group's chunks is exactly the ring
zigzag shard j of R (chunks j and 2R-1-j of 2R). After the all-to-all the received pieces
are reordered into [ring chunk j | ring chunk 2R-1-j], which for R = 1 is the natural order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist

from longctx.parallel.comm import all_to_all

Tensor = torch.Tensor


@dataclass
class UlyssesSpec:
    peers: List[int]  # global ranks of the Ulysses group, by Ulysses index
    index: int
    group: Optional[dist.ProcessGroup]  # parent (CP) group the peers belong to

    @property
    def size(self) -> int:
        return len(self.peers)


def _slot_order(U: int) -> List[int]:
    """Received half-chunk slot for each position of the reordered sequence.

    Slot 2u' / 2u'+1 are the first / second local chunk received from member u'. Target
    order: first chunks of members 0..U-1, then second chunks of members U-1..0."""
    return [2 * t for t in range(U)] + [2 * (U - 1 - t) + 1 for t in range(U)]


def scatter_heads(x: Tensor, spec: UlyssesSpec) -> Tensor:
    """(B, H, T, D) sequence-sharded -> (B, H/U, U*T, D) head-sharded, reordered."""
    x = x.contiguous()
    B, H, T, D = x.shape
    U = spec.size
    parts = list(x.view(B, U, H // U, T, D).unbind(1))  # parts[u'] goes to member u'
    recv = all_to_all(parts, spec.peers, spec.index, spec.group)  # recv[u'] = (B, H/U, T, D) from u'
    slots = torch.stack(recv, dim=2).view(B, H // U, 2 * U, T // 2, D)  # slot 2u'+i = chunk i of u'
    order = torch.tensor(_slot_order(U), device=x.device)
    return slots.index_select(2, order).reshape(B, H // U, U * T, D)


def gather_heads(y: Tensor, spec: UlyssesSpec) -> Tensor:
    """Inverse of scatter_heads: (B, H/U, U*T, D) -> (B, H, T, D)."""
    y = y.contiguous()
    B, Hl, L, D = y.shape
    U = spec.size
    T = L // U
    inv = torch.argsort(torch.tensor(_slot_order(U), device=y.device))
    slots = y.view(B, Hl, 2 * U, T // 2, D).index_select(2, inv).view(B, Hl, U, T, D)
    recv = all_to_all(list(slots.unbind(2)), spec.peers, spec.index, spec.group)  # recv[u'] = heads of u'
    return torch.stack(recv, dim=1).reshape(B, U * Hl, T, D)


def replicate_kv_heads(k: Tensor, degree: int) -> Tensor:
    """(B, Hkv, T, D) -> (B, max(Hkv, degree), T, D): replicate kv heads when the Ulysses degree
    exceeds them (degree % Hkv == 0), so every member receives the kv head its queries use."""
    Hkv = k.shape[1]
    return k if Hkv % degree == 0 else k.repeat_interleave(degree // Hkv, dim=1)
