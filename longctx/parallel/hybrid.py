"""Hybrid (2-D) context parallelism: Ulysses degree U (inner) x ring degree R (outer).

The a2a inside a Ulysses group (best inside a node) turns U sequence shards into one ring
shard of H/U heads; the ring (point to point, best across nodes) then runs over the R
members that hold the same heads. U = 1 is plain ring attention, R = 1 plain Ulysses.

Forward and backward are explicit: the backward re-distributes q, k, v, out, lse and dout
with the same all-to-all (cheap next to attention) instead of keeping head-sharded copies
alive, runs the ring / local kernel backward, and sends the gradients back. Pure Ulysses runs
that backward one group of heads at a time (one kv head per member and its query heads), so
the whole sequence's head-sharded tensors exist for one group at once. Gradients of
replicated kv heads (U > Hkv) are summed over their replicas.

Head counts U does not split evenly (heads.HeadShards.even is False) take the range path:
member u attends its contiguous query heads in runs of one kv head or of whole kv groups (one
uniform GQA kernel or ring call each), and the backward goes round by round, each member one
kv head and its query heads per round (as the grouped backward above), the gradients of a kv
head two members share summed in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from longctx.attention.kernel import AttentionKernel
from longctx.parallel.heads import HeadShards
from longctx.parallel.ring import RingSpec, ring_backward, ring_forward
from longctx.parallel.saved import SavedForward
from longctx.parallel.sharding import shard_sequence
from longctx.parallel.ulysses import (
    UlyssesSpec,
    gather_heads,
    gather_ranges,
    replicate_kv_heads,
    scatter_heads,
    scatter_ranges,
)

Tensor = torch.Tensor


@dataclass(frozen=True)
class _Attention:
    """How one attention call runs: its Ulysses and ring groups, the local kernel, causal or not,
    the softmax scale and the natural-order segment ids (B, U*R*T) of packed documents."""

    ulysses: UlyssesSpec
    ring: RingSpec
    kernel: AttentionKernel
    causal: bool
    scale: float
    full_seg: Optional[Tensor]


def _ring_segments(full_seg: Optional[Tensor], ring: RingSpec):
    """(q_seg of this ring member, kv_segs of all members) from natural-order ids (B, L)."""
    if full_seg is None:
        return None, None
    R = ring.size
    kv_segs = torch.stack([shard_sequence(full_seg, i, R, dim=1) for i in range(R)])  # (R, B, L/R)
    return kv_segs[ring.index], kv_segs


def _to_heads(q: Tensor, k: Tensor, v: Tensor, ulysses: UlyssesSpec):
    U = ulysses.size
    if U == 1:
        return q, k, v
    k, v = replicate_kv_heads(k, U), replicate_kv_heads(v, U)
    return scatter_heads(q, ulysses), scatter_heads(k, ulysses), scatter_heads(v, ulysses)  # (B, H/U, U*T, D)


def hybrid_forward(q: Tensor, k: Tensor, v: Tensor, *, ulysses: UlyssesSpec, ring: RingSpec,
                   kernel: AttentionKernel, causal: bool, scale: float,
                   full_seg: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """q (B, H, T, D), k/v (B, Hkv, T, D) local zigzag shards; full_seg (B, U*R*T) natural-order ids.
    -> out (B, H, T, D), lse (B, H, T) fp32, both in the local layout."""
    U = ulysses.size
    if U > 1 and not HeadShards(q.shape[1], k.shape[1], U).even:
        return _uneven_forward(q, k, v, _Attention(ulysses, ring, kernel, causal, scale, full_seg))
    q2, k2, v2 = _to_heads(q, k, v, ulysses)
    if ring.size == 1:  # pure Ulysses: the whole sequence in natural order, H/U heads
        out2, lse2 = kernel.forward(q2, k2, v2, causal=causal, scale=scale, segment_ids=full_seg)
    else:
        q_seg, kv_segs = _ring_segments(full_seg, ring)
        out2, lse2 = ring_forward(q2, k2, v2, ring, causal, scale, q_seg, kv_segs)
    if U == 1:
        return out2, lse2
    del q2, k2, v2  # the head-sharded inputs: freed before the output's all-to-all
    return gather_heads(out2, ulysses), gather_heads(lse2.unsqueeze(-1), ulysses).squeeze(-1)


def _group_heads(x: Tensor, U: int, groups: int, g: int) -> Tensor:
    """(B, H, T, D) local heads -> (B, U*H/(U*groups), T, D): head group g of every member's share."""
    h = x.shape[1] // (U * groups)
    return x.unflatten(1, (U, groups, h))[:, :, g].flatten(1, 2)


