"""Cross-entropy over the vocabulary head computed in chunks of tokens.

The full (tokens x vocab) logits never exist: each chunk's logits are formed, reduced to
its loss, and turned into the gradients of the hidden states and of the head weight right
away (the head is linear, so the gradient is exact), then freed. Softmax statistics are fp32.
Within a chunk the compute-dtype GEMM outputs and casts run a row block at a time, so the
chunk's only full-size buffer is its fp32 logits (later its fp32 d logits, in place).
"""
from __future__ import annotations

from typing import Optional

import torch

from longctx.base.labels import IGNORE_INDEX

ROW_BLOCK = 256  # rows per compute-dtype GEMM and cast inside a chunk


def _row_blocks(n: int):
    return ((r, min(n, r + ROW_BLOCK)) for r in range(0, n, ROW_BLOCK))


def _logits_fp32(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(c, d) @ (V, d)^T -> (c, V) fp32: each row block's compute-dtype GEMM output widened
    into one fp32 buffer (the values of `(h @ weight.t()).float()` without its (c, V) temporary)."""
    if h.dtype == torch.float32:
        return h @ weight.t()
    logits = torch.empty(h.shape[0], weight.shape[0], dtype=torch.float32, device=h.device)  # (c, V)
    for a, b in _row_blocks(h.shape[0]):
        logits[a:b] = h[a:b] @ weight.t()
    return logits


def _logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    """(c, V) -> (c,) fp32, a row block at a time (torch.logsumexp keeps a temporary of its
    input's size)."""
    return torch.cat([torch.logsumexp(logits[a:b], dim=-1) for a, b in _row_blocks(logits.shape[0])])


def _accumulate_grads(grad_hidden, grad_weight, dlogits, h, weight) -> None:
    """grad_hidden (c, d) = dlogits @ weight and grad_weight (V, d) fp32 += dlogits^T h, from the
    chunk's fp32 d logits (c, V).

    grad_hidden is a compute-dtype GEMM of the d logits cast a row block at a time. On CUDA
    with bf16/fp16 inputs the weight gradient is a tensor-core GEMM of the compute-dtype
    operands with an fp32 output, per row block (what a plain bf16 head's backward computes,
    without its final rounding); fp32 operands there would run on the SIMT cores without TF32
    (a quarter of an 8k-token step of a 4-layer 7B-shaped model on an H200, docs/gpu.md).
    Elsewhere it is one fp32 GEMM of the fp32 d logits (CPU has no mixed-output GEMM)."""
    mixed_cuda = h.is_cuda and h.dtype in (torch.bfloat16, torch.float16)
    for a, b in _row_blocks(h.shape[0]):
        block = dlogits[a:b].to(h.dtype)  # (r, V)
        grad_hidden[a:b] = block @ weight
        if mixed_cuda:
            grad_weight.add_(torch.mm(block.t(), h[a:b], out_dtype=torch.float32))
        else:  # per row block: the GEMM packs a (V, r) transpose, not the chunk's (V, c)
            grad_weight.addmm_(dlogits[a:b].t(), h[a:b].float())


def _chunk_loss(h, weight, y, w, grad_hidden, grad_weight, softcap=None) -> torch.Tensor:
    """One chunk: its weighted token losses (c,), and (when grad_hidden is given) its gradients written
    into grad_hidden (c, d) and added to grad_weight. A function of its own so that the chunk's
    (c, V) buffer is freed before the next chunk allocates its own. `softcap` c caps each logit
    z at c * tanh(z / c) (Gemma 2's final-logit softcapping)."""
    # h (c, d), y (c,), w (c,) fp32
    logits = _logits_fp32(h, weight)  # (c, V) fp32
    capped = None
    if softcap is not None:
        capped = logits.div_(softcap).tanh_()  # (c, V): tanh(z / c), kept for the backward
        logits = capped * softcap
    lse = _logsumexp_rows(logits)  # (c,)
    picked = logits.gather(1, y[:, None]).squeeze(1)  # (c,)
    losses = (lse - picked) * w  # (c,)
    if grad_hidden is not None:
        dlogits = logits.sub_(lse[:, None]).exp_()  # softmax, in place: (c, V) fp32
        dlogits[torch.arange(len(y), device=y.device), y] -= 1.0
        dlogits.mul_(w[:, None])  # d loss / d logits
        if capped is not None:
            dlogits.mul_(capped.mul_(capped).neg_().add_(1.0))  # through the cap: 1 - tanh^2
        _accumulate_grads(grad_hidden, grad_weight, dlogits, h, weight)
    return losses


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, token_weights, buckets, n_buckets, chunk_size, grad_enabled,
                softcap=None):
        # hidden (N, d), weight (V, d), labels (N,), token_weights (N,) fp32 (0 where ignored),
        # buckets (N,) int64: each token's position bucket (n_buckets of them), or None.
        # needs_input_grad stays True for a weight that requires grad under torch.no_grad, so the
        # caller's grad mode decides: scoring (perplexity) then does no gradient GEMMs.
        needs_grad = grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        by_bucket = torch.zeros(n_buckets, dtype=torch.float32, device=hidden.device)  # (K,)
        safe_labels = labels.clamp_min(0)
        for start in range(0, hidden.shape[0], chunk_size):
            end = start + chunk_size
            losses = _chunk_loss(hidden[start:end], weight, safe_labels[start:end], token_weights[start:end],
                                 None if grad_hidden is None else grad_hidden[start:end], grad_weight, softcap)
            total += losses.sum()
            if buckets is not None:  # the same token losses, summed per position bucket on the device
                by_bucket.index_add_(0, buckets[start:end], losses)
        if needs_grad:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        ctx.mark_non_differentiable(by_bucket)
        return total, by_bucket

    @staticmethod
    def backward(ctx, grad_out, _grad_by_bucket):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (grad_hidden * grad_out.to(grad_hidden.dtype), grad_weight * grad_out.to(grad_weight.dtype),
                None, None, None, None, None, None, None)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                          token_weights: Optional[torch.Tensor] = None, chunk_size: int = 1024,
                          buckets: Optional[torch.Tensor] = None, n_buckets: int = 0,
                          softcap: Optional[float] = None):
    """Sum of (weighted) token losses and the sum of weights over non-ignored labels.

    hidden (..., d) and labels (...) are flattened; weight is the (V, d) head. Returns
    (loss_sum fp32 scalar, weight_sum fp32 scalar); the caller divides (possibly by a
    count reduced across ranks, so every parallel layout averages the same tokens).

    With `buckets` (...) int64 in [0, n_buckets) -- each token's position bucket -- it also
    returns a (2, n_buckets) fp32 tensor: row 0 the loss sum of each bucket's tokens, row 1 their
    weight sum. Both come from the same chunks, on the device (no host read), without gradient.
    `softcap` caps the logits (c * tanh(z / c)) before the softmax.
    """
    h = hidden.reshape(-1, hidden.shape[-1])  # (N, d)
    y = labels.reshape(-1)  # (N,)
    valid = (y != IGNORE_INDEX).float()
    w = valid if token_weights is None else token_weights.reshape(-1).float() * valid
    b = None if buckets is None else buckets.reshape(-1)  # (N,)
    loss, by_bucket = _ChunkedLinearCrossEntropy.apply(h, weight, y, w, b, n_buckets, chunk_size,
                                                       torch.is_grad_enabled(), softcap)
    if b is None:
        return loss, w.sum()
    counts = torch.zeros(n_buckets, dtype=torch.float32, device=w.device).index_add_(0, b, w)  # (K,)
    return loss, w.sum(), torch.stack([by_bucket, counts])
