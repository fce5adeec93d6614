"""RMSNorm whose backward keeps only its input and the per-token 1/rms.

The forward is the reference's ops in the reference's order (statistics in fp32, scale applied
in the input dtype), so outputs are bit-identical. Autograd through those ops would keep an fp32
copy of the input and the rounded normalized value (3x the input's bytes at bf16) until the
backward reaches the norm; this Function recomputes both from the input instead.
"""
from __future__ import annotations

import torch
from torch import nn


def _normalized(xf: torch.Tensor, rstd: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (xf * rstd).to(dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()  # (..., d)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1) fp32
        ctx.save_for_backward(x, weight, rstd)
        return weight * _normalized(xf, rstd, x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xf = x.float()
        dweight = None
        if ctx.needs_input_grad[1]:
            normed = _normalized(xf, rstd, x.dtype)
            dweight = (grad * normed).sum_to_size(weight.shape).to(weight.dtype)
        if not ctx.needs_input_grad[0]:
            return None, dweight, None
        dn = (grad * weight).to(x.dtype).float()  # d(normalized), rounded as autograd rounds it
        # n = xf * rstd, rstd = (mean(xf^2) + eps)^-1/2: the two paths by which xf reaches n
        drstd = (dn * xf).sum(-1, keepdim=True)  # (..., 1)
        dsquare = drstd * (-0.5 * rstd.pow(3)) / x.shape[-1]  # d(mean) spread over the d entries
        dx = dn * rstd + dsquare * (2 * xf)
        return dx.to(x.dtype), dweight, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)