def _ulysses_backward_by_head_groups(dout, saved: SavedForward, how: _Attention, groups: int):
    """Pure Ulysses backward over `groups` groups of heads in turn (a group: one kv head per member
    and its query heads): the whole sequence's head-sharded tensors exist for one group at a time,
    so the backward's working set is 1/groups of all heads'. Heads are independent: the results
    are those of one pass over all heads."""
    q, k, v, out, lse = saved.q, saved.k, saved.v, saved.out, saved.lse
    ulysses = how.ulysses
    U = ulysses.size
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for g in range(groups):
        q2, k2, v2, out2, dout2 = (scatter_heads(_group_heads(x, U, groups, g), ulysses)
                                   for x in (q, k, v, out, dout))  # (B, h, U*T, D)
        lse2 = scatter_heads(_group_heads(lse.unsqueeze(-1), U, groups, g), ulysses).squeeze(-1)
        grads = how.kernel.backward(dout2, q2, k2, v2, out2, lse2, causal=how.causal, scale=how.scale,
                                    segment_ids=how.full_seg)
        del q2, k2, v2, out2, dout2, lse2
        for full, grad in zip((dq, dk, dv), grads):
            h = full.shape[1] // (U * groups)
            full.unflatten(1, (U, groups, h))[:, :, g] = gather_heads(grad, ulysses).unflatten(1, (U, h))
    return dq, dk, dv


