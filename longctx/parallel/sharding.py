"""Zigzag sequence layout for context parallelism, and helpers to shard a batch into it.

The sequence is cut into 2P equal chunks; CP rank r holds chunks r and 2P-1-r (in that
order). With causal attention every rank then does the same amount of work: the early chunk
sees few keys, the late chunk many. Every CP implementation (ring, allgather, ulysses,
hybrid) uses this one layout, so the data pipeline shards the same way whatever the impl:

    batch = shard_batch({"input_ids": ids, "labels": labels}, cp_rank, cp_size)
    # -> local input_ids/labels/position_ids (global positions, for RoPE)/segment_ids

Labels arrive pre-shifted (labels[t] is the target of position t), so sharding them with
the same index as input_ids is correct.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.distributed as dist

from longctx.parallel.zigzag import check_seq_len, zigzag_chunks, zigzag_multiple

Tensor = torch.Tensor


def zigzag_indices(seq_len: int, cp_rank: int, cp_size: int, device=None) -> Tensor:
    """Global token positions held by `cp_rank`, in local order: (seq_len // cp_size,) int64."""
    check_seq_len(seq_len, cp_size)
    c = seq_len // zigzag_multiple(cp_size)
    a, b = zigzag_chunks(cp_rank, cp_size)
    return torch.cat([torch.arange(a * c, (a + 1) * c, device=device), torch.arange(b * c, (b + 1) * c, device=device)])


def zigzag_permutation(seq_len: int, cp_size: int, device=None) -> Tensor:
    """perm with full[..., perm] == concat of all ranks' local shards (rank-major)."""
    return torch.cat([zigzag_indices(seq_len, r, cp_size, device) for r in range(cp_size)])


def shard_sequence(x: Tensor, cp_rank: int, cp_size: int, dim: int = 1) -> Tensor:
    """The local zigzag shard of a full-sequence tensor along `dim`."""
    if cp_size == 1:
        return x
    return x.index_select(dim, zigzag_indices(x.shape[dim], cp_rank, cp_size, x.device))


def unshard_sequence(shards: Sequence[Tensor], dim: int = 1) -> Tensor:
    """Inverse of shard_sequence: shards[r] from every rank (in rank order) -> full tensor."""
    P = len(shards)
    cat = torch.cat(list(shards), dim=dim)
    if P == 1:
        return cat
    inv = torch.argsort(zigzag_permutation(cat.shape[dim], P, cat.device))
    return cat.index_select(dim, inv)


def gather_sequence(x: Tensor, group: Optional[dist.ProcessGroup] = None, dim: int = 1) -> Tensor:
    """All-gather local shards over the CP group and return the full sequence (not differentiable)."""
    P = dist.get_world_size(group)
    if P == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(P)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return unshard_sequence(parts, dim=dim)


def positions_from_segments(segment_ids: Tensor) -> Tensor:
    """(B, T) document ids (contiguous runs) -> position ids restarting at 0 in every document."""
    B, T = segment_ids.shape
    idx = torch.arange(T, device=segment_ids.device).expand(B, T)
    start = torch.ones_like(segment_ids, dtype=torch.bool)
    start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    run_start = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - run_start


def shard_batch(batch: Dict[str, Tensor], cp_rank: int, cp_size: int,
                keys: Optional[Sequence[str]] = None) -> Dict[str, Tensor]:
    """Shard the per-token tensors of a batch into the zigzag layout.

    Per-token tensors are those shaped (B, T, ...) like input_ids (input_ids, labels,
    position_ids, segment_ids, loss weights, ...), or exactly `keys` when given.
    position_ids are created first when missing (0..T-1, or restarting per document when
    segment_ids are present), so RoPE sees global positions on every rank. Other entries
    are passed through unchanged.
    """
    out = dict(batch)
    ref = batch["input_ids"]
    if "position_ids" not in batch or batch["position_ids"] is None:
        seg = batch.get("segment_ids")
        out["position_ids"] = (positions_from_segments(seg) if seg is not None
                               else torch.arange(ref.shape[1], device=ref.device).expand(ref.shape[0], -1))
    check_seq_len(ref.shape[1], cp_size)
    for key in (out if keys is None else keys):
        val = out.get(key)
        if isinstance(val, Tensor) and val.dim() >= 2 and tuple(val.shape[:2]) == tuple(ref.shape):
            out[key] = shard_sequence(val, cp_rank, cp_size, dim=1).contiguous()
    return out
