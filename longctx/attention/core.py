"""The one signature every local attention backend implements.

    attn(q, k, v, *, causal=True, scale=None, segment_ids=None, kv_segment_ids=None) -> out

    q:   (B, Hq, T, D)          Hq = Hkv * group (GQA/MQA); never pre-expanded by callers
    k,v: (B, Hkv, S, D)
    out: (B, Hq, T, D)          same dtype as q

causal: query i sits at absolute position S - T + i (bottom-right alignment, as in
flash-attn >= 2.1), so T == S is ordinary causal attention and T < S is a decode step
against a KV cache.
segment_ids / kv_segment_ids: optional (B, T) / (B, S) integer document ids. A query only
attends to keys with the same id (packed documents; left padding gets its own id).
kv_segment_ids defaults to segment_ids (only valid when T == S).
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch


class AttentionFn(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = True,
        scale: Optional[float] = None,
        segment_ids: Optional[torch.Tensor] = None,
        kv_segment_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor: ...


def build_mask(
    T: int,
    S: int,
    *,
    causal: bool,
    segment_ids: Optional[torch.Tensor],
    kv_segment_ids: Optional[torch.Tensor],
    device: torch.device,
) -> Optional[torch.Tensor]:
    """Boolean keep-mask (B or 1, 1, T, S), or None when nothing is masked."""
    mask = None
    if causal:
        q_pos = torch.arange(T, device=device) + (S - T)  # (T,)
        k_pos = torch.arange(S, device=device)  # (S,)
        mask = (k_pos[None, :] <= q_pos[:, None])[None, None]  # (1, 1, T, S)
    if segment_ids is not None:
        kv_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
        if kv_segment_ids is None and T != S:
            raise ValueError("kv_segment_ids is required when query and key lengths differ")
        same = (segment_ids[:, :, None] == kv_ids[:, None, :])[:, None]  # (B, 1, T, S)
        mask = same if mask is None else (mask & same)
    return mask
