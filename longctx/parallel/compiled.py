"""Compile the pointwise parts of each block (RMSNorms and the SwiGLU MLP) with torch.compile.

On a CPU these are memory-bound chains of small kernels (the norm's fp32 round trip, the
SwiGLU product and their backward), which inductor fuses. Attention, RoPE and the loss stay
eager (their kernels are already fused, and attention's document planning is Python).
`dynamic=True`: one graph for every sequence length, so the stages of a curriculum reuse it.
Each module is compiled in place (`nn.Module.compile`): parameters, state-dict keys and hooks
stay the module's. Where the backend cannot run (no C++ compiler for a CPU model, no triton
for a CUDA one) the modules stay eager and a warning says why.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn
from torch.utils._triton import has_triton

from longctx.model.llama import MLP, RMSNorm

log = logging.getLogger(__name__)


def backend_problem(device: torch.device) -> Optional[str]:
    """Why inductor cannot compile for `device` (its kernels need a C++ compiler on CPU and
    triton on CUDA), or None. Cheap: nothing is compiled."""
    if device.type == "cuda":
        return None if has_triton() else "triton is not installed"
    from torch._inductor import cpp_builder  # lazy: inductor is heavy to import, and only a compiled run needs it

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:  # InvalidCxxCompiler, or a compiler that does not run
        return f"{type(e).__name__}: {e}"
    return None


def pointwise_modules(model: nn.Module) -> list[nn.Module]:
    """Every RMSNorm and MLP of the model, in module order (through any wrapper)."""
    return [m for m in model.modules() if isinstance(m, (RMSNorm, MLP))]


def compile_pointwise(model: nn.Module, mode: str) -> int:
    """Compile every block's norms and MLP and the final norm in place (mode "norms_mlp");
    mode "none" compiles nothing. Returns the number of modules compiled."""
    if mode == "none":
        return 0
    problem = backend_problem(next(model.parameters()).device)
    if problem is not None:
        log.warning("torch.compile: the norm/MLP modules run eager (%s)", problem)
        return 0
    import torch._inductor.config  # lazy, as above

    # one compile thread: for these few small graphs a worker pool's start-up (a fresh Python
    # importing torch per worker) costs more than it saves
    torch._inductor.config.compile_threads = 1
    modules = pointwise_modules(model)
    for module in modules:
        module.compile(dynamic=True)
    log.info("torch.compile: %d norm/MLP modules (attention, RoPE and loss eager)", len(modules))
    return len(modules)
