"""Context-parallel attention: the function the model is given.

    validate_cp(world_size, cp_size, impl, ulysses_size, num_heads, num_kv_heads, seq_len) -> CPLayout
    attn = make_cp_attention(cp_group, impl="ring", ulysses_size=None, backend="auto")
    model.set_attention(attn)                       # the model stays distribution-free
    batch = shard_batch(batch, cp_rank, cp_size)    # zigzag layout, global position ids

`attn` has the local-attention signature of longctx.attention.core: the model passes its
local-shard q/k/v and local-shard segment ids; the CP code communicates what it needs. The
strategies (ring, allgather, ulysses, hybrid) and the checks of a layout are in layout.py;
they run before any collective is issued. The whole CP attention is one dispatcher op,
torch.ops.longctx.cp_attention, with an explicit backward (see the end of this file).
"""
from __future__ import annotations

import itertools
import logging
import weakref
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from longctx.attention import get_kernel
from longctx.attention.kernel import AttentionKernel, resolve_scale
from longctx.attention.sinks import add_sinks, sinks_grad
from longctx.base.errors import require
from longctx.parallel.allgather import AllGatherSpec, allgather_backward, allgather_forward
from longctx.parallel.comm import RingComm, all_gather_stack, group_ranks
from longctx.parallel.hybrid import hybrid_backward, hybrid_forward
from longctx.parallel.layout import CPLayout, resolve_layout, validate_heads, validate_layout
from longctx.parallel.ring import RingSpec
from longctx.parallel.saved import SavedForward
from longctx.parallel.sharding import unshard_sequence, zigzag_indices
from longctx.parallel.ulysses import UlyssesSpec

log = logging.getLogger(__name__)
Tensor = torch.Tensor


