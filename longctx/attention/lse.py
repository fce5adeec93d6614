"""Log-sum-exp helpers: merging partial attention results, always in fp32.

Attention over a key set split into blocks A and B is exact when recombined as

    lse = logaddexp(lse_A, lse_B)
    out = exp(lse_A - lse) * out_A + exp(lse_B - lse) * out_B

A block in which a query sees no key has lse = -inf and out = 0; the merge keeps such rows
at (0, -inf) instead of producing NaN (exp(-inf - -inf)).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

NEG_INF = float("-inf")


def merge_attention(
    out: Optional[torch.Tensor],  # (B, H, T, D) accumulator (any dtype) or None
    lse: Optional[torch.Tensor],  # (B, H, T) fp32 or None
    block_out: torch.Tensor,  # (B, H, T, D)
    block_lse: torch.Tensor,  # (B, H, T)
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge one block into the running (out, lse); returns fp32 tensors."""
    block_out, block_lse = block_out.float(), block_lse.float()
    if out is None:
        return block_out, block_lse
    out, lse = out.float(), lse.float()
    new_lse = torch.logaddexp(lse, block_lse)  # -inf only where both are -inf
    safe = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
    w_old = torch.exp(lse - safe).unsqueeze(-1)  # (B, H, T, 1); exp(-inf) = 0
    w_new = torch.exp(block_lse - safe).unsqueeze(-1)
    return w_old * out + w_new * block_out, new_lse


def lse_for_backward(lse: torch.Tensor) -> torch.Tensor:
    """Rows that saw no key (lse = -inf) get lse 0, so exp(score - lse) = exp(-inf) = 0."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).float()
