"""Local attention through torch's fused kernels (the model's default backend).

On CPU `sdpa_attention` runs SdpaKernel, PyTorch's flash kernel with an explicit forward and
backward: GQA without repeating K/V, no T x S mask for plain causal attention, document masks
only on key blocks that actually straddle a document boundary. On other devices it calls
`F.scaled_dot_product_attention` (torch picks flash / memory-efficient kernels); packed
documents there run as one causal call per document (`document_runs_attention`), so no T x T
mask exists and no cross-document pair is computed: what flash-attn's variable-length kernel
does, without flash-attn.

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
from longctx.attention.kernel import AttentionKernel, float_mask, plan_document_tiles, tiles_disjoint

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
    if segment_ids is not None and causal and T == S > 1 and (kv_segment_ids is None or kv_segment_ids is segment_ids):
        out = document_runs_attention(q, k, v, segment_ids, scale=scale)
        if out is not None:
            return out
    mask = build_mask(T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def document_runs_attention(
    q: torch.Tensor,  # (B, Hq, T, D)
    k: torch.Tensor,  # (B, Hkv, T, D)
    v: torch.Tensor,  # (B, Hkv, T, D)
    segment_ids: torch.Tensor,  # (B, T) or (1, T)
    *,
    scale: Optional[float] = None,
) -> Optional[torch.Tensor]:
    """Causal attention over packed documents as one unmasked causal SDPA call per document run
    of each row (autograd through torch's kernels) -> out (B, Hq, T, D); None when a document
    appears in more than one run of a row (its runs would need merging: the caller masks)."""
    B, T = q.shape[0], q.shape[2]
    tiles = plan_document_tiles(B, T, T, causal=True, segment_ids=segment_ids, kv_segment_ids=None)
    if not tiles_disjoint(tiles):
        return None
    gqa = q.shape[1] != k.shape[1]
    rows = []
    for b in range(B):
        # causal squares (a 1-token document: one plain pair) tiling [0, T)
        runs = sorted((t for t in tiles if t.row == b), key=lambda t: t.q0)
        pieces = [F.scaled_dot_product_attention(q[b:b + 1, :, t.q0:t.q1], k[b:b + 1, :, t.k0:t.k1],
                                                 v[b:b + 1, :, t.k0:t.k1], is_causal=t.is_causal, scale=scale,
                                                 enable_gqa=gqa)
                  for t in runs]  # each (1, Hq, n_i, D)
        rows.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
    return rows[0] if B == 1 else torch.cat(rows, dim=0)  # (B, Hq, T, D)
