"""Packed documents through one variable-length kernel call, for local and context-parallel attention.

`VarlenKernel(ops)` is an AttentionKernel (explicit forward with LSE, backward from a final
out/lse) whose document handling is a cu_seqlens plan instead of masks or per-document calls:

    rows of (query run, key run) pairs of the same document   ->   at most two varlen calls
    (bottom-right causal sequences in one, fully visible rectangles in the other)

Each document of each batch row becomes one sequence of the call: its queries against its own
keys, so no cross-document pair is computed and no mask exists. The same plan serves a whole
row (one sequence per row), a ring step's block (its queries' runs against another member's
key runs), an all-gather prefix and a Ulysses head shard: every CP impl uses the same kernels.

Planning reads the segment ids on the host once per id tensor (a small cache keyed on the
tensor's identity and version), not once per layer. Inputs a flash kernel cannot take (fp32)
use EagerKernel's exact math instead.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from longctx.attention.eager import EagerKernel
from longctx.attention.function import kernel_attention
from longctx.attention.kernel import AttentionKernel, _check_shapes, document_pairs, resolve_scale
from longctx.attention.lse import NEG_INF, lse_for_backward, merge_attention
from longctx.attention.varlen_ops import ReferenceVarlen, VarlenOps

log = logging.getLogger(__name__)
Tensor = torch.Tensor
HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Span:
    """One sequence of a varlen call: row b, queries [q0, q1) and keys [k0, k1), bottom-right
    causal or fully visible."""
    b: int
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


def document_spans(B: int, T: int, S: int, *, causal: bool, segment_ids: Optional[Tensor],
                   kv_segment_ids: Optional[Tensor]) -> List[Span]:
    """The visible (query, key) pairs as varlen sequences. Query i sits at key position i + S - T.
    Per row, each query run of a document meets each key run of the same document; causal pairs
    become a bottom-right causal sequence (keys trimmed to the last query), a fully visible
    rectangle, or both (queries past the last key see all of it); queries that see no key of
    the run are left out."""
    spans: List[Span] = []
    for b, qa, qb, ka, kb in document_pairs(B, T, S, segment_ids, kv_segment_ids):
        spans.extend(_pair(b, qa, qb, ka, kb, S - T, causal))
    return spans


def _pair(b: int, qa: int, qb: int, ka: int, kb: int, off: int, causal: bool) -> List[Span]:
    if not causal:
        return [Span(b, qa, qb, ka, kb, False)]
    last = qb - 1 + off  # key position of the last query
    if ka > last:
        return []
    kb = min(kb, last + 1)
    q0 = max(qa, ka - off)  # earlier queries see none of these keys
    if kb - 1 == last:  # keys end at the last query: one bottom-right causal sequence (a 1 x 1 one too)
        return [Span(b, q0, qb, ka, kb, True)]
    if kb - 1 <= qa + off:  # the keys end before every query: each sees them all
        return [Span(b, qa, qb, ka, kb, False)]
    split = kb - off  # queries from here on see all keys
    return [Span(b, q0, split, ka, kb, True), Span(b, split, qb, ka, kb, False)]


@dataclass
class VarlenCall:
    """One kernel call: its tokens' flat indices (None: all of them, in order), cu_seqlens, maxima."""
    causal: bool
    q_index: Optional[Tensor]  # (Nq,) int64 into the B*T query tokens
    k_index: Optional[Tensor]  # (Nk,) int64 into the B*S key tokens
    cu_q: Tensor  # (n + 1,) int32
    cu_k: Tensor
    max_q: int
    max_k: int


@dataclass
class VarlenPlan:
    calls: List[VarlenCall]
    q_unique: bool  # no query token is in two calls: outputs and dq are written, not merged
    k_unique: bool  # no key token is in two sequences: dk, dv are written, not accumulated
    whole: bool  # one call over every query token in order: its output is the result


def _layers(spans: List[Span]) -> List[List[Span]]:
    """Split spans into calls: one flag per call, no query token twice within a call."""
    layers: List[List[Span]] = []
    for s in spans:
        for members in layers:
            if members[0].causal == s.causal and not any(m.b == s.b and m.q0 < s.q1 and s.q0 < m.q1
                                                         for m in members):
                members.append(s)
                break
        else:
            layers.append([s])
    return layers


def _index(parts: List[Tuple[int, int]], total: int, device) -> Optional[Tensor]:
    """Flat token indices of the [a, z) parts, or None when they are exactly 0..total in order."""
    pos = 0
    for a, z in parts:
        if a != pos:
            break
        pos = z
    else:
        if pos == total:
            return None
    idx = torch.cat([torch.arange(a, z) for a, z in parts]) if parts else torch.zeros(0, dtype=torch.long)
    return _to_device(idx, device)


