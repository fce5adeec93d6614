"""Cross-entropy over the vocabulary head computed in chunks of tokens.

The full (tokens x vocab) logits never exist: each chunk's logits are formed, reduced to
its loss, and turned into the gradients of the hidden states and of the head weight right
away (the head is linear, so the gradient is exact), then freed. Softmax statistics are fp32.
"""
from __future__ import annotations

from typing import Optional

import torch

IGNORE_INDEX = -100


def _accumulate_weight_grad(grad_weight, probs, dlogits, h) -> None:
    """grad_weight (V, d) fp32 += dlogits^T h, accumulated in fp32 across chunks.

    On CUDA with bf16/fp16 inputs the product is one tensor-core GEMM of the compute-dtype
    operands with an fp32 output (what a plain bf16 head's backward computes, without its
    final rounding); fp32 operands there would run on the SIMT cores without TF32 (a quarter
    of an 8k-token step of a 4-layer 7B-shaped model on an H200, docs/gpu.md). Elsewhere the
    product is formed from the fp32 probabilities (CPU has no mixed-output GEMM)."""
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16):
        grad_weight.add_(torch.mm(dlogits.t(), h, out_dtype=torch.float32))
    else:
        grad_weight.addmm_(probs.t(), h.float())


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, token_weights, chunk_size):
        # hidden (N, d), weight (V, d), labels (N,), token_weights (N,) fp32 (0 where ignored)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        safe_labels = labels.clamp_min(0)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]  # (c, d)
            y = safe_labels[start:start + chunk_size]  # (c,)
            w = token_weights[start:start + chunk_size]  # (c,)
            logits = (h @ weight.t()).float()  # (c, V)
            lse = torch.logsumexp(logits, dim=-1)  # (c,)
            picked = logits.gather(1, y[:, None]).squeeze(1)  # (c,)
            total += ((lse - picked) * w).sum()
            if needs_grad:
                probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place: (c, V) fp32
                probs[torch.arange(len(y), device=y.device), y] -= 1.0
                probs.mul_(w[:, None])  # d loss / d logits
                dlogits = probs.to(hidden.dtype)  # (c, V)
                grad_hidden[start:start + chunk_size] = dlogits @ weight
                _accumulate_weight_grad(grad_weight, probs, dlogits, h)
            del logits
        if needs_grad:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_out.to(grad_hidden.dtype), grad_weight * grad_out.to(grad_weight.dtype), None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                          token_weights: Optional[torch.Tensor] = None,
                          chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of (weighted) token losses and the sum of weights over non-ignored labels.

    hidden (..., d) and labels (...) are flattened; weight is the (V, d) head. Returns
    (loss_sum fp32 scalar, weight_sum fp32 scalar); the caller divides (possibly by a
    count reduced across ranks, so every parallel layout averages the same tokens).
    """
    h = hidden.reshape(-1, hidden.shape[-1])  # (N, d)
    y = labels.reshape(-1)  # (N,)
    valid = (y != IGNORE_INDEX).float()
    w = valid if token_weights is None else token_weights.reshape(-1).float() * valid
    return _ChunkedLinearCrossEntropy.apply(h, weight, y, w, chunk_size), w.sum()
