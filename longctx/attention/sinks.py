"""Attention sinks (GPT-OSS): one learned logit per query head, added once to each query's
softmax denominator (a key with that score and a zero value).

Applied to the finished attention's (out, lse): the sink is one more block merged through the
log-sum-exp, so it is exact after any blockwise or context-parallel computation. The block
kernels' backward, given the output and lse *with* the sink, is then the exact gradient of the
sink attention (its probabilities are exp(score - lse'), and the sink's value is zero), and the
sink's own gradient is -sum over queries of p_sink * (dout . out).
"""
from __future__ import annotations

from typing import Tuple

import torch

Tensor = torch.Tensor


def add_sinks(out: Tensor, lse: Tensor, sinks: Tensor) -> Tuple[Tensor, Tensor]:
    """out (B, H, T, D), lse (B, H, T) fp32, sinks (H,) -> (out, lse) with the sinks."""
    s = sinks.detach().float()[None, :, None].expand_as(lse)  # (B, H, T)
    new_lse = torch.logaddexp(lse, s)
    out = (out.float() * torch.exp(lse - new_lse)[..., None]).to(out.dtype)  # exp(-inf) = 0: rows with no key
    return out, new_lse


def sinks_grad(dout: Tensor, out: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    """d loss / d sinks (H,) from dout and the (out, lse) with the sinks (of this rank's queries)."""
    delta = (dout.float() * out.float()).sum(-1)  # (B, H, T)
    p_sink = torch.exp(sinks.detach().float()[None, :, None] - lse)  # (B, H, T)
    return -(p_sink * delta).sum((0, 2)).to(sinks.dtype)
