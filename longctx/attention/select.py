"""Backend selection: `auto` picks flash on CUDA when flash-attn imports, else sdpa, and logs it."""
from __future__ import annotations

import difflib
import logging
from typing import Optional

import torch

from longctx.attention.core import AttentionFn
from longctx.attention.eager import EagerKernel, eager_attention
from longctx.attention.flash import FlashKernel, flash_attention, flash_available
from longctx.attention.kernel import AttentionKernel
from longctx.attention.sdpa import SdpaKernel, sdpa_attention
from longctx.errors import UserError

log = logging.getLogger(__name__)
BACKENDS = ("auto", "flash", "sdpa", "eager")
_logged: set = set()


def check_backend_available(name: str, where: str = "attention backend",
                            device: Optional[torch.device | str] = None) -> None:
    """UserError naming `where` unless backend `name` exists and can run on `device` (default:
    CUDA when available, else CPU). Cheap: flash-attn is only imported, nothing is built."""
    if name not in BACKENDS:
        close = difflib.get_close_matches(str(name), BACKENDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"{where}: unknown {name!r}; {hint}valid: {', '.join(BACKENDS)}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "flash" and not flash_available(torch.device(device)):
        reason = "no CUDA device" if torch.device(device).type != "cuda" else "flash-attn does not import"
        raise UserError(f"{where}: 'flash' needs flash-attn and a CUDA device ({reason}); "
                        "install longctx[gpu] or use auto, sdpa or eager")


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
