"""Local (single-device) attention kernels behind one signature; see core.py.

    sdpa_attention / eager_attention / flash_attention(q, k, v, *, causal, scale, segment_ids, kv_segment_ids)
    attention_with_lse(q, k, v, ..., backend="auto") -> (out, lse)   differentiable in q, k, v
    get_kernel(name) -> AttentionKernel   explicit forward (with LSE) / backward, for context parallelism
    get_attention(name) -> AttentionFn    name in auto | flash | sdpa | eager
"""
from typing import Optional, Tuple

import torch

from longctx.attention.core import AttentionFn, build_mask
from longctx.attention.eager import EagerKernel, eager_attention
from longctx.attention.flash import flash_attention, flash_available
from longctx.attention.function import KernelAttention, kernel_attention
from longctx.attention.kernel import AttentionKernel, plan_tiles, resolve_scale
from longctx.attention.lse import merge_attention
from longctx.attention.sdpa import sdpa_attention
from longctx.attention.select import BACKENDS, get_attention, get_kernel, resolve_backend


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    segment_ids: Optional[torch.Tensor] = None,
    kv_segment_ids: Optional[torch.Tensor] = None,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """out (B, Hq, T, D) and fp32 lse (B, Hq, T); gradients flow to q, k, v (not through lse)."""
    kernel = get_kernel(backend, q.device)
    return kernel_attention(kernel, q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                            kv_segment_ids=kv_segment_ids)


__all__ = [
    "AttentionFn", "AttentionKernel", "BACKENDS", "EagerKernel", "KernelAttention", "attention_with_lse",
    "build_mask", "eager_attention", "flash_attention", "flash_available", "get_attention", "get_kernel",
    "kernel_attention", "merge_attention", "plan_tiles", "resolve_backend", "resolve_scale", "sdpa_attention",
]
