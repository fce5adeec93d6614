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
from typing import List, Optional, Tuple

import torch

from longctx.attention.core import build_mask
from longctx.attention.lse import NEG_INF, lse_for_backward, merge_attention

Tensor = torch.Tensor


def resolve_scale(scale: Optional[float], head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


@dataclass
class KeyBlock:
    start: int  # key range [start, stop)
    stop: int
    is_causal: bool  # square block, top-left == bottom-right causal, no mask
    mask: Optional[Tensor]  # (B or 1, 1, T, stop - start) bool keep-mask, or None


def plan_blocks(
    T: int,
    S: int,
    *,
    causal: bool,
    segment_ids: Optional[Tensor],
    kv_segment_ids: Optional[Tensor],
    device: torch.device,
) -> List[KeyBlock]:
    """Split the key range into blocks the primitives can run without a T x S causal mask."""
    if segment_ids is not None and kv_segment_ids is None:
        if T != S:
            raise ValueError("kv_segment_ids is required when query and key lengths differ")
        kv_segment_ids = segment_ids
    if not causal:
        pieces = [(0, S, False)]
    elif T == S:
        pieces = [(0, S, True)]
    elif T < S:
        pieces = [(0, S - T, False), (S - T, S, True)]
    else:  # more queries than keys: the first T - S queries see nothing
        mask = build_mask(T, S, causal=True, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids, device=device)
        return [KeyBlock(0, S, False, mask)] if bool(mask.any()) else []
    blocks = []
    for start, stop, is_causal in pieces:
        if stop <= start:
            continue
        if segment_ids is None:
            blocks.append(KeyBlock(start, stop, is_causal, None))
            continue
        same = segment_ids[:, :, None] == kv_segment_ids[:, None, start:stop]  # (B, T, s)
        if bool(same.all()):
            blocks.append(KeyBlock(start, stop, is_causal, None))
            continue
        if is_causal:
            same = same & torch.ones(T, stop - start, dtype=torch.bool, device=device).tril()
        if bool(same.any()):
            blocks.append(KeyBlock(start, stop, False, same[:, None]))  # (B, 1, T, s)
    return blocks


class AttentionKernel:
    """Base class: block planning, LSE merging and gradient accumulation."""

    name = "base"

    # -- primitives (one key block) -------------------------------------------------------
    def _fwd(self, q: Tensor, k: Tensor, v: Tensor, scale: float, is_causal: bool,
             mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _bwd(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float,
             is_causal: bool, mask: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

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
        blocks = plan_blocks(T, k.shape[2], causal=causal, segment_ids=segment_ids,
                             kv_segment_ids=kv_segment_ids, device=q.device)
        out = lse = None
        for blk in blocks:
            o, l = self._fwd(q, k[:, :, blk.start:blk.stop], v[:, :, blk.start:blk.stop], scale, blk.is_causal, blk.mask)
            l = l.float()
            if blk.mask is not None:  # rows with no visible key in this block: (0, -inf)
                empty = ~blk.mask.any(-1)  # (B, 1, T)
                l = l.masked_fill(empty, NEG_INF)
                o = o.masked_fill(empty[..., None], 0.0)
            out, lse = (o, l) if out is None else merge_attention(out, lse, o, l)
        if out is None:
            return q.new_zeros(q.shape), torch.full((B, H, T), NEG_INF, dtype=torch.float32, device=q.device)
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
        blocks = plan_blocks(T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                             device=q.device)
        lse = lse_for_backward(lse)
        dout, out = dout.to(q.dtype).contiguous(), out.to(q.dtype).contiguous()
        if len(blocks) == 1 and blocks[0].start == 0 and blocks[0].stop == S:
            blk = blocks[0]
            return self._bwd(dout, q, k, v, out, lse, scale, blk.is_causal, blk.mask)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for blk in blocks:
            sl = slice(blk.start, blk.stop)
            gq, gk, gv = self._bwd(dout, q, k[:, :, sl], v[:, :, sl], out, lse, scale, blk.is_causal, blk.mask)
            dq += gq
            dk[:, :, sl] += gk
            dv[:, :, sl] += gv
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


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