def _to_device(t: Tensor, device) -> Tensor:
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)  # no wait for the queued kernels
    return t.to(device)


def _overlaps(parts: List[Tuple[int, int]]) -> bool:
    parts = sorted(parts)
    return any(b[0] < a[1] for a, b in zip(parts, parts[1:]))


def build_plan(B: int, T: int, S: int, *, causal: bool, segment_ids: Optional[Tensor],
               kv_segment_ids: Optional[Tensor], device) -> VarlenPlan:
    spans = document_spans(B, T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids)
    calls = []
    for members in _layers(spans):
        q_parts = [(s.b * T + s.q0, s.b * T + s.q1) for s in members]
        k_parts = [(s.b * S + s.k0, s.b * S + s.k1) for s in members]
        q_len = [z - a for a, z in q_parts]
        k_len = [z - a for a, z in k_parts]
        cu_q = torch.tensor([0] + q_len, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        cu_k = torch.tensor([0] + k_len, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        calls.append(VarlenCall(members[0].causal, _index(q_parts, B * T, device), _index(k_parts, B * S, device),
                                _to_device(cu_q, device), _to_device(cu_k, device), max(q_len), max(k_len)))
    q_all = [(s.b * T + s.q0, s.b * T + s.q1) for s in spans]
    k_all = [(s.b * S + s.k0, s.b * S + s.k1) for s in spans]
    whole = len(calls) == 1 and calls[0].q_index is None
    return VarlenPlan(calls, not _overlaps(q_all), not _overlaps(k_all), whole)


class IdentityCache:
    """Values computed from a few tensors (segment ids), kept for the last `size` distinct inputs.
    An entry holds its tensors, so their storage cannot be reused by another tensor while the
    entry lives; an in-place edit changes `_version` and misses."""

    def __init__(self, size: int = 16) -> None:
        self.size, self.entries = size, OrderedDict()

    @staticmethod
    def _key(t: Optional[Tensor]):
        if t is None:
            return None
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t._version,
                str(t.device))

    def get(self, tensors: Tuple[Optional[Tensor], ...], compute, extra=()):
        key = (extra, tuple(self._key(t) for t in tensors))
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            return hit[0]
        value = compute()
        self.entries[key] = (value, tensors)
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return value


def _tokens(x: Tensor) -> Tensor:
    """(B, H, L, D) -> (B*L, H, D) token-major, contiguous (a copy unless already that layout)."""
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B * L, H, D).contiguous()


def _take(x: Tensor, index: Optional[Tensor]) -> Tensor:
    return x if index is None else x.index_select(0, index)


