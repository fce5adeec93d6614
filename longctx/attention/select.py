"""Backend selection: a name (backends.py) -> the local attention function and the block kernel.

On CPU `auto` is sdpa. On CUDA `auto` is the per-call dispatcher (dispatch.py) for local
attention and, for context parallelism, a VarlenKernel over the best varlen implementation
there (FlashAttention-4, then flash-attn, then torch's own), so packed documents never meet a
mask in any CP impl.
"""
from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from longctx.attention.backends import check_backend_available
from longctx.attention.core import AttentionFn
from longctx.attention.dispatch import AutoAttention
from longctx.attention.eager import EagerKernel, eager_attention
from longctx.attention.flash import flash_attention
from longctx.attention.flex import flex_document_attention
from longctx.attention.function import kernel_attention
from longctx.attention.kernel import AttentionKernel
from longctx.attention.sdpa import SdpaKernel, sdpa_attention
from longctx.attention.varlen import VarlenKernel, make_varlen_attention
from longctx.attention.varlen_ops import best_varlen, make_varlen_ops

log = logging.getLogger(__name__)
_logged: set = set()
_auto: dict = {}


def _device(device: Optional[torch.device | str]) -> torch.device:
    return torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_backend(name: str = "auto", device: Optional[torch.device | str] = None) -> str:
    """Concrete backend name for `name` on `device`: `auto` is sdpa off CUDA and stays auto on
    CUDA (chosen per call). Raises UserError when `name` cannot run there."""
    device = _device(device)
    check_backend_available(name, device=device)
    if name == "auto" and device.type != "cuda":
        return "sdpa"
    return name


def get_kernel(name: str = "auto", device: Optional[torch.device | str] = None) -> AttentionKernel:
    """Block kernel (forward with LSE + explicit backward) used by context parallelism."""
    device = _device(device)
    name = resolve_backend(name, device)
    if name in ("auto", "flex"):
        varlen = best_varlen(device) if name == "auto" else "varlen"
        if varlen is None:
            return SdpaKernel()
        if (name, varlen) not in _logged:
            _logged.add((name, varlen))
            log.info("context-parallel blocks: %s varlen kernel (backend %s)", varlen, name)
        return VarlenKernel(make_varlen_ops(varlen))
    if name in ("flash", "fa4", "varlen"):
        return VarlenKernel(make_varlen_ops(name))
    return SdpaKernel() if name == "sdpa" else EagerKernel()


def _flex(q, k, v, *, causal=True, scale=None, segment_ids=None, kv_segment_ids=None):
    """Backend `flex`: FlexAttention for packed training rows, sdpa for every other call."""
    if segment_ids is None or not causal or q.shape[2] != k.shape[2] or (
            kv_segment_ids is not None and kv_segment_ids is not segment_ids):
        return sdpa_attention(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                              kv_segment_ids=kv_segment_ids)
    return flex_document_attention(q, k, v, segment_ids, scale=scale)


def get_attention(name: str = "auto", device: Optional[torch.device | str] = None) -> AttentionFn:
    """Local attention function with core.py's signature."""
    device = _device(device)
    name = resolve_backend(name, device)
    if name == "auto":
        if device not in _auto:
            _auto[device] = AutoAttention(device)
        return _auto[device]
    if name in ("fa4", "varlen"):
        return make_varlen_attention(make_varlen_ops(name))
    return {"flash": flash_attention, "flex": _flex, "sdpa": sdpa_attention, "eager": eager_attention}[name]


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                       scale: Optional[float] = None, segment_ids: Optional[torch.Tensor] = None,
                       kv_segment_ids: Optional[torch.Tensor] = None,
                       backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """out (B, Hq, T, D) and fp32 lse (B, Hq, T); gradients flow to q, k, v (not through lse)."""
    kernel = get_kernel(backend, q.device)
    return kernel_attention(kernel, q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                            kv_segment_ids=kv_segment_ids)
