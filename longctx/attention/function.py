"""Autograd wrapper turning any AttentionKernel into a differentiable attention function."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from longctx.attention.kernel import AttentionKernel

Tensor = torch.Tensor


class KernelAttention(torch.autograd.Function):
    """(q, k, v) -> (out, lse) through kernel.forward / kernel.backward; lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, kernel: AttentionKernel, causal: bool, scale: Optional[float],
                segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor]):
        out, lse = kernel.forward(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                  kv_segment_ids=kv_segment_ids)
        ctx.save_for_backward(q, k, v, out, lse, segment_ids, kv_segment_ids)
        ctx.kernel, ctx.causal, ctx.scale = kernel, causal, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, segment_ids, kv_segment_ids = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(dout, q, k, v, out, lse, causal=ctx.causal, scale=ctx.scale,
                                         segment_ids=segment_ids, kv_segment_ids=kv_segment_ids)
        return dq, dk, dv, None, None, None, None, None


def kernel_attention(kernel: AttentionKernel, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
                     scale: Optional[float] = None, segment_ids: Optional[Tensor] = None,
                     kv_segment_ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return KernelAttention.apply(q, k, v, kernel, causal, scale, segment_ids, kv_segment_ids)
