"""Local attention through torch's fused kernels (the model's default backend).

On CPU this runs PyTorch's flash kernel with an explicit forward/backward (see cpu_flash.py):
GQA without repeating K/V, no T x S mask for plain causal attention, document masks only on
key blocks that actually straddle a document boundary. On other devices it calls
`F.scaled_dot_product_attention` (torch picks flash / memory-efficient kernels).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from longctx.attention.core import build_mask
from longctx.attention.cpu_flash import SdpaKernel
from longctx.attention.function import kernel_attention

_KERNEL = SdpaKernel()


def sdpa_attention(
    q: torch.Tensor,  # (B, Hq, T, D)
    k: torch.Tensor,  # (B, Hkv, S, D)
    v: torch.Tensor,  # (B, Hkv, S, D)
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    segment_ids: Optional[torch.Tensor] = None,
    kv_segment_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    if q.device.type == "cpu":
        out, _ = kernel_attention(_KERNEL, q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                  kv_segment_ids=kv_segment_ids)
        return out
    T, S = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if segment_ids is None and (not causal or T == S):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal and T > 1, scale=scale, enable_gqa=gqa)
    mask = build_mask(T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
