"""A block kernel whose mask comes from each token's (document, order in the row): sliding windows
and logit softcapping, exact under every context-parallel impl.

The ids it takes in place of segment ids are *order codes*, `document << 32 | index`
(`order_codes`), one per token, where index is the token's place in the whole row (its global
index across CP shards, not its position id). They travel through the ring, all-gather and
Ulysses code as segment ids do. A query sees a key when both are in the same document, the key
is not after the query in the row and, with a window W, fewer than W tokens before it
(transformers' window holds W keys, the token itself included, counted by token index).
Causality thus comes from token order, the same order every CP impl skips blocks by: a block
that a CP impl calls "fully visible" is visible here too, and one it skips holds no visible
pair. Position ids never reach this kernel (they feed RoPE only): they restart at every packed
document and at padding, so a mask built from them would let a token see later ones.

Softcapping (Gemma 2) replaces each score s by c * tanh(s / c) before the softmax. Scores are
materialised in fp32 one chunk of query rows at a time (EagerKernel's math, with the
softcap's derivative in the backward); a chunk without any visible pair is skipped.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from longctx.attention.kernel import AttentionKernel, resolve_scale
from longctx.attention.lse import NEG_INF, lse_for_backward

Tensor = torch.Tensor
INDEX_BITS = 32


def order_codes(segment_ids: Optional[Tensor], token_index: Tensor) -> Tensor:
    """(B, T) document ids (None: one document per row) and (B, T) or (T,) token indices in the
    row -> (B, T) int64 codes."""
    if segment_ids is None:
        docs = torch.zeros_like(token_index)
    else:
        token_index = token_index.expand_as(segment_ids)
        docs = segment_ids
    return (docs.long() << INDEX_BITS) | token_index.long()


def _split(codes: Tensor) -> Tuple[Tensor, Tensor]:
    return codes >> INDEX_BITS, codes & ((1 << INDEX_BITS) - 1)


class PositionalKernel(AttentionKernel):
    """fp32 block kernel over order codes with an optional window and softcap."""

    max_score_elems = 1 << 25  # fp32 scores per chunk of query rows (128 MiB)

    def __init__(self, window: Optional[int] = None, softcap: Optional[float] = None):
        self.window = int(window) if window else None
        self.softcap = float(softcap) if softcap else None
        self.name = f"positional(window={self.window}, softcap={self.softcap})"

    def key(self) -> tuple:
        return (self.window, self.softcap)

    def _visible(self, q_codes: Tensor, k_codes: Tensor) -> Tensor:
        """(B, t) x (B, S) codes -> (B, 1, 1, t, S) keep-mask."""
        qd, qi = _split(q_codes)
        kd, ki = _split(k_codes)
        dist = qi[:, :, None] - ki[:, None, :]  # (B, t, S) tokens between query and key
        keep = (qd[:, :, None] == kd[:, None, :]) & (dist >= 0)
        if self.window is not None:
            keep &= dist < self.window
        return keep[:, None, None]

    def _row_chunks(self, B: int, Hq: int, T: int, S: int):
        rows = max(1, min(T, self.max_score_elems // max(1, B * Hq * S)))
        return [slice(a, min(T, a + rows)) for a in range(0, T, rows)]

    def _scores(self, q: Tensor, k: Tensor, scale: float) -> Tuple[Tensor, Optional[Tensor]]:
        """q (B, Hq, t, D), k (B, Hkv, S, D) -> fp32 scores (B, Hkv, G, t, S) after the softcap,
        and tanh of the capped scores (for the backward) or None."""
        B, Hq, t, D = q.shape
        Hkv = k.shape[1]
        qg = q.float().reshape(B, Hkv, Hq // Hkv, t, D)
        s = torch.matmul(qg, k.float()[:, :, None].transpose(-1, -2)) * scale  # (B, Hkv, G, t, S)
        if self.softcap is None:
            return s, None
        th = torch.tanh(s / self.softcap)
        return th * self.softcap, th

    def _codes(self, q: Tensor, k: Tensor, segment_ids, kv_segment_ids) -> Tuple[Tensor, Tensor]:
        if segment_ids is None:
            raise ValueError("PositionalKernel needs order codes as segment ids (attention/positional.py)")
        kv = segment_ids if kv_segment_ids is None else kv_segment_ids
        B = q.shape[0]
        return segment_ids.expand(B, q.shape[2]), kv.expand(B, k.shape[2])

    def forward(self, q, k, v, *, causal=True, scale=None, segment_ids=None, kv_segment_ids=None):
        """-> out (B, Hq, T, D) in q.dtype, lse (B, Hq, T) fp32 (-inf where no key is visible)."""
        B, Hq, T, D = q.shape
        S = k.shape[2]
        scale = resolve_scale(scale, D)
        qc, kc = self._codes(q, k, segment_ids, kv_segment_ids)
        out = torch.zeros(B, Hq, T, D, dtype=q.dtype, device=q.device)
        lse = torch.full((B, Hq, T), NEG_INF, dtype=torch.float32, device=q.device)
        vf = v.float()[:, :, None]  # (B, Hkv, 1, S, D)
        for rows in self._row_chunks(B, Hq, T, S):
            keep = self._visible(qc[:, rows], kc)  # (B, 1, 1, t, S)
            if not bool(keep.any()):
                continue
            t = rows.stop - rows.start
            s, _ = self._scores(q[:, :, rows], k, scale)
            s = s.masked_fill(~keep, NEG_INF)
            chunk_lse = torch.logsumexp(s, dim=-1)  # (B, Hkv, G, t)
            safe = torch.where(torch.isinf(chunk_lse), torch.zeros_like(chunk_lse), chunk_lse)
            o = torch.matmul(torch.exp(s - safe[..., None]), vf)  # (B, Hkv, G, t, D)
            out[:, :, rows] = o.reshape(B, Hq, t, D).to(q.dtype)
            lse[:, :, rows] = chunk_lse.reshape(B, Hq, t)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, *, causal=True, scale=None, segment_ids=None,
                 kv_segment_ids=None):
        """Gradients of this block given the final out/lse of the attention it is part of."""
        B, Hq, T, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        G = Hq // Hkv
        scale = resolve_scale(scale, D)
        qc, kc = self._codes(q, k, segment_ids, kv_segment_ids)
        lse = lse_for_backward(lse)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        kf, vf = k.float()[:, :, None], v.float()[:, :, None]  # (B, Hkv, 1, S, D)
        for rows in self._row_chunks(B, Hq, T, S):
            keep = self._visible(qc[:, rows], kc)
            if not bool(keep.any()):
                continue
            t = rows.stop - rows.start
            s, th = self._scores(q[:, :, rows], k, scale)
            p = torch.exp(s.masked_fill(~keep, NEG_INF) - lse[:, :, rows].reshape(B, Hkv, G, t)[..., None])
            do = dout[:, :, rows].float().reshape(B, Hkv, G, t, D)
            delta = (do * out[:, :, rows].float().reshape(B, Hkv, G, t, D)).sum(-1, keepdim=True)
            dv += torch.matmul(p.transpose(-1, -2), do).sum(2)  # (B, Hkv, S, D)
            ds = p * (torch.matmul(do, vf.transpose(-1, -2)) - delta)  # d loss / d capped score
            if th is not None:
                ds = ds * (1.0 - th * th)  # d (c tanh(s / c)) / d s
            ds = ds * scale
            dq[:, :, rows] = torch.matmul(ds, kf).reshape(B, Hq, t, D)
            dk += torch.matmul(ds.transpose(-1, -2), q[:, :, rows].float().reshape(B, Hkv, G, t, D)).sum(2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
