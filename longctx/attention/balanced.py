"""Thread-balanced calls of PyTorch's CPU flash-attention backward.

The CPU flash backward runs its work items, one per (batch row, kv head), on the intra-op
threads. When the items do not divide among the threads some threads idle: SmolLM2's 3 kv
heads on 2 threads keep one thread idle for a third of the call. `balanced_backward` cuts the
queries into pieces stacked along the batch until the items divide (exact: each piece's
gradients are its share of the whole, with the whole attention's out/lse):

- causal square (T x T): the two diagonal causal halves run as one call of 2B rows, the
  off-diagonal block (late queries x early keys) as an unmasked block, each balanced again;
- unmasked block: the queries split into s equal pieces (s B rows); dK/dV are summed over
  the pieces.

Pieces keep at least MIN_PIECE_ROWS queries; below that, or once balanced, one plain call.
"""
from __future__ import annotations

import math
from typing import Callable, Tuple

import torch

Tensor = torch.Tensor
Grads = Tuple[Tensor, Tensor, Tensor]
# (dout, q, k, v, out, lse, is_causal) -> (dq, dk, dv): one call of the kernel, scale and mask bound
BackwardCall = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool], Grads]

MIN_PIECE_ROWS = 256  # smaller pieces cost more in per-call overhead than idle threads do
BALANCED = 0.95  # busy share of the threads at which a call is left whole


def thread_share(items: int, threads: int) -> float:
    """Average busy share of `threads` threads running `items` equal work items."""
    return items / (threads * math.ceil(items / threads))


def balanced_backward(call: BackwardCall, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                      lse: Tensor, *, is_causal: bool, threads: int) -> Grads:
    """`call(dout, q, k, v, out, lse, is_causal)` with q/dout/out (B, Hq, T, D), k/v (B, Hkv, S, D),
    lse (B, Hq, T) -> dq, dk, dv as one call gives them, computed as thread-balanced pieces."""
    items = q.shape[0] * k.shape[1]
    if threads <= 1 or thread_share(items, threads) >= BALANCED:
        return call(dout, q, k, v, out, lse, is_causal)
    if is_causal:
        return _causal(call, dout, q, k, v, out, lse, threads)
    return _unmasked(call, dout, q, k, v, out, lse, threads)


def _causal(call: BackwardCall, dout, q, k, v, out, lse, threads: int) -> Grads:
    B, T = q.shape[0], q.shape[2]
    if T % 2 or T // 2 < MIN_PIECE_ROWS:
        return call(dout, q, k, v, out, lse, True)
    h = T // 2
    # the two diagonal squares [0, h) x [0, h) and [h, T) x [h, T), as rows 0..B-1 and B..2B-1
    dq_d, dk_d, dv_d = balanced_backward(call, *(_stack_rows(x, 2) for x in (dout, q, k, v, out, lse)),
                                         is_causal=True, threads=threads)
    late = slice(h, T)
    dq_o, dk_o, dv_o = balanced_backward(call, dout[:, :, late], q[:, :, late], k[:, :, :h], v[:, :, :h],
                                         out[:, :, late], lse[:, :, late], is_causal=False, threads=threads)
    dq = torch.cat([dq_d[:B], _add(dq_d[B:], dq_o)], dim=2)
    dk = torch.cat([_add(dk_d[:B], dk_o), dk_d[B:]], dim=2)
    dv = torch.cat([_add(dv_d[:B], dv_o), dv_d[B:]], dim=2)
    return dq, dk, dv


def _unmasked(call: BackwardCall, dout, q, k, v, out, lse, threads: int) -> Grads:
    B, T = q.shape[0], q.shape[2]
    items = B * k.shape[1]
    pieces = next((s for s in range(2, threads + 1)
                   if T % s == 0 and T // s >= MIN_PIECE_ROWS and thread_share(items * s, threads) >= BALANCED), 1)
    if pieces == 1:
        return call(dout, q, k, v, out, lse, False)
    keys = (x.repeat(pieces, 1, 1, 1) for x in (k, v))  # every piece sees every key
    dq, dk, dv = call(*(_stack_rows(x, pieces) for x in (dout, q)), *keys,
                      *(_stack_rows(x, pieces) for x in (out, lse)), False)
    return (torch.cat(dq.chunk(pieces, dim=0), dim=2),
            _sum_pieces(dk, pieces), _sum_pieces(dv, pieces))


def _stack_rows(x: Tensor, pieces: int) -> Tensor:
    """(B, H, T, ...) -> (pieces * B, H, T / pieces, ...): equal query pieces stacked along the batch."""
    return torch.cat(x.chunk(pieces, dim=2), dim=0)


def _add(a: Tensor, b: Tensor) -> Tensor:
    """a + b rounded once to a's dtype (partial gradients of low-precision calls add in fp32)."""
    return a.add_(b) if a.dtype == torch.float32 else a.float().add_(b.float()).to(a.dtype)


def _sum_pieces(x: Tensor, pieces: int) -> Tensor:
    """(pieces * B, ...) -> (B, ...): the pieces' partial dK/dV summed (in fp32, rounded once)."""
    parts = x.reshape(pieces, x.shape[0] // pieces, *x.shape[1:])
    return parts.sum(0, dtype=torch.float32).to(x.dtype)
