"""flash-attn (2.x / 3.x) backend: CUDA only, imported lazily, never required.

Install with `pip install flash-attn`. Causal masking in flash-attn >= 2.1 is bottom-right
aligned like ours, GQA is native (K/V at kv-head count), and the kernel returns the fp32
log-sum-exp that context parallelism merges.

`flash_attention` (local attention for the model): whole rows go through `flash_attn_func`;
packed documents through VarlenKernel over flash-attn's varlen kernel (varlen.py), which is
also the block kernel context parallelism gets for backend `flash`.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from longctx.attention.kernel import resolve_scale
from longctx.attention.varlen import make_varlen_attention
from longctx.attention.varlen_ops import FlashAttnVarlen, flash_attn_module

Tensor = torch.Tensor


def flash_available(device: Optional[torch.device] = None) -> bool:
    """True when flash-attn imports and the (given or default) device is CUDA."""
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available() and flash_attn_module() is not None


def _require():
    mod = flash_attn_module()
    if mod is None:
        raise RuntimeError("attention backend 'flash' needs flash-attn on CUDA: pip install flash-attn")
    return mod


@functools.lru_cache(maxsize=1)
def _documents_attention():
    return make_varlen_attention(FlashAttnVarlen())


def flash_attention(
    q: Tensor,  # (B, Hq, T, D)
    k: Tensor,  # (B, Hkv, S, D)
    v: Tensor,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    segment_ids: Optional[Tensor] = None,
    kv_segment_ids: Optional[Tensor] = None,
) -> Tensor:
    mod = _require()
    if segment_ids is not None:
        return _documents_attention()(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                      kv_segment_ids=kv_segment_ids)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, T, H, D)
    out = mod.flash_attn_func(qt, kt, vt, softmax_scale=resolve_scale(scale, q.shape[-1]), causal=causal)
    return out.transpose(1, 2)
