"""Local attention through torch's fused kernels (the model's default backend).

On CPU `sdpa_attention` runs SdpaKernel, PyTorch's flash kernel with an explicit forward and
backward: GQA without repeating K/V, no T x S mask for plain causal attention, document masks
only on key blocks that actually straddle a document boundary. On other devices it calls
`F.scaled_dot_product_attention` (torch picks flash / memory-efficient kernels); packed
documents there run as one causal call per long document and one masked call per group of
short neighbours (`document_runs_attention`), so no T x T mask exists and cross-document pairs
are computed only inside a short group: close to flash-attn's variable-length kernel, without
flash-attn.

SdpaKernel: `aten._scaled_dot_product_flash_attention_for_cpu` returns (out, lse) and
`..._for_cpu_backward` takes the (possibly merged) out/lse back, which is exactly what block
attention needs. It handles GQA natively: K/V stay at kv-head count and dK/dV come back at
kv-head count (no repeat_interleave). Its `is_causal` is top-left aligned, so the planner in
kernel.py only ever asks for causal on square blocks. Masks are passed additively (0/-inf).
Unmasked backward calls run thread-balanced (balanced.py): the kernel's backward parallelizes
over batch rows x kv heads only, which 3 kv heads on 2 threads leave a third idle.
On other devices the kernel computes blocks with the exact fp32 math of EagerKernel (and
says so once in the log); on CUDA prefer the `flash` backend for context parallelism.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from longctx.attention.balanced import balanced_backward
from longctx.attention.core import build_mask
from longctx.attention.eager import EagerKernel
from longctx.attention.function import kernel_attention
from longctx.attention.kernel import AttentionKernel, float_mask, row_runs

log = logging.getLogger(__name__)
_aten = torch.ops.aten
# documents shorter than this share one masked SDPA call with their neighbours: a row of many
# short files then costs a few calls, not one per file, and each group's mask stays small
DOCUMENT_GROUP_TOKENS = 512


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

        def call(dout, q, k, v, out, lse, is_causal):  # strided dout/out: no copies
            return _aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse, 0.0, is_causal, attn_mask=attn_mask, scale=scale)

        lse = lse.float().contiguous()
        if mask is not None:  # a masked tile stays one call (its mask would need cutting too)
            return call(dout, q, k, v, out, lse, is_causal)
        return balanced_backward(call, dout, q, k, v, out, lse, is_causal=is_causal,
                                 threads=torch.get_num_threads())


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


def document_groups(runs: List[Tuple[int, int, int]], group_tokens: int) -> List[Tuple[int, int, int]]:
    """A row's document runs [(start, end, id)] -> [(start, end, documents)]: a document of at
    least `group_tokens` tokens alone, shorter neighbours packed together up to that length."""
    groups: List[Tuple[int, int, int]] = []
    open_group = None
    for a, e, _ in runs:
        if e - a >= group_tokens:
            groups += [open_group] if open_group else []
            groups.append((a, e, 1))
            open_group = None
        elif open_group and e - open_group[0] <= group_tokens:
            open_group = (open_group[0], e, open_group[2] + 1)
        else:
            groups += [open_group] if open_group else []
            open_group = (a, e, 1)
    return groups + ([open_group] if open_group else [])


def document_runs_attention(
    q: torch.Tensor,  # (B, Hq, T, D)
    k: torch.Tensor,  # (B, Hkv, T, D)
    v: torch.Tensor,  # (B, Hkv, T, D)
    segment_ids: torch.Tensor,  # (B, T) or (1, T)
    *,
    scale: Optional[float] = None,
    group_tokens: int = DOCUMENT_GROUP_TOKENS,
) -> Optional[torch.Tensor]:
    """Causal attention over packed documents without a T x T mask -> out (B, Hq, T, D), autograd
    through torch's kernels: one unmasked causal SDPA call per long document and one masked call
    per group of short neighbours (document_groups); None when a document appears in more than
    one run of a row (its runs would need merging: the caller masks the whole row)."""
    B, T = q.shape[0], q.shape[2]
    ids = segment_ids.expand(B, T)
    runs = row_runs(ids)
    if any(len({doc for _, _, doc in row}) < len(row) for row in runs):
        return None
    gqa = q.shape[1] != k.shape[1]
    rows = []
    # unbind and split, not slicing: their backward writes each gradient once (a slice's would
    # add a whole-size zero tensor per document)
    for b, (qb, kb, vb) in enumerate(zip(q.unbind(0), k.unbind(0), v.unbind(0))):  # (H, T, D) each
        groups = document_groups(runs[b], group_tokens)
        sizes = [e - a for a, e, _ in groups]
        pieces = []
        for (a, e, documents), qg, kg, vg in zip(groups, qb.split(sizes, 1), kb.split(sizes, 1), vb.split(sizes, 1)):
            mask = None if documents == 1 else build_mask(e - a, e - a, causal=True, segment_ids=ids[b:b + 1, a:e],
                                                          kv_segment_ids=None, device=q.device)  # (1, 1, n, n)
            pieces.append(F.scaled_dot_product_attention(qg[None], kg[None], vg[None], attn_mask=mask,
                                                         is_causal=mask is None, scale=scale,
                                                         enable_gqa=gqa))  # (1, Hq, n, D)
        rows.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
    return rows[0] if B == 1 else torch.cat(rows, dim=0)  # (B, Hq, T, D)