def hybrid_backward(dout: Tensor, saved: SavedForward, *, ulysses: UlyssesSpec, ring: RingSpec,
                    kernel: AttentionKernel, causal: bool, scale: float,
                    full_seg: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of hybrid_forward given its inputs and final out/lse (`saved`, local layout):
    (dq, dk, dv) for the local shard."""
    q, k, v, out, lse = saved.q, saved.k, saved.v, saved.out, saved.lse
    U = ulysses.size
    if U > 1 and not HeadShards(q.shape[1], k.shape[1], U).even:
        return _uneven_backward(dout.to(out.dtype), saved, _Attention(ulysses, ring, kernel, causal, scale, full_seg))
    groups = k.shape[1] // U  # kv heads per member (0 when they are replicated)
    if U > 1 and ring.size == 1 and groups > 1:
        return _ulysses_backward_by_head_groups(dout.to(out.dtype), saved,
                                                _Attention(ulysses, ring, kernel, causal, scale, full_seg), groups)
    q2, k2, v2 = _to_heads(q, k, v, ulysses)
    if U > 1:
        out2, dout2 = scatter_heads(out, ulysses), scatter_heads(dout.to(out.dtype), ulysses)
        lse2 = scatter_heads(lse.unsqueeze(-1), ulysses).squeeze(-1)
    else:
        out2, dout2, lse2 = out, dout, lse
    if ring.size == 1:
        grads = kernel.backward(dout2, q2, k2, v2, out2, lse2, causal=causal, scale=scale, segment_ids=full_seg)
    else:
        q_seg, kv_segs = _ring_segments(full_seg, ring)
        grads = ring_backward(dout2, SavedForward(q2, k2, v2, out2, lse2), ring, causal, scale, q_seg, kv_segs)
    if U == 1:
        return grads
    del q2, k2, v2, out2, dout2, lse2  # the head-sharded copies: freed before the gradients' all-to-alls
    grads = list(grads)
    for i in range(3):  # each head-sharded gradient is freed once its all-to-all is done
        grads[i] = gather_heads(grads[i], ulysses)
    dq, dk, dv = grads
    Hkv = k.shape[1]
    if dk.shape[1] != Hkv:  # kv heads were replicated: sum the replicas' gradients
        B, _, T, D = dk.shape
        dk = dk.view(B, Hkv, -1, T, D).sum(2)
        dv = dv.view(B, Hkv, -1, T, D).sum(2)
    return dq, dk, dv


# ---------------------------------------------------------------- uneven head shards
def _attend(q2, k2, v2, how: _Attention):
    """Forward of head-sharded q2 (B, h, L, D), k2/v2 (B, hkv, L, D) over the ring (or locally)."""
    if how.ring.size == 1:
        return how.kernel.forward(q2, k2, v2, causal=how.causal, scale=how.scale, segment_ids=how.full_seg)
    q_seg, kv_segs = _ring_segments(how.full_seg, how.ring)
    return ring_forward(q2, k2, v2, how.ring, how.causal, how.scale, q_seg, kv_segs)


def _attend_backward(dout2, saved2: SavedForward, how: _Attention):
    """Backward of _attend given its head-sharded inputs and out/lse (`saved2`)."""
    if how.ring.size == 1:
        return how.kernel.backward(dout2, saved2.q, saved2.k, saved2.v, saved2.out, saved2.lse, causal=how.causal,
                                   scale=how.scale, segment_ids=how.full_seg)
    q_seg, kv_segs = _ring_segments(how.full_seg, how.ring)
    return ring_backward(dout2, saved2, how.ring, how.causal, how.scale, q_seg, kv_segs)


def _uneven_forward(q, k, v, how: _Attention):
    """hybrid_forward for a head split HeadShards calls uneven."""
    ulysses = how.ulysses
    B, H, T, D = q.shape
    shards, u = HeadShards(H, k.shape[1], ulysses.size), ulysses.index
    q_ranges, kv_ranges = shards.q_ranges(), shards.kv_ranges()
    q2 = scatter_ranges(q, q_ranges, ulysses)  # (B, h_u, L, D), L = U*T
    k2, v2 = scatter_ranges(k, kv_ranges, ulysses), scatter_ranges(v, kv_ranges, ulysses)  # (B, kv_u, L, D)
    out2 = torch.empty_like(q2)
    lse2 = q2.new_empty(q2.shape[:3], dtype=torch.float32)
    q0, k0 = q_ranges[u][0], kv_ranges[u][0]
    for qa, qb, ka, kb in shards.calls(u):  # one uniform GQA call per run
        qs, ks = slice(qa - q0, qb - q0), slice(ka - k0, kb - k0)
        o, lse_run = _attend(q2[:, qs].contiguous(), k2[:, ks].contiguous(), v2[:, ks].contiguous(), how)
        out2[:, qs], lse2[:, qs] = o, lse_run
    del q2, k2, v2
    out = gather_ranges(out2, q_ranges, ulysses, q.new_empty(B, H, T, D))
    lse = gather_ranges(lse2.unsqueeze(-1), q_ranges, ulysses, lse2.new_empty(B, H, T, 1)).squeeze(-1)
    return out, lse


def _uneven_backward(dout, saved: SavedForward, how: _Attention):
    """hybrid_backward for an uneven head split, round by round: in round r every member takes
    its r-th run (one kv head and its query heads; none once its runs are done), so the whole
    sequence's head-sharded tensors exist for one kv head per member at a time."""
    q, k, v, out, lse = saved.q, saved.k, saved.v, saved.out, saved.lse
    ulysses = how.ulysses
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    shards, U = HeadShards(H, Hkv, ulysses.size), ulysses.size
    dq = torch.empty_like(q)  # every query head is one member's in exactly one round
    dk = torch.zeros(B, Hkv, T, D, dtype=torch.float32, device=k.device)  # shared kv heads: summed
    dv = torch.zeros_like(dk)
    runs = [shards.runs(u) for u in range(U)]
    for r in range(shards.rounds()):
        now = [rs[r] if r < len(rs) else (0, 0, 0, 0) for rs in runs]
        q_ranges, kv_ranges = [(a, b) for a, b, _, _ in now], [(c, d) for _, _, c, d in now]
        q2, out2, dout2 = (scatter_ranges(x, q_ranges, ulysses) for x in (q, out, dout))  # (B, h, L, D)
        lse2 = scatter_ranges(lse.unsqueeze(-1), q_ranges, ulysses).squeeze(-1)
        k2, v2 = scatter_ranges(k, kv_ranges, ulysses), scatter_ranges(v, kv_ranges, ulysses)  # (B, 0|1, L, D)
        if q2.shape[1]:
            gq, gk, gv = _attend_backward(dout2, SavedForward(q2, k2, v2, out2, lse2), how)
        else:  # this member is done: it only relays the others' heads
            gq, gk, gv = q2, k2, v2
        del q2, k2, v2, out2, dout2, lse2
        gather_ranges(gq, q_ranges, ulysses, dq)
        gather_ranges(gk, kv_ranges, ulysses, dk, accumulate=True)
        gather_ranges(gv, kv_ranges, ulysses, dv, accumulate=True)
    return dq, dk.to(k.dtype), dv.to(v.dtype)
