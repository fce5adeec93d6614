"""All-gather K/V context parallelism (the Llama 3 recipe).

Every rank all-gathers K and V (at kv-head count), restores natural sequence order and
attends with its local queries. With the zigzag layout the two local chunks a = r and
b = 2P-1-r attend to the key prefixes [0, (a+1)c) and [0, (b+1)c) with bottom-right causal
masking, so work is balanced. Document masks use the gathered segment ids. The full K/V are
not kept for backward: they are gathered again, and dK/dV are reduce-scattered back to their
owners in fp32. Simple and robust; costs P x local K/V memory per layer during compute.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from longctx.attention.kernel import AttentionKernel
from longctx.parallel.comm import all_gather_stack, reduce_scatter_stack
from longctx.parallel.saved import SavedForward
from longctx.parallel.sharding import zigzag_permutation

Tensor = torch.Tensor


@dataclass
class AllGatherSpec:
    group: Optional[dist.ProcessGroup]
    index: int
    size: int
    kernel: AttentionKernel


def _gather_kv(k: Tensor, v: Tensor, spec: AllGatherSpec) -> Tensor:
    """Local k, v (B, Hkv, T, D) -> (2, B, Hkv, P*T, D) in natural sequence order."""
    g = all_gather_stack(torch.stack([k, v]), spec.group)  # (P, 2, B, Hkv, T, D)
    P, _, B, H, T, D = g.shape
    cat = g.permute(1, 2, 3, 0, 4, 5).reshape(2, B, H, P * T, D)  # rank-major concatenation
    inv = torch.argsort(zigzag_permutation(P * T, P, g.device))
    return cat.index_select(3, inv)


def _scatter_dkv(dkv: Tensor, spec: AllGatherSpec) -> Tensor:
    """(2, B, Hkv, L, D) gradients in natural order -> local (2, B, Hkv, T, D), summed over ranks."""
    _, B, H, L, D = dkv.shape
    P = spec.size
    z = dkv.index_select(3, zigzag_permutation(L, P, dkv.device))  # rank-major
    z = z.view(2, B, H, P, L // P, D).permute(3, 0, 1, 2, 4, 5)  # (P, 2, B, Hkv, T, D)
    return reduce_scatter_stack(z, spec.group)


def _query_blocks(causal: bool, r: int, P: int, T: int):
    """[(query rows, key prefix length in units of chunks or None=all, causal)]."""
    if not causal:
        return [(slice(0, T), None, False)]
    c = T // 2
    a, b = r, 2 * P - 1 - r
    return [(slice(0, c), (a + 1) * c, True), (slice(c, T), (b + 1) * c, True)]


def allgather_forward(q: Tensor, k: Tensor, v: Tensor, spec: AllGatherSpec, causal: bool, scale: float,
                      q_seg: Optional[Tensor] = None, full_seg: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """q (B, H, T, D) local zigzag; k/v (B, Hkv, T, D); q_seg (B, T); full_seg (B, L) natural order.
    -> out (B, H, T, D), lse (B, H, T) fp32."""
    T = q.shape[2]
    if T % 2:
        raise ValueError(f"all-gather attention needs an even local length (two zigzag chunks), got {T}")
    kv = _gather_kv(k, v, spec)
    outs, lses = [], []
    for rows, stop, is_causal in _query_blocks(causal, spec.index, spec.size, T):
        stop = kv.shape[3] if stop is None else stop
        o, block_lse = spec.kernel.forward(
            q[:, :, rows], kv[0][:, :, :stop], kv[1][:, :, :stop], causal=is_causal, scale=scale,
            segment_ids=None if q_seg is None else q_seg[:, rows],
            kv_segment_ids=None if full_seg is None else full_seg[:, :stop])
        outs.append(o)
        lses.append(block_lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def allgather_backward(dout: Tensor, saved: SavedForward, spec: AllGatherSpec, causal: bool, scale: float,
                       q_seg: Optional[Tensor] = None,
                       full_seg: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of allgather_forward given its inputs and final out/lse (`saved`): (dq, dk, dv)
    for the local shard."""
    q, k, v, out, lse = saved.q, saved.k, saved.v, saved.out, saved.lse
    T = q.shape[2]
    kv = _gather_kv(k, v, spec)  # gathered again instead of kept alive since forward
    dout = dout.to(q.dtype)  # strided is fine for the block kernels
    dq = torch.empty_like(q)
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
    for rows, stop, is_causal in _query_blocks(causal, spec.index, spec.size, T):
        stop = kv.shape[3] if stop is None else stop
        gq, gk, gv = spec.kernel.backward(
            dout[:, :, rows], q[:, :, rows], kv[0][:, :, :stop], kv[1][:, :, :stop], out[:, :, rows],
            lse[:, :, rows], causal=is_causal, scale=scale,
            segment_ids=None if q_seg is None else q_seg[:, rows],
            kv_segment_ids=None if full_seg is None else full_seg[:, :stop])
        dq[:, :, rows] = gq
        dkv[0][:, :, :stop] += gk
        dkv[1][:, :, :stop] += gv
    dkv = _scatter_dkv(dkv, spec)  # reduce-scatter in fp32 back to the owners
    return dq, dkv[0].to(k.dtype), dkv[1].to(v.dtype)
