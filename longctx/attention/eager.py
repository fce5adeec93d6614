"""Materialized attention: the readable reference used by tests, and an explicit-gradient kernel.

`eager_attention` is plain autograd math (fp32 softmax, K/V repeated per query group): slow
and O(T*S) memory, but obviously correct; tests compare every other backend against it.
`EagerKernel` computes the same thing with a hand-written backward (no repeated K/V: the
query heads are viewed as (Hkv, group)), so it can serve as a block kernel for context
parallelism on any device.
"""
from __future__ import annotations

from typing import Optional

import torch

from longctx.attention.core import build_mask
from longctx.attention.kernel import AttentionKernel, resolve_scale

Tensor = torch.Tensor


def eager_attention(
    q: Tensor,  # (B, Hq, T, D)
    k: Tensor,  # (B, Hkv, S, D)
    v: Tensor,  # (B, Hkv, S, D)
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    segment_ids: Optional[Tensor] = None,
    kv_segment_ids: Optional[Tensor] = None,
    return_lse: bool = False,
):
    """Reference attention. Returns out (B, Hq, T, D) in q.dtype, or (out, lse fp32) with return_lse."""
    B, Hq, T, D = q.shape
    S, group = k.shape[2], Hq // k.shape[1]
    scale = resolve_scale(scale, D)
    kf = k.float().repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.matmul(q.float(), kf.transpose(-1, -2)) * scale  # (B, Hq, T, S)
    mask = build_mask(T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids, device=q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B, Hq, T); -inf for rows that see nothing
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe_lse[..., None])  # rows that see nothing: all zero
    out = torch.matmul(probs, vf).to(q.dtype)
    return (out, lse.detach()) if return_lse else out


class EagerKernel(AttentionKernel):
    """fp32 materialized block kernel with an explicit backward; GQA without repeating K/V.

    Query rows are processed in chunks so that one chunk's fp32 scores stay under
    `max_score_elems` (rows are independent, so chunking is exact)."""

    name = "eager"
    max_score_elems = 1 << 26  # 256 MiB of fp32 scores per chunk

    def _row_chunks(self, q: Tensor, S: int):
        B, Hq, T, _ = q.shape
        rows = max(1, min(T, self.max_score_elems // max(1, B * Hq * S)))
        return [slice(a, min(T, a + rows)) for a in range(0, T, rows)]

    @staticmethod
    def _scores(q: Tensor, k: Tensor, scale: float, is_causal: bool, mask: Optional[Tensor], rows: slice,
                T: int) -> Tensor:
        """Scores of query rows `rows` (of T) against all S keys: (B, Hkv, G, rows, S) fp32."""
        B, Hq, t, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        qg = q.float().view(B, Hkv, Hq // Hkv, t, D)  # (B, Hkv, G, t, D)
        s = torch.matmul(qg, k.float()[:, :, None].transpose(-1, -2)) * scale  # (B, Hkv, G, t, S)
        if is_causal:  # query i sits at key position i + S - T
            qpos = torch.arange(rows.start, rows.stop, device=q.device) + (S - T)
            keep = torch.arange(S, device=q.device)[None, :] <= qpos[:, None]  # (t, S)
            s = s.masked_fill(~keep, float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask[:, :, None, rows], float("-inf"))  # (B|1, 1, 1, t, S)
        return s

    def _fwd(self, q, k, v, scale, is_causal, mask):
        B, Hq, T, D = q.shape
        S = k.shape[2]  # k: (B, Hkv, S, D)
        out = torch.empty(B, Hq, T, D, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, Hq, T, dtype=torch.float32, device=q.device)
        for rows in self._row_chunks(q, S):
            t = rows.stop - rows.start
            s = self._scores(q[:, :, rows].contiguous(), k, scale, is_causal, mask, rows, T)
            chunk_lse = torch.logsumexp(s, dim=-1)  # (B, Hkv, G, t); -inf where nothing is visible
            safe = torch.where(torch.isinf(chunk_lse), torch.zeros_like(chunk_lse), chunk_lse)
            o = torch.matmul(torch.exp(s - safe[..., None]), v.float()[:, :, None])  # (B, Hkv, G, t, D)
            out[:, :, rows] = o.reshape(B, Hq, t, D).to(q.dtype)
            lse[:, :, rows] = chunk_lse.reshape(B, Hq, t)
        return out, lse

    def _bwd(self, dout, q, k, v, out, lse, scale, is_causal, mask):
        B, Hq, T, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        G = Hq // Hkv
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        kf, vf = k.float()[:, :, None], v.float()[:, :, None]  # (B, Hkv, 1, S, D)
        for rows in self._row_chunks(q, S):
            t = rows.stop - rows.start
            qc = q[:, :, rows].contiguous()
            s = self._scores(qc, k, scale, is_causal, mask, rows, T)
            p = torch.exp(s - lse[:, :, rows].float().reshape(B, Hkv, G, t)[..., None])  # (B, Hkv, G, t, S)
            do = dout[:, :, rows].float().reshape(B, Hkv, G, t, D)
            delta = (do * out[:, :, rows].float().reshape(B, Hkv, G, t, D)).sum(-1, keepdim=True)
            dv += torch.matmul(p.transpose(-1, -2), do).sum(2)  # (B, Hkv, S, D)
            ds = p * (torch.matmul(do, vf.transpose(-1, -2)) - delta) * scale  # (B, Hkv, G, t, S)
            dq[:, :, rows] = torch.matmul(ds, kf).reshape(B, Hq, t, D).to(q.dtype)
            dk += torch.matmul(ds.transpose(-1, -2), qc.float().view(B, Hkv, G, t, D)).sum(2)
        return dq, dk.to(k.dtype), dv.to(v.dtype)
