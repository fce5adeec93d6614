"""FlexAttention over packed documents: causal within each document, by a block mask built from
the document boundaries (never a (T, T) mask, so 128k rows build it in a few MB).

    flex_document_attention(q, k, v, segment_ids, scale=None) -> out (B, Hq, T, D)

The block mask lists, for every 128-query block, the key blocks it can see: from the block
holding the start of its first query's document up to its own (diagonal) block. Key blocks
that lie inside the document of every query of the block, strictly before the diagonal, are
"full" (no mask function evaluated); the rest evaluate `same document and key <= query`.
On CUDA the kernel is torch.compile'd flex_attention (forward and backward); on CPU, torch
runs flex forward only (tests check the mask against the reference there).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

Tensor = torch.Tensor
BLOCK = 128


def document_starts(segment_ids: Tensor) -> Tensor:
    """(B, T) document ids -> (B, T) index of the first token of each token's document run."""
    B, T = segment_ids.shape
    pos = torch.arange(T, device=segment_ids.device).expand(B, T)
    new = torch.ones_like(segment_ids, dtype=torch.bool)
    new[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return torch.where(new, pos, torch.zeros_like(pos)).cummax(dim=1).values


def document_block_mask(segment_ids: Tensor, block: int = BLOCK) -> BlockMask:
    """Causal-within-document BlockMask for (B, T) ids (contiguous runs; one head dimension)."""
    B, T = segment_ids.shape
    device = segment_ids.device
    n = -(-T // block)  # query blocks == key blocks
    starts = document_starts(segment_ids)  # (B, T)
    first = torch.arange(n, device=device) * block  # first query of each block
    last = torch.clamp(first + block - 1, max=T - 1)
    lo = starts[:, first] // block  # (B, n) first key block any query of the block sees
    full_lo = (starts[:, last] + block - 1) // block  # first key block inside every query's document
    i = torch.arange(n, device=device)[None, :, None]  # (1, n, 1) query block
    j = torch.arange(n, device=device)[None, None, :]  # (1, 1, n) key block
    full = (j >= full_lo[:, :, None]) & (j < i)  # (B, n, n)
    partial = (j >= lo[:, :, None]) & (j <= i) & ~full

    def as_indices(keep: Tensor):
        counts = keep.sum(-1, dtype=torch.int32)  # (B, n)
        order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
        return counts[:, None], order[:, None]  # (B, 1, n), (B, 1, n, n): kept blocks first, ascending

    ids = segment_ids

    def mask_mod(b, h, q_idx, kv_idx):
        return (ids[b, q_idx] == ids[b, kv_idx]) & (kv_idx <= q_idx)

    kv_num, kv_idx = as_indices(partial)
    full_num, full_idx = as_indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(T, T))


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def flex_available(device: Optional[torch.device | str]) -> Optional[str]:
    """Why FlexAttention cannot train on `device`, or None (it needs CUDA and triton)."""
    from torch.utils._triton import has_triton

    if device is None or torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "no CUDA device"
    return None if has_triton() else "triton is not installed"


def flex_document_attention(q: Tensor, k: Tensor, v: Tensor, segment_ids: Tensor, *,
                            scale: Optional[float] = None, block_mask: Optional[BlockMask] = None) -> Tensor:
    """q (B, Hq, T, D), k/v (B, Hkv, T, D), segment_ids (B or 1, T) -> out (B, Hq, T, D)."""
    B, T = q.shape[0], q.shape[2]
    if block_mask is None:
        block_mask = document_block_mask(segment_ids.expand(B, T))
    fn = _compiled_flex() if q.device.type == "cuda" else flex_attention
    return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
