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
    """fp32 materialized block kernel with an explicit backward; GQA without repeating K/V."""

    name = "eager"

    @staticmethod
    def _scores(q: Tensor, k: Tensor, scale: float, is_causal: bool, mask: Optional[Tensor]) -> Tensor:
        B, Hq, T, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        qg = q.float().view(B, Hkv, Hq // Hkv, T, D)  # (B, Hkv, G, T, D)
        s = torch.matmul(qg, k.float()[:, :, None].transpose(-1, -2)) * scale  # (B, Hkv, G, T, S)
        if is_causal:
            keep = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
            s = s.masked_fill(~keep, float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask[:, :, None], float("-inf"))  # mask (B|1, 1, T, S) -> (B|1, 1, 1, T, S)
        return s

    def _fwd(self, q, k, v, scale, is_causal, mask):
        B, Hq, T, D = q.shape
        s = self._scores(q, k, scale, is_causal, mask)
        lse = torch.logsumexp(s, dim=-1)  # (B, Hkv, G, T)
        safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        p = torch.exp(s - safe[..., None])
        out = torch.matmul(p, v.float()[:, :, None])  # (B, Hkv, G, T, D)
        return out.reshape(B, Hq, T, D).to(q.dtype), lse.reshape(B, Hq, T)

    def _bwd(self, dout, q, k, v, out, lse, scale, is_causal, mask):
        B, Hq, T, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        G = Hq // Hkv
        s = self._scores(q, k, scale, is_causal, mask)
        p = torch.exp(s - lse.float().view(B, Hkv, G, T)[..., None])  # (B, Hkv, G, T, S)
        do = dout.float().view(B, Hkv, G, T, D)
        delta = (do * out.float().view(B, Hkv, G, T, D)).sum(-1, keepdim=True)  # (B, Hkv, G, T, 1)
        dv = torch.matmul(p.transpose(-1, -2), do).sum(2)  # (B, Hkv, S, D)
        dp = torch.matmul(do, v.float()[:, :, None].transpose(-1, -2))  # (B, Hkv, G, T, S)
        ds = p * (dp - delta) * scale
        dq = torch.matmul(ds, k.float()[:, :, None]).reshape(B, Hq, T, D)
        dk = torch.matmul(ds.transpose(-1, -2), q.float().view(B, Hkv, G, T, D)).sum(2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