class VarlenKernel(AttentionKernel):
    """AttentionKernel over VarlenOps (module docstring). `ops` is a varlen_ops implementation;
    ReferenceVarlen runs the same plan on CPU with exact math."""

    def __init__(self, ops: Optional[VarlenOps] = None) -> None:
        self.ops = ops if ops is not None else ReferenceVarlen()
        self.name = self.ops.name
        self._plans = IdentityCache()
        self._fallback = EagerKernel()
        self._warned = False

    def __repr__(self) -> str:
        return f"VarlenKernel(ops={self.ops!r})"

    def _exact_fallback(self, q: Tensor) -> bool:
        """fp32 (or any non-half) inputs: flash kernels take fp16/bf16 only."""
        if isinstance(self.ops, ReferenceVarlen) or q.dtype in HALF:
            return False
        if not self._warned:
            log.warning("%s varlen kernel takes fp16/bf16; %s attention runs EagerKernel's fp32 math",
                        self.ops.name, q.dtype)
            self._warned = True
        return True

    def varlen_plan(self, q: Tensor, k: Tensor, causal: bool, segment_ids: Optional[Tensor],
                    kv_segment_ids: Optional[Tensor]) -> VarlenPlan:
        B, T, S = q.shape[0], q.shape[2], k.shape[2]
        return self._plans.get((segment_ids, kv_segment_ids), lambda: build_plan(
            B, T, S, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids, device=q.device),
            extra=(B, T, S, causal, str(q.device)))

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True, scale: Optional[float] = None,
                segment_ids: Optional[Tensor] = None, kv_segment_ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """q (B, Hq, T, D), k/v (B, Hkv, S, D) -> out (B, Hq, T, D), lse (B, Hq, T) fp32."""
        if self._exact_fallback(q):
            return self._fallback.forward(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                          kv_segment_ids=kv_segment_ids)
        _check_shapes(q, k, v)
        scale = resolve_scale(scale, q.shape[-1])
        B, H, T, D = q.shape
        plan = self.varlen_plan(q, k, causal, segment_ids, kv_segment_ids)
        qf, kf, vf = _tokens(q), _tokens(k), _tokens(v)  # (B*T, Hq, D), (B*S, Hkv, D)
        if plan.whole:
            c = plan.calls[0]
            out, lse = self.ops.fwd(qf, _take(kf, c.k_index), _take(vf, c.k_index), c.cu_q, c.cu_k, c.max_q,
                                    c.max_k, scale, c.causal)
            lse = lse.t()  # (B*T, Hq)
        else:
            out = torch.zeros(B * T, H, D, dtype=q.dtype if plan.q_unique else torch.float32, device=q.device)
            lse = torch.full((B * T, H), NEG_INF, dtype=torch.float32, device=q.device)
            for c in plan.calls:
                o, call_lse = self.ops.fwd(_take(qf, c.q_index), _take(kf, c.k_index), _take(vf, c.k_index),
                                           c.cu_q, c.cu_k, c.max_q, c.max_k, scale, c.causal)
                call_lse = call_lse.t().float()  # (Nq, Hq)
                if not plan.q_unique:  # a query token seen by two calls: merge through the LSE
                    o, call_lse = merge_attention(_take(out, c.q_index), _take(lse, c.q_index), o, call_lse)
                if c.q_index is None:
                    out.copy_(o)
                    lse.copy_(call_lse)
                else:
                    out.index_copy_(0, c.q_index, o.to(out.dtype))
                    lse.index_copy_(0, c.q_index, call_lse)
        out = out.to(q.dtype).view(B, T, H, D).transpose(1, 2)  # (B, Hq, T, D)
        return out, lse.float().view(B, T, H).permute(0, 2, 1)  # (B, Hq, T)

    def backward(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *,
                 causal: bool = True, scale: Optional[float] = None, segment_ids: Optional[Tensor] = None,
                 kv_segment_ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """-> dq (B, Hq, T, D), dk, dv (B, Hkv, S, D): this call's share of the gradient of the
        attention whose final output and lse are `out`, `lse`."""
        if self._exact_fallback(q):
            return self._fallback.backward(dout, q, k, v, out, lse, causal=causal, scale=scale,
                                           segment_ids=segment_ids, kv_segment_ids=kv_segment_ids)
        _check_shapes(q, k, v)
        scale = resolve_scale(scale, q.shape[-1])
        B, H, T, D = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        plan = self.varlen_plan(q, k, causal, segment_ids, kv_segment_ids)
        qf, kf, vf = _tokens(q), _tokens(k), _tokens(v)
        of, dof = _tokens(out.to(q.dtype)), _tokens(dout.to(q.dtype))
        lf = lse_for_backward(lse).permute(0, 2, 1).reshape(B * T, H)  # (B*T, Hq)
        q_acc = q.dtype if plan.q_unique else torch.float32
        k_acc = k.dtype if plan.k_unique else torch.float32
        dq = torch.zeros(B * T, H, D, dtype=q_acc, device=q.device)
        dk = torch.zeros(B * S, Hkv, D, dtype=k_acc, device=k.device)
        dv = torch.zeros(B * S, Hkv, D, dtype=k_acc, device=v.device)
        for c in plan.calls:
            gq, gk, gv = self.ops.bwd(_take(dof, c.q_index), _take(qf, c.q_index), _take(kf, c.k_index),
                                      _take(vf, c.k_index), _take(of, c.q_index),
                                      _take(lf, c.q_index).t().contiguous(), c.cu_q, c.cu_k, c.max_q, c.max_k,
                                      scale, c.causal)
            _put(dq, c.q_index, gq, plan.q_unique)
            _put(dk, c.k_index, gk, plan.k_unique)
            _put(dv, c.k_index, gv, plan.k_unique)
        to_heads = lambda x, L, dtype: x.to(dtype).view(B, L, x.shape[1], D).transpose(1, 2)  # noqa: E731
        return to_heads(dq, T, q.dtype), to_heads(dk, S, k.dtype), to_heads(dv, S, v.dtype)


def _put(acc: Tensor, index: Optional[Tensor], grad: Tensor, unique: bool) -> None:
    """Write (unique tokens) or add (tokens shared by sequences) one call's gradient into place."""
    if index is None:
        if unique:
            acc.copy_(grad)
        else:
            acc.add_(grad.float())
    elif unique:
        acc.index_copy_(0, index, grad.to(acc.dtype))
    else:
        acc.index_add_(0, index, grad.float())


def make_varlen_attention(ops: VarlenOps):
    """Local attention function (core.py's signature) running VarlenKernel(ops) with autograd."""
    kernel = VarlenKernel(ops)

    def varlen_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True, scale: Optional[float] = None,
                         segment_ids: Optional[Tensor] = None, kv_segment_ids: Optional[Tensor] = None) -> Tensor:
        out, _ = kernel_attention(kernel, q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                  kv_segment_ids=kv_segment_ids)
        return out

    varlen_attention.kernel = kernel
    return varlen_attention
