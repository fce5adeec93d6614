"""Compile the pointwise parts of each block (RMSNorms and the SwiGLU MLP) with torch.compile.

On a CPU these are memory-bound chains of small kernels (the norm's fp32 round trip, the
SwiGLU product and their backward): fused by inductor, the demo model's forward + backward
at 8 x 256 tokens runs 1.18x faster (benchmarks/bench_kernels.py, last table).
Attention, RoPE and the loss stay eager (their kernels are already fused, and attention's
document planning is Python). `dynamic=True`: one graph for every sequence length, so the
stages of a curriculum reuse it (inductor's on-disk cache makes later processes ~3 s).
If the backend cannot compile (no C++ compiler, say), dynamo falls back to eager with a warning.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)


def compile_pointwise(model: nn.Module, mode: str) -> int:
    """Replace the forward of every block's norms and MLP (and the final norm) by a compiled
    one. Parameters, state-dict keys and hooks stay the module's. Returns modules compiled."""
    if mode == "none":
        return 0
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.config.suppress_errors = True  # a backend failure falls back to eager, logged
    # one compile thread: for these few small graphs a worker pool's start-up (a fresh Python
    # importing torch per worker) costs more than it saves (2 ranks on 2 cores: ~60 s vs ~20 s)
    torch._inductor.config.compile_threads = 1
    modules = []
    for layer in model.layers:
        block = getattr(layer, "_checkpoint_wrapped_module", layer)
        modules += [block.input_layernorm, block.post_attention_layernorm, block.mlp]
    modules.append(model.norm)
    for module in modules:
        module.forward = torch.compile(module.forward, dynamic=True)
    log.info("torch.compile: %d norm/MLP modules (attention, RoPE and loss eager)", len(modules))
    return len(modules)
