"""The attention backend names and the check that one can run here. Torch-free for the names, so
config validation loads no torch; only a request for a CUDA kernel probes the device and package.

    auto    on CUDA: the fastest exact kernel per call (dispatch.py); on CPU: sdpa
    sdpa    torch's fused kernels (CPU flash with LSE; on CUDA cuDNN / flash, per-document calls)
    flash   flash-attn 2.x (pip install flash-attn): varlen for documents and CP blocks
    fa4     FlashAttention-4 (pip install --pre flash-attn-4), SM90 / SM100
    varlen  torch's flash kernel with cu_seqlens (any CUDA build of torch, no extra package)
    flex    FlexAttention with a document block mask (CUDA with triton); CP blocks use varlen
    eager   materialized fp32 math: the reference
"""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Optional

from longctx.base.errors import UserError

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "sdpa", "flash", "fa4", "varlen", "flex", "eager")
# the CUDA-only backends: (the package each needs, how to install it)
CUDA_ONLY = {"flash": ("flash-attn", "pip install flash-attn"),
             "fa4": ("flash-attn-4", "pip install --pre flash-attn-4"),
             "varlen": (None, None), "flex": (None, None)}


def check_backend_available(name: str, where: str = "attention backend",
                            device: Optional[torch.device | str] = None) -> None:
    """UserError naming `where` unless backend `name` exists and can run on `device` (default:
    CUDA when available, else CPU). Cheap: packages are only imported, nothing is built."""
    if name not in BACKENDS:
        close = difflib.get_close_matches(str(name), BACKENDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"{where}: unknown {name!r}; {hint}valid: {', '.join(BACKENDS)}")
    if name in CUDA_ONLY:
        problem = backend_problem(name, device)
        if problem is not None:
            package, install = CUDA_ONLY[name]
            needs = f"{package} and a CUDA device" if package else "a CUDA device"
            fix = f"{install}, or use" if package else "use"
            raise UserError(f"{where}: {name!r} needs {needs} ({problem}); {fix} auto, sdpa or eager")


def backend_problem(name: str, device: Optional[torch.device | str]) -> Optional[str]:
    """Why CUDA backend `name` cannot run on `device`, or None."""
    import torch  # the device probe: only a CUDA-kernel request needs torch here

    from longctx.attention.flex import flex_available
    from longctx.attention.varlen_ops import varlen_problem

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if name == "flex":
        return flex_available(device)
    return varlen_problem(name, device)
