"""Activation checkpointing applied to a plain model (full, or every k-th block).

By default the attention kernel's outputs are kept while everything else in a checkpointed
block is recomputed (torch's selective activation checkpointing): a fused kernel's output
and log-sum-exp are as small as the block input, but at long context the kernel is most of
the block's compute, so recomputing it would cost ~1/3 more attention FLOPs. The kept ops are
the fused kernels and the context-parallel ops, `longctx::cp_attention` and
`longctx::cp_attention_sinks` (GPT-OSS's sinks): keeping a CP op's output also means its
communication is never replayed in the backward's recompute.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import longctx.parallel.cp  # noqa: F401  (registers torch.ops.longctx.cp_attention(_sinks), kept whole below)


def _attention_kernel_ops() -> set:
    aten = torch.ops.aten
    names = ["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"]
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    # The context-parallel ops: keeping their output also skips replaying their communication.
    for ns, name in (("longctx", "cp_attention"), ("longctx", "cp_attention_sinks"),
                     ("flash_attn", "_flash_attn_forward"), ("flash_attn", "_flash_attn_varlen_forward")):
        try:  # flash-attn >= 2.6 registers its kernels as torch custom ops too
            ops.add(getattr(getattr(torch.ops, ns), name).default)
        except (AttributeError, RuntimeError):
            pass
    return ops


def _keep_attention_policy(ops: set):
    def policy(ctx, op, *args, **kwargs):  # noqa: ARG001
        return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def apply_activation_checkpointing(model: nn.Module, policy: str, every: int = 2,
                                   recompute_attention: bool = False, checkpoint_fn=None) -> int:
    """Wrap blocks of `model.layers` so their activations are recomputed in backward.

    policy "full": every block; "selective": blocks 0, k, 2k, ...; "none": nothing.
    recompute_attention=False keeps the attention kernel outputs (see module docstring).
    checkpoint_fn: torch's checkpoint or a function like it (activation_offload.py's); None: torch's.
    Returns the number of wrapped blocks.
    """
    if policy == "none":
        return 0
    kwargs = {} if checkpoint_fn is None else {"checkpoint_fn": checkpoint_fn}
    if not recompute_attention:
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts,
                                                 _keep_attention_policy(_attention_kernel_ops()))
    wrapped = 0
    for i, block in enumerate(model.layers):
        if policy == "full" or (policy == "selective" and i % every == 0):
            model.layers[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)
            wrapped += 1
    return wrapped


def model_key(name: str) -> str:
    """A parameter's name in the plain model: `name` without the activation-checkpointing
    wrappers' prefix (DeepSpeed and named_parameters() see the wrapped names)."""
    return name.replace(_CHECKPOINT_PREFIX, "")
