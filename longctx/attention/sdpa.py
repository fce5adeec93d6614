"""Local attention through torch's scaled_dot_product_attention (the default backend)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from longctx.attention.core import build_mask


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
    T, S = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if causal and T == 1:
        causal = False  # a single query at the end sees every key (bottom-right alignment)
    if segment_ids is None and (not causal or T == S):
        # Fast path: fused kernel, no mask tensor; enable_gqa avoids repeating K/V.
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal and T > 1, scale=scale, enable_gqa=gqa)
    mask = build_mask(T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
