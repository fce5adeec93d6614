"""RMSNorm whose backward keeps only its input and the per-token 1/rms.

The forward is the reference's ops in the reference's order (statistics in fp32, scale applied
in the input dtype), so outputs are bit-identical. Autograd through those ops would keep an fp32
copy of the input and the rounded normalized value (3x the input's bytes at bf16) until the
backward reaches the norm; this Function recomputes both from the input instead. Forward and
backward run a block of tokens at a time, so their fp32 temporaries are one block's, not the
sequence's (the weight gradient sums the blocks in fp32, rounding once at the end).
"""
from __future__ import annotations

import torch
from torch import nn

BLOCK_ELEMENTS = 1 << 22  # fp32 elements per temporary: tokens per block = this // hidden size


def _blocks(n: int, d: int):
    if torch.compiler.is_compiling():  # inductor fuses the temporaries; one block keeps one graph for every n
        return ((0, n),)
    rows = max(1, BLOCK_ELEMENTS // d)
    return ((a, min(n, a + rows)) for a in range(0, n, rows))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (N, d)
        out = torch.empty(tokens.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
        rstd = torch.empty(tokens.shape[0], 1, dtype=torch.float32, device=x.device)  # (N, 1)
        for a, b in _blocks(*tokens.shape):
            xf = tokens[a:b].float()
            rstd[a:b] = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            if out.dtype == x.dtype == torch.float32:  # weight * (xf * rstd), written in place
                torch.mul(xf, rstd[a:b], out=out[a:b]).mul_(weight)
            else:
                out[a:b] = weight * (xf * rstd[a:b]).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        needs_x, needs_weight = ctx.needs_input_grad[:2]
        tokens, grads = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])  # (N, d)
        dx = torch.empty_like(tokens) if needs_x else None
        dweight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_weight else None
        for a, b in _blocks(*tokens.shape):
            xf, r, g = tokens[a:b].float(), rstd[a:b], grads[a:b]
            if needs_weight:
                dweight += (xf * r).to(x.dtype).mul_(g).sum(0, dtype=torch.float32)  # n rounded as the forward's
            if needs_x:
                dn = (g * weight).to(x.dtype).float()  # d(normalized), rounded as autograd rounds it
                # n = xf * r, r = (mean(xf^2) + eps)^-1/2: the two paths by which xf reaches n
                dsquare = (dn * xf).sum(-1, keepdim=True) * (-0.5 * r.pow(3)) / x.shape[-1]  # (n, 1)
                # dn * r + dsquare * (2 * xf), in place on two temporaries (the same roundings)
                dx[a:b] = dn.mul_(r).add_((2 * xf).mul_(dsquare))
        return (None if dx is None else dx.view(x.shape),
                None if dweight is None else dweight.to(weight.dtype), None)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)
