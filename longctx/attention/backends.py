"""The attention backend names and the check that one can run here. Torch-free for the names, so
config validation loads no torch; only a `flash` request probes the device and flash-attn."""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Optional

from longctx.errors import UserError

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "flash", "sdpa", "eager")


def check_backend_available(name: str, where: str = "attention backend",
                            device: Optional[torch.device | str] = None) -> None:
    """UserError naming `where` unless backend `name` exists and can run on `device` (default:
    CUDA when available, else CPU). Cheap: flash-attn is only imported, nothing is built."""
    if name not in BACKENDS:
        close = difflib.get_close_matches(str(name), BACKENDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"{where}: unknown {name!r}; {hint}valid: {', '.join(BACKENDS)}")
    if name == "flash":
        _check_flash(where, device)


def _check_flash(where: str, device: Optional[torch.device | str]) -> None:
    import torch  # the device probe: only a flash request needs torch here

    from longctx.attention.flash import flash_available

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if not flash_available(device):
        reason = "no CUDA device" if device.type != "cuda" else "flash-attn does not import"
        raise UserError(f"{where}: 'flash' needs flash-attn and a CUDA device ({reason}); "
                        "install longctx[gpu] or use auto, sdpa or eager")
