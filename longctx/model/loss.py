"""Cross-entropy over the vocabulary head computed in chunks of tokens.

The full (tokens x vocab) logits never exist: each chunk's logits are formed, reduced to
its loss, and turned into the gradients of the hidden states and of the head weight right
away (the head is linear, so the gradient is exact), then freed. Softmax statistics are fp32.
"""
from __future__ import annotations

from typing import Optional

import torch

IGNORE_INDEX = -100


# fp32 bytes of softmax work per block of rows and per thread: the chain of elementwise passes
# (subtract max, exp, sum, scale, write back) then runs from cache instead of memory, in few
# enough ops that a multi-threaded rank does not wait at thousands of small barriers.
_SOFTMAX_BLOCK_BYTES = 4 << 20


def _softmax_grad_(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor, grad: bool) -> torch.Tensor:
    """Per row of logits (c, V): lse (c,) fp32, and (with grad) logits overwritten in place by
    d loss / d logits = w * (softmax - onehot(y)) in their own dtype.

    logsumexp's formula (max + log sum exp(x - max)) written out, one block of rows at a time:
    the fp32 exponentials of a block serve its lse and its softmax (computed once), the bf16
    logits are converted by the subtraction of the fp32 max (no separate copy), and no (c, V)
    fp32 tensor exists for low-precision logits."""
    c, V = logits.shape
    rows = max(1, _SOFTMAX_BLOCK_BYTES * torch.get_num_threads() // (4 * V))
    lse = torch.empty(c, dtype=torch.float32, device=logits.device)
    low = logits.dtype != torch.float32
    buf = torch.empty(min(rows, c), V, dtype=torch.float32, device=logits.device) if low else None
    for r0 in range(0, c, rows):
        blk = logits[r0:r0 + rows]  # (r, V)
        m = blk.amax(dim=-1).float()  # (r,) exact: the max of the logits as they are
        e = torch.sub(blk, m[:, None], out=buf[:len(blk)]) if low else blk.sub_(m[:, None])  # (r, V) fp32
        s = e.exp_().sum(dim=-1)  # (r,)
        lse[r0:r0 + rows] = s.log().add_(m)
        if grad:
            # w * (softmax - onehot) = (e - s * onehot) * w / s: the target's entry is corrected
            # in fp32 first, then one pass scales and (bf16 logits) writes the result back
            e[torch.arange(len(blk), device=e.device), y[r0:r0 + rows]] -= s
            torch.mul(e, (w[r0:r0 + rows] / s)[:, None], out=blk)
    return lse


def _add_weight_grad(acc: Optional[torch.Tensor], dlogits: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """acc (V, d) + dlogits^T h of one chunk; acc None for the first chunk. The sum over chunks
    is kept in fp32 (accumulating in place in bf16 rounds the running sum once per chunk: at
    16 chunks, 3x the error of one rounding); one chunk's product is used as it comes.

    Low-precision inputs: one GEMM of the compute-dtype operands (what a plain bf16 head's
    backward computes): on CUDA with an fp32 output (tensor cores); on CPU a bf16 GEMM (the
    matrix units; an fp32 GEMM there runs at a fraction of their rate). fp32 inputs: the fp32
    GEMM, accumulated in place."""
    if h.dtype == torch.float32:
        return dlogits.t() @ h if acc is None else acc.addmm_(dlogits.t(), h)
    part = torch.mm(dlogits.t(), h, out_dtype=torch.float32) if h.is_cuda else dlogits.t() @ h  # (V, d)
    if acc is None:
        return part
    return (acc if acc.dtype == torch.float32 else acc.float()).add_(part)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, token_weights, chunk_size):
        # hidden (N, d), weight (V, d), labels (N,), token_weights (N,) fp32 (0 where ignored)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_weight = None  # (V, d), see _add_weight_grad
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        safe_labels = labels.clamp_min(0)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]  # (c, d)
            y = safe_labels[start:start + chunk_size]  # (c,)
            w = token_weights[start:start + chunk_size]  # (c,)
            logits = h @ weight.t()  # (c, V) in the compute dtype
            picked = logits.gather(1, y[:, None]).squeeze(1).float()  # (c,)
            lse = _softmax_grad_(logits, y, w, needs_grad)  # logits now hold d loss / d logits
            total += ((lse - picked) * w).sum()
            if needs_grad:
                torch.mm(logits, weight, out=grad_hidden[start:start + chunk_size])
                grad_weight = _add_weight_grad(grad_weight, logits, h)
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