class ContextParallelAttention:
    """Callable with the local attention signature, closing over the CP group."""

    def __init__(self, group: Optional[dist.ProcessGroup], layout: CPLayout, kernel: AttentionKernel,
                 overlap: bool = True):
        self.group, self.layout, self.kernel, self.overlap = group, layout, kernel, overlap
        self.ranks = group_ranks(group)
        self.rank = dist.get_rank(group)
        self.allgather = AllGatherSpec(group, self.rank, layout.cp_size, kernel)
        if layout.ulysses_size:  # else (automatic hybrid degree) at the first call, from its head counts
            self._set_layout(layout)
        self._seg_cache = None  # (local segment tensor, its version, gathered natural-order ids)
        self._variants: dict = {}  # block kernel key -> the same CP attention over that kernel
        self.handle = next(_next_handle)
        _INSTANCES[self.handle] = self

    def _set_layout(self, layout: CPLayout) -> None:
        self.layout = layout
        U = layout.ulysses_size
        j, u = divmod(self.rank, U)  # ring index (outer), Ulysses index (inner)
        self.ring_index, self.ulysses_index = j, u
        self.ulysses = UlyssesSpec([self.ranks[j * U + i] for i in range(U)], u, self.group)
        ring_ranks = [self.ranks[i * U + u] for i in range(layout.ring_size)]
        self.ring = RingSpec(RingComm(ring_ranks, j, self.group), self.kernel, self.overlap)

    def __repr__(self) -> str:
        L = self.layout
        return (f"ContextParallelAttention(impl={L.impl}, cp={L.cp_size}, ulysses={L.ulysses_size}, "
                f"ring={L.ring_size}, kernel={self.kernel.name}, overlap={self.overlap})")

    def with_kernel(self, kernel: AttentionKernel) -> "ContextParallelAttention":
        """This CP attention (group, layout) over another block kernel (e.g. a windowed one), made
        once per kernel key and kept alive with this one."""
        key = (type(kernel), getattr(kernel, "key", lambda: kernel.name)())
        if key not in self._variants:
            self._variants[key] = ContextParallelAttention(self.group, self.layout, kernel, self.overlap)
        return self._variants[key]

    def sum_over_sequence(self, t: Tensor) -> Tensor:
        """`t` summed over the cp group (whose ranks hold the shards of one sequence); no gradient."""
        t = t.detach().clone()
        dist.all_reduce(t, group=self.group)
        return t

    def global_token_index(self, local_len: int, device=None) -> Tensor:
        """(local_len,) the index in the whole row of each of this rank's tokens (zigzag)."""
        return zigzag_indices(local_len * self.layout.cp_size, self.rank, self.layout.cp_size, device)

    # -- helpers ----------------------------------------------------------------------------
    def _global_segments(self, seg: Tensor) -> Tensor:
        """Local (B, T) document ids -> (B, P*T) in natural order; gathered once per tensor."""
        c = self._seg_cache
        if c is not None and c[0] is seg and c[1] == seg._version:
            return c[2]
        parts = all_gather_stack(seg, self.group)  # (P, B, T)
        full = unshard_sequence(list(parts.unbind(0)), dim=1)
        self._seg_cache = (seg, seg._version, full)
        return full

    def _check(self, q: Tensor, k: Tensor, v: Tensor, segment_ids, kv_segment_ids) -> None:
        """Local shape checks, before any communication."""
        if q.shape[2] != k.shape[2]:
            raise ValueError("context-parallel attention needs equal query and key lengths (training / prefill); "
                             f"got T={q.shape[2]}, S={k.shape[2]}")
        if kv_segment_ids is not None and not (kv_segment_ids is segment_ids
                                               or torch.equal(kv_segment_ids, segment_ids)):
            raise ValueError("context-parallel attention takes one set of segment ids (kv_segment_ids == segment_ids)")
        T = q.shape[2]
        require(T % 2 == 0, f"data.seq_len={T * self.layout.cp_size} must be divisible by "
                            f"2*parallel.cp_size={2 * self.layout.cp_size} (zigzag layout)")
        if not self.layout.ulysses_size:  # the same degree on every rank: it depends on the shapes only
            self._set_layout(resolve_layout(self.layout, q.shape[1], k.shape[1]))
            log.info("context parallel attention: hybrid degree chosen for %d/%d heads: %s", q.shape[1], k.shape[1],
                     self)
        validate_heads(self.layout, q.shape[1], k.shape[1])

    # -- explicit forward / backward (local layout in, local layout out) --------------------------
    def forward_with_lse(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float,
                         segment_ids: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        full_seg = None if segment_ids is None else self._global_segments(segment_ids)
        if self.layout.impl == "allgather":
            return allgather_forward(q, k, v, self.allgather, causal, scale, segment_ids, full_seg)
        return hybrid_forward(q, k, v, ulysses=self.ulysses, ring=self.ring, kernel=self.kernel, causal=causal,
                              scale=scale, full_seg=full_seg)

    def backward(self, dout: Tensor, saved: SavedForward, causal: bool, scale: float,
                 segment_ids: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        full_seg = None if segment_ids is None else self._global_segments(segment_ids)
        if self.layout.impl == "allgather":
            return allgather_backward(dout, saved, self.allgather, causal, scale, segment_ids, full_seg)
        return hybrid_backward(dout, saved, ulysses=self.ulysses, ring=self.ring, kernel=self.kernel,
                               causal=causal, scale=scale, full_seg=full_seg)

    # -- the attention function ---------------------------------------------------------------
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True, scale: Optional[float] = None,
                 segment_ids: Optional[Tensor] = None, kv_segment_ids: Optional[Tensor] = None) -> Tensor:
        # q (B, Hq, T, D), k/v (B, Hkv, T, D): this rank's zigzag shard; segment_ids (B, T) local.
        out, _ = self.attention_with_lse(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                         kv_segment_ids=kv_segment_ids)
        return out

    def attention_with_lse(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
                           scale: Optional[float] = None, segment_ids: Optional[Tensor] = None,
                           kv_segment_ids: Optional[Tensor] = None,
                           sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """(out, lse) of the local queries; differentiable in q, k, v and `sinks` (Hq,), the
        attention sinks added to every query's softmax (one dispatcher op)."""
        self._check(q, k, v, segment_ids, kv_segment_ids)
        if sinks is not None:
            return cp_attention_sinks_op(q, k, v, sinks, self.handle, causal, resolve_scale(scale, q.shape[-1]),
                                         segment_ids)
        return cp_attention_op(q, k, v, self.handle, causal, resolve_scale(scale, q.shape[-1]), segment_ids)


# One dispatcher-level op for the whole CP attention: selective activation checkpointing can keep
# its (out, lse) as a unit (instead of every ring step's kernel output) and then never replays its
# communication in the recompute; torch.compile sees one opaque op. The op finds its process
# group and layout through an integer handle.
_INSTANCES: "weakref.WeakValueDictionary[int, ContextParallelAttention]" = weakref.WeakValueDictionary()
_next_handle = itertools.count()


@torch.library.custom_op("longctx::cp_attention", mutates_args=())
def cp_attention_op(q: Tensor, k: Tensor, v: Tensor, handle: int, causal: bool, scale: float,
                    segment_ids: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return _INSTANCES[handle].forward_with_lse(q, k, v, causal, scale, segment_ids)


@cp_attention_op.register_fake
def _cp_attention_fake(q, k, v, handle, causal, scale, segment_ids):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


def _cp_setup_context(ctx, inputs, output):
    q, k, v, handle, causal, scale, segment_ids = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, segment_ids)
    ctx.attn, ctx.causal, ctx.scale = _INSTANCES[handle], causal, scale  # alive until backward
    ctx.mark_non_differentiable(lse)


def _cp_backward(ctx, dout, _dlse):
    q, k, v, out, lse, segment_ids = ctx.saved_tensors
    dq, dk, dv = ctx.attn.backward(dout, SavedForward(q, k, v, out, lse), ctx.causal, ctx.scale, segment_ids)
    return dq, dk, dv, None, None, None, None


cp_attention_op.register_autograd(_cp_backward, setup_context=_cp_setup_context)


@torch.library.custom_op("longctx::cp_attention_sinks", mutates_args=())
def cp_attention_sinks_op(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, handle: int, causal: bool, scale: float,
                          segment_ids: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """cp_attention with attention sinks (attention/sinks.py) merged into the finished (out, lse)."""
    out, lse = _INSTANCES[handle].forward_with_lse(q, k, v, causal, scale, segment_ids)
    return add_sinks(out, lse, sinks)


@cp_attention_sinks_op.register_fake
def _cp_attention_sinks_fake(q, k, v, sinks, handle, causal, scale, segment_ids):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


def _cp_sinks_setup_context(ctx, inputs, output):
    q, k, v, sinks, handle, causal, scale, segment_ids = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, sinks, out, lse, segment_ids)
    ctx.attn, ctx.causal, ctx.scale = _INSTANCES[handle], causal, scale
    ctx.mark_non_differentiable(lse)


def _cp_sinks_backward(ctx, dout, _dlse):
    q, k, v, sinks, out, lse, segment_ids = ctx.saved_tensors
    # the kernels' backward given the output and lse with the sinks is the sink attention's own
    dq, dk, dv = ctx.attn.backward(dout, SavedForward(q, k, v, out, lse), ctx.causal, ctx.scale, segment_ids)
    return dq, dk, dv, sinks_grad(dout, out, lse, sinks), None, None, None, None


cp_attention_sinks_op.register_autograd(_cp_sinks_backward, setup_context=_cp_sinks_setup_context)


def make_cp_attention(group: Optional[dist.ProcessGroup] = None, impl: str = "ring",
                      ulysses_size: Optional[int] = None, backend: str = "auto", overlap: bool = True,
                      device: Optional[torch.device | str] = None,
                      kernel: Optional[AttentionKernel] = None) -> ContextParallelAttention:
    """Attention function for the model that runs context-parallel over `group` (default: world).

    The CP size is the group's size; no collective is issued here. backend picks the block
    kernel (see attention/backends.py), or `kernel` gives one (e.g. VarlenKernel over a
    stand-in); overlap=False waits for each ring transfer before computing (for benchmarking
    the overlap).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("make_cp_attention needs an initialized torch.distributed process group")
    layout = validate_layout(dist.get_world_size(group), impl, ulysses_size)
    if device is None:
        backend_dev = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    else:
        backend_dev = device
    kernel = kernel if kernel is not None else get_kernel(backend, backend_dev)
    attn = ContextParallelAttention(group, layout, kernel, overlap)
    log.info("context parallel attention: %s (block kernel %r)", attn, kernel)
    return attn
