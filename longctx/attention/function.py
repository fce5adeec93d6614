"""Autograd wrapper turning any AttentionKernel into a differentiable attention function."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from longctx.attention.kernel import AttentionKernel
from longctx.attention.sinks import add_sinks, sinks_grad

Tensor = torch.Tensor


class KernelAttention(torch.autograd.Function):
    """(q, k, v[, sinks]) -> (out, lse) through kernel.forward / kernel.backward; lse is not
    differentiable. With `sinks` (Hq,) the output and lse include them (attention/sinks.py)."""

    @staticmethod
    def forward(ctx, q, k, v, kernel: AttentionKernel, causal: bool, scale: Optional[float],
                segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor], sinks: Optional[Tensor] = None):
        out, lse = kernel.forward(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                  kv_segment_ids=kv_segment_ids)
        if sinks is not None:
            out, lse = add_sinks(out, lse, sinks)
        ctx.save_for_backward(q, k, v, out, lse, segment_ids, kv_segment_ids, sinks)
        ctx.kernel, ctx.causal, ctx.scale = kernel, causal, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, segment_ids, kv_segment_ids, sinks = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(dout, q, k, v, out, lse, causal=ctx.causal, scale=ctx.scale,
                                         segment_ids=segment_ids, kv_segment_ids=kv_segment_ids)
        dsinks = sinks_grad(dout, out, lse, sinks) if sinks is not None and ctx.needs_input_grad[8] else None
        return dq, dk, dv, None, None, None, None, None, dsinks


def kernel_attention(kernel: AttentionKernel, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
                     scale: Optional[float] = None, segment_ids: Optional[Tensor] = None,
                     kv_segment_ids: Optional[Tensor] = None, sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return KernelAttention.apply(q, k, v, kernel, causal, scale, segment_ids, kv_segment_ids, sinks)
