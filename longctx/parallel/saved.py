"""What a context-parallel attention's forward keeps for its backward.

The backward of every CP strategy (ring.py, allgather.py, hybrid.py, cp.py) takes the incoming
gradient and one `SavedForward`: the local-layout q, k, v the forward was given and its final
(merged) out and log-sum-exp, from which each block's exact share of the gradients follows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class SavedForward:
    """q (B, H, T, D), k/v (B, Hkv, T, D): the forward's inputs; out (B, H, T, D) its output and
    lse (B, H, T) fp32 its log-sum-exp, in the same layout (local shard, or head-sharded)."""

    q: Tensor
    k: Tensor
    v: Tensor
    out: Tensor
    lse: Tensor
