"""Hybrid (2-D) context parallelism: Ulysses degree U (inner) x ring degree R (outer).

The a2a inside a Ulysses group (best inside a node) turns U sequence shards into one ring
shard of H/U heads; the ring (point to point, best across nodes) then runs over the R
members that hold the same heads. U = 1 is plain ring attention, R = 1 plain Ulysses.
"""
from __future__ import annotations

from typing import Optional

import torch

from longctx.attention.function import kernel_attention
from longctx.attention.kernel import AttentionKernel
from longctx.parallel.ring import RingSpec, ring_attention
from longctx.parallel.sharding import shard_sequence
from longctx.parallel.ulysses import UlyssesSpec, heads_to_seq, replicate_kv_heads, seq_to_heads

Tensor = torch.Tensor


def hybrid_attention(q: Tensor, k: Tensor, v: Tensor, *, ulysses: UlyssesSpec, ring: RingSpec,
                     kernel: AttentionKernel, causal: bool = True, scale: Optional[float] = None,
                     full_seg: Optional[Tensor] = None) -> Tensor:
    """q (B, H, T, D), k/v (B, Hkv, T, D) local zigzag shards; full_seg (B, U*R*T) natural-order ids."""
    U, R = ulysses.size, ring.size
    if U > 1:
        k, v = replicate_kv_heads(k, U), replicate_kv_heads(v, U)
        q, k, v = (seq_to_heads(x, ulysses) for x in (q, k, v))  # (B, H/U, U*T, D) ring-zigzag shard
    if R == 1:  # pure Ulysses: the whole sequence in natural order, H/U heads
        out, _ = kernel_attention(kernel, q, k, v, causal=causal, scale=scale, segment_ids=full_seg)
    else:
        q_seg = kv_segs = None
        if full_seg is not None:
            kv_segs = torch.stack([shard_sequence(full_seg, i, R, dim=1) for i in range(R)])  # (R, B, U*T)
            q_seg = kv_segs[ring.index]
        out = ring_attention(q, k, v, ring, causal=causal, scale=scale, q_seg=q_seg, kv_segs=kv_segs)
    return heads_to_seq(out, ulysses) if U > 1 else out
