"""Ring attention with the zigzag layout: K/V travel around the ring point to point.

Each of the P ring members holds a local sequence of two chunks [a = r, b = 2P-1-r] (of 2P).
At step s it holds the K/V of member src = (r - s) mod P and computes one block:

    s == 0      q[a|b] x kv[r]          causal (the local layout is in increasing position order)
    src <  r    q[a|b] x kv[src].first  full   (chunk src precedes both local chunks)
    src >  r    q[b]   x kv[src]        full   (both of src's chunks precede chunk b; chunk a sees none)

so every step costs the same (half a local square) and the causal work is balanced. The
transfer for step s+1 is posted before block s is computed (overlap), K/V travel at kv-head
count packed in one message, and partial results are merged in fp32 through the
log-sum-exp. The backward sends K/V around once more; the fp32 dK/dV accumulators travel
with them and arrive home after one extra hop. Non-causal attention uses every block in full.

Document masking: the caller passes the local query segment ids and the segment ids of every
member's local sequence (tiny, gathered once), so blocks are masked exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from longctx.attention.kernel import AttentionKernel
from longctx.attention.lse import NEG_INF, merge_attention
from longctx.parallel.comm import RingComm
from longctx.parallel.saved import SavedForward

Tensor = torch.Tensor


@dataclass
class RingSpec:
    comm: RingComm
    kernel: AttentionKernel
    overlap: bool = True  # post the next transfer before computing (False: wait for it first)

    @property
    def index(self) -> int:
        return self.comm.index

    @property
    def size(self) -> int:
        return self.comm.size


def _block(step: int, src: int, r: int, causal: bool, c: int):
    """(query rows, key cols, is_causal) of the block computed at `step`, or None."""
    full = slice(0, 2 * c)
    if not causal:
        return full, full, False
    if step == 0:
        return full, full, True
    if src < r:
        return full, slice(0, c), False
    return slice(c, 2 * c), full, False


def _seg(ids: Optional[Tensor], sl: slice) -> Optional[Tensor]:
    return None if ids is None else ids[:, sl]


def ring_forward(q: Tensor, k: Tensor, v: Tensor, spec: RingSpec, causal: bool, scale: float,
                 q_seg: Optional[Tensor] = None, kv_segs: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """q (B, H, T, D), k/v (B, Hkv, T, D): local zigzag sequence; q_seg (B, T), kv_segs (P, B, T).
    -> out (B, H, T, D) in q.dtype, lse (B, H, T) fp32."""
    P, r = spec.size, spec.index
    B, H, T, D = q.shape
    if T % 2:
        raise ValueError(f"ring attention needs an even local length (two zigzag chunks), got {T}")
    c = T // 2
    q = q.contiguous()
    kv = torch.stack([k, v])  # (2, B, Hkv, T, D): one message per hop
    out = torch.zeros(B, H, T, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, H, T), NEG_INF, dtype=torch.float32, device=q.device)
    for step in range(P):
        src = (r - step) % P
        pending = spec.comm.send_recv(kv) if step + 1 < P else None  # next hop, before computing
        nxt = pending.wait() if (pending is not None and not spec.overlap) else None
        rows, cols, is_causal = _block(step, src, r, causal, c)
        o, block_lse = spec.kernel.forward(
            q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], causal=is_causal, scale=scale,
            segment_ids=_seg(q_seg, rows), kv_segment_ids=None if kv_segs is None else kv_segs[src][:, cols])
        out[:, :, rows], lse[:, :, rows] = merge_attention(out[:, :, rows], lse[:, :, rows], o, block_lse)
        if pending is not None:
            kv = nxt if nxt is not None else pending.wait()
    return out.to(q.dtype), lse


def ring_backward(dout: Tensor, saved: SavedForward, spec: RingSpec, causal: bool, scale: float,
                  q_seg: Optional[Tensor] = None, kv_segs: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of ring_forward given its inputs and final out/lse (`saved`): (dq, dk, dv) for
    the local shard."""
    q, k, v, out, lse = saved.q, saved.k, saved.v, saved.out, saved.lse
    P, r = spec.size, spec.index
    c = q.shape[2] // 2
    dout = dout.to(q.dtype)  # the block kernels take strided q / out / dout (no layout copies)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = torch.stack([k, v])
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)  # travels with kv
    dkv_pending = None
    for step in range(P):
        src = (r - step) % P
        kv_pending = spec.comm.send_recv(kv, tag=0) if step + 1 < P else None
        kv_next = kv_pending.wait() if (kv_pending is not None and not spec.overlap) else None
        rows, cols, is_causal = _block(step, src, r, causal, c)
        gq, gk, gv = spec.kernel.backward(
            dout[:, :, rows], q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], out[:, :, rows],
            lse[:, :, rows], causal=is_causal, scale=scale, segment_ids=_seg(q_seg, rows),
            kv_segment_ids=None if kv_segs is None else kv_segs[src][:, cols])
        dq[:, :, rows] += gq
        if dkv_pending is not None:
            dkv = dkv_pending.wait()  # the accumulator that came with the kv block we hold
        dkv[0][:, :, cols] += gk
        dkv[1][:, :, cols] += gv
        if P > 1:
            dkv_pending = spec.comm.send_recv(dkv, tag=1)
        if kv_pending is not None:
            kv = kv_next if kv_next is not None else kv_pending.wait()
    if dkv_pending is not None:
        dkv = dkv_pending.wait()  # one extra hop: our own K/V's gradients come home
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
