"""Local attention through torch's fused kernels (the model's default backend).

On CPU `sdpa_attention` runs SdpaKernel, PyTorch's flash kernel with an explicit forward and
backward: GQA without repeating K/V, no T x S mask for plain causal attention, document masks
only on key blocks that actually straddle a document boundary. On other devices it calls
`F.scaled_dot_product_attention` (torch picks flash / memory-efficient kernels).

SdpaKernel: `aten._scaled_dot_product_flash_attention_for_cpu` returns (out, lse) and
`..._for_cpu_backward` takes the (possibly merged) out/lse back, which is exactly what block
attention needs. It handles GQA natively: K/V stay at kv-head count and dK/dV come back at
kv-head count (no repeat_interleave). Its `is_causal` is top-left aligned, so the planner in
kernel.py only ever asks for causal on square blocks. Masks are passed additively (0/-inf).
On other devices the kernel computes blocks with the exact fp32 math of EagerKernel (and
says so once in the log); on CUDA prefer the `flash` backend for context parallelism.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F

from longctx.attention.core import build_mask
from longctx.attention.eager import EagerKernel
from longctx.attention.function import kernel_attention
from longctx.attention.kernel import AttentionKernel, float_mask

log = logging.getLogger(__name__)
_aten = torch.ops.aten


class SdpaKernel(AttentionKernel):
    name = "sdpa"
    document_runs = True  # on CPU: per-row, per-document unmasked calls (see plan_document_tiles)

    def __init__(self) -> None:
        self._fallback = EagerKernel()
        self._warned = False

    def _use_fallback(self, q: torch.Tensor) -> bool:
        if q.device.type == "cpu":
            return False
        if not self._warned:
            log.warning("sdpa block kernel on %s uses materialized fp32 math; use backend='flash' for speed",
                        q.device.type)
            self._warned = True
        return True

    def _use_document_runs(self, q: torch.Tensor) -> bool:
        return self.document_runs and q.device.type == "cpu"

    def _fwd(self, q, k, v, scale, is_causal, mask):
        if self._use_fallback(q):
            return self._fallback._fwd(q, k, v, scale, is_causal, mask)
        attn_mask = None if mask is None else float_mask(mask, q.dtype)
        out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
        return out, lse

    def _bwd(self, dout, q, k, v, out, lse, scale, is_causal, mask):
        if self._use_fallback(q):
            return self._fallback._bwd(dout, q, k, v, out, lse, scale, is_causal, mask)
        attn_mask = None if mask is None else float_mask(mask, q.dtype)
        dq, dk, dv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse.float().contiguous(), 0.0, is_causal,  # strided dout/out: no copies
            attn_mask=attn_mask, scale=scale)
        return dq, dk, dv


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
