"""Backend selection: `auto` picks flash on CUDA when flash-attn imports, else sdpa, and logs it."""
from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from longctx.attention.backends import check_backend_available
from longctx.attention.core import AttentionFn
from longctx.attention.eager import EagerKernel, eager_attention
from longctx.attention.flash import FlashKernel, flash_attention, flash_available
from longctx.attention.function import kernel_attention
from longctx.attention.kernel import AttentionKernel
from longctx.attention.sdpa import SdpaKernel, sdpa_attention

log = logging.getLogger(__name__)
_logged: set = set()


def resolve_backend(name: str = "auto", device: Optional[torch.device | str] = None) -> str:
    """Concrete backend name for `name` on `device` (default: CUDA when available, else CPU)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    check_backend_available(name, device=device)
    if name != "auto":
        return name
    chosen = "flash" if flash_available(device) else "sdpa"
    if (device.type, chosen) not in _logged:
        _logged.add((device.type, chosen))
        log.info("attention backend auto -> %s on %s", chosen, device.type)
    return chosen


def get_kernel(name: str = "auto", device: Optional[torch.device | str] = None) -> AttentionKernel:
    """Block kernel (forward with LSE + explicit backward) used by context parallelism."""
    name = resolve_backend(name, device)
    if name == "flash":
        return FlashKernel()
    return SdpaKernel() if name == "sdpa" else EagerKernel()


def get_attention(name: str = "auto", device: Optional[torch.device | str] = None) -> AttentionFn:
    """Local attention function with core.py's signature."""
    name = resolve_backend(name, device)
    return {"flash": flash_attention, "sdpa": sdpa_attention, "eager": eager_attention}[name]


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                       scale: Optional[float] = None, segment_ids: Optional[torch.Tensor] = None,
                       kv_segment_ids: Optional[torch.Tensor] = None,
                       backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """out (B, Hq, T, D) and fp32 lse (B, Hq, T); gradients flow to q, k, v (not through lse)."""
    kernel = get_kernel(backend, q.device)
    return kernel_attention(kernel, q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                            kv_segment_ids=kv_segment_ids)
