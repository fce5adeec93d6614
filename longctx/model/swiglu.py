"""The SwiGLU MLP, whole or in sequence tiles.

The MLP acts on each token alone, so it can run over a long sequence a tile of tokens at a
time. In training the tiled form keeps only its input: the backward recomputes each tile's
gate and up projections and back-propagates the tile. Its activations then take one tile's
worth of memory instead of the sequence's, for one more MLP forward in the backward.
Each tile's weight-gradient GEMM rounds to the weights' dtype, as the whole-sequence GEMM
does; the tiles' gradients are summed in fp32 and rounded once more, so a bf16 weight gradient
carries one rounding per tile more than the untiled one (fp32: only the summation order differs).

An MLP whose projections carry adapters (LoRA layers: model/adapter.py) runs in tiles through
tiled_module: the backward recomputes each tile through the modules themselves and returns the
gradient of every parameter the modules train (the adapters' factors), not only the base
weights (a tiling that listed the base weights alone would leave the adapters untrained).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def swiglu(x: Tensor, gate_w: Tensor, gate_b: Optional[Tensor], up_w: Tensor, up_b: Optional[Tensor],
           down_w: Tensor, down_b: Optional[Tensor]) -> Tensor:
    """x (..., d) -> down(silu(gate(x)) * up(x)) (..., d)."""
    return F.linear(F.silu(F.linear(x, gate_w, gate_b)) * F.linear(x, up_w, up_b), down_w, down_b)


def _forward_tiles(tokens: Tensor, tile: int, params) -> Tensor:
    out = tokens.new_empty(tokens.shape[0], params[4].shape[0])  # (N, d)
    for start in range(0, tokens.shape[0], tile):
        out[start:start + tile] = swiglu(tokens[start:start + tile], *params)
    return out


class _TiledSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tile: int, *params: Optional[Tensor]) -> Tensor:
        # x (N, d) tokens; params: gate_w, gate_b, up_w, up_b, down_w, down_b (biases may be None)
        out = _forward_tiles(x, tile, params)
        ctx.tile = tile
        ctx.save_for_backward(x, *params)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, *params = ctx.saved_tensors
        needs_x, needs_params = ctx.needs_input_grad[0], ctx.needs_input_grad[2:]
        leaves = [p.detach().requires_grad_(need) if p is not None else None
                  for p, need in zip(params, needs_params)]
        wanted = [leaf for leaf, need in zip(leaves, needs_params) if leaf is not None and need]
        sums: list[Optional[Tensor]] = [None] * len(wanted)  # fp32 sums of the tiles' weight gradients
        dx = torch.empty_like(x) if needs_x else None
        for start in range(0, x.shape[0], ctx.tile):
            with torch.enable_grad():
                xt = x[start:start + ctx.tile].detach().requires_grad_(needs_x)  # (n, d)
                out = swiglu(xt, *leaves)
                grads = torch.autograd.grad(out, ([xt] if needs_x else []) + wanted, grad[start:start + ctx.tile])
            if needs_x:
                dx[start:start + ctx.tile], grads = grads[0], grads[1:]
            for i, g in enumerate(grads):
                sums[i] = g.float() if sums[i] is None else sums[i].add_(g)
        summed = iter(s.to(leaf.dtype) for s, leaf in zip(sums, wanted))
        param_grads = [next(summed) if leaf is not None and need else None
                       for leaf, need in zip(leaves, needs_params)]
        return (dx, None, *param_grads)


class _TiledModule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, tile: int, fn, *params: Tensor) -> Tensor:
        # x (N, d) tokens; fn: (n, d) -> (n, d_out), reading `params` (the trained parameters it uses)
        with torch.no_grad():
            out = torch.cat([fn(x[start:start + tile]) for start in range(0, x.shape[0], tile)])  # (N, d_out)
        ctx.tile, ctx.fn = tile, fn
        ctx.save_for_backward(x)
        ctx.params = params
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        needs_x = ctx.needs_input_grad[0]
        wanted = [p for p, need in zip(ctx.params, ctx.needs_input_grad[3:]) if need]
        sums: list[Optional[Tensor]] = [None] * len(wanted)  # fp32 sums of the tiles' parameter gradients
        dx = torch.empty_like(x) if needs_x else None
        for start in range(0, x.shape[0], ctx.tile):
            with torch.enable_grad():
                xt = x[start:start + ctx.tile].detach().requires_grad_(needs_x)  # (n, d)
                out = ctx.fn(xt)
                grads = torch.autograd.grad(out, ([xt] if needs_x else []) + wanted, grad[start:start + ctx.tile],
                                            allow_unused=True)
            if needs_x:
                dx[start:start + ctx.tile], grads = grads[0], grads[1:]
            for i, g in enumerate(grads):
                if g is not None:
                    sums[i] = g.float() if sums[i] is None else sums[i].add_(g)
        summed = iter(None if s is None else s.to(p.dtype) for s, p in zip(sums, wanted))
        return (dx, None, None, *[next(summed) if need else None for need in ctx.needs_input_grad[3:]])


def tiled_module(x: Tensor, tile: int, fn, params: list[Tensor]) -> Tensor:
    """fn over x (..., d) in tiles of `tile` (> 0) tokens; `params`: every parameter fn trains
    (requires_grad), each given its summed gradient in the backward."""
    tokens = x.reshape(-1, x.shape[-1])  # (N, d)
    if torch.is_grad_enabled() and (x.requires_grad or params):
        out = _TiledModule.apply(tokens, tile, fn, *params)
    else:
        out = torch.cat([fn(tokens[start:start + tile]) for start in range(0, tokens.shape[0], tile)])
    return out.view(*x.shape[:-1], out.shape[-1])


def tiled_swiglu(x: Tensor, tile: int, *params: Optional[Tensor]) -> Tensor:
    """swiglu over x (..., d) in tiles of `tile` (> 0) tokens. Without autograd the tiles only
    bound the forward's working memory."""
    tokens = x.reshape(-1, x.shape[-1])  # (N, d)
    if torch.is_grad_enabled() and (x.requires_grad or any(p is not None and p.requires_grad for p in params)):
        out = _TiledSwiGLU.apply(tokens, tile, *params)
    else:
        out = _forward_tiles(tokens, tile, params)
    return out.view(*x.shape[:-1], out.shape[-1])
