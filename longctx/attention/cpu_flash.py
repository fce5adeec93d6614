"""The fused CPU flash-attention kernel of PyTorch, with its log-sum-exp and backward.

`aten._scaled_dot_product_flash_attention_for_cpu` returns (out, lse) and
`..._for_cpu_backward` takes the (possibly merged) out/lse back, which is exactly what block
attention needs. It handles GQA natively: K/V stay at kv-head count and dK/dV come back at
kv-head count (no repeat_interleave). Its `is_causal` is top-left aligned, so the planner in
kernel.py only ever asks for causal on square blocks. Masks are passed additively (0/-inf).

On other devices this kernel computes blocks with the exact fp32 math of EagerKernel (and
says so once in the log); on CUDA prefer the `flash` backend for context parallelism.
"""
from __future__ import annotations

import logging

import torch

from longctx.attention.eager import EagerKernel
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
