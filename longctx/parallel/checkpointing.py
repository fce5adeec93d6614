"""Activation checkpointing applied to a plain model (full, or every k-th block)."""
from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper


def apply_activation_checkpointing(model: nn.Module, policy: str, every: int = 2) -> int:
    """Wrap blocks of `model.layers` so their activations are recomputed in backward.

    policy "full": every block; "selective": blocks 0, k, 2k, ...; "none": nothing.
    Returns the number of wrapped blocks.
    """
    if policy == "none":
        return 0
    wrapped = 0
    for i, block in enumerate(model.layers):
        if policy == "full" or (policy == "selective" and i % every == 0):
            model.layers[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            wrapped += 1
    return wrapped
