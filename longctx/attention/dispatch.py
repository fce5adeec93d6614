"""`auto` attention on CUDA: each call takes the fastest exact kernel for its shape, by a rule
measured on an H100 (docs/results/2026-12-05-gpu-attention-dispatch.md has the table it comes
from and the command that re-measures it):

    no documents, or one per row               -> SDPA over whole rows (cuDNN / flash)
    documents, FlashAttention-4 installed (SM90+) -> FA4's varlen kernel
    documents averaging >= 8192 tokens           -> one SDPA call per document (cuDNN wins long calls)
    documents, head_dim >= 128, triton present   -> FlexAttention with a document block mask
    other documents                              -> a varlen kernel (flash-attn's, else torch's)

Never a dense (T, T) mask. Calls the rule does not cover (decode against a KV cache, keys
with their own ids, fp32) keep the sdpa backend's path. The choice needs the rows' document
counts, read on the host once per segment-id tensor (cached), not once per layer.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from longctx.attention.flex import flex_available, flex_document_attention
from longctx.attention.kernel import row_runs
from longctx.attention.sdpa import document_runs_attention, sdpa_attention
from longctx.attention.varlen import HALF, IdentityCache, make_varlen_attention
from longctx.attention.varlen_ops import make_varlen_ops, varlen_problem

log = logging.getLogger(__name__)
Tensor = torch.Tensor
LONG_DOCUMENT_TOKENS = 8192  # at and above this mean length, per-document cuDNN calls beat varlen
FLEX_HEAD_DIM = 128  # from this head size on, FlexAttention beats torch's varlen kernel


@dataclass(frozen=True)
class DocumentStats:
    """What the rule reads of a batch's segment ids."""
    rows: int
    documents: int  # runs over all rows
    tokens: int
    contiguous: bool  # every document is one run of its row (packed rows are)

    @property
    def one_per_row(self) -> bool:
        return self.documents == self.rows

    @property
    def mean_length(self) -> float:
        return self.tokens / self.documents


def document_stats(segment_ids: Tensor) -> DocumentStats:
    runs = row_runs(segment_ids)
    contiguous = all(len({doc for _, _, doc in row}) == len(row) for row in runs)
    return DocumentStats(rows=len(runs), documents=sum(len(r) for r in runs), tokens=segment_ids.numel(),
                         contiguous=contiguous)


def choose(stats: Optional[DocumentStats], head_dim: int, available: frozenset) -> str:
    """The method for one training call: sdpa | per-document | fa4 | flex | flash | varlen.
    `available` names the optional kernels that run here (fa4, flash, flex, varlen)."""
    if stats is None or stats.one_per_row:
        return "sdpa"
    if "fa4" in available:
        return "fa4"
    if not stats.contiguous:  # a document in several runs of a row: only the varlen plan merges those
        return next((name for name in ("flash", "varlen") if name in available), "sdpa")
    if stats.mean_length >= LONG_DOCUMENT_TOKENS:
        return "per-document"
    if head_dim >= FLEX_HEAD_DIM and "flex" in available:
        return "flex"
    for name in ("flash", "varlen"):
        if name in available:
            return name
    return "flex" if "flex" in available else "per-document"


def available_kernels(device: torch.device) -> frozenset:
    names = {name for name in ("fa4", "flash", "varlen") if varlen_problem(name, device) is None}
    if flex_available(device) is None:
        names.add("flex")
    return frozenset(names)


class AutoAttention:
    """The `auto` local attention function (core.py's signature)."""

    def __init__(self, device: torch.device) -> None:
        self.available = available_kernels(device)
        self._stats = IdentityCache(size=8)
        self._varlen = {}
        self._logged = set()

    def method(self, q: Tensor, k: Tensor, causal: bool, segment_ids: Optional[Tensor],
               kv_segment_ids: Optional[Tensor]) -> str:
        T, S = q.shape[2], k.shape[2]
        if q.device.type != "cuda" or q.dtype not in HALF or not causal or T != S or T == 1:
            return "sdpa"
        if kv_segment_ids is not None and kv_segment_ids is not segment_ids:
            return "sdpa"
        stats = None if segment_ids is None else self._stats.get(
            (segment_ids,), lambda: document_stats(segment_ids.expand(q.shape[0], T)), extra=q.shape[0])
        return choose(stats, q.shape[-1], self.available)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True, scale: Optional[float] = None,
                 segment_ids: Optional[Tensor] = None, kv_segment_ids: Optional[Tensor] = None) -> Tensor:
        name = self.method(q, k, causal, segment_ids, kv_segment_ids)
        if name not in self._logged:
            self._logged.add(name)
            log.info("attention auto: %s for %s (head_dim %d)", name,
                     "packed documents" if segment_ids is not None else "whole rows", q.shape[-1])
        if name == "sdpa":
            return sdpa_attention(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                                  kv_segment_ids=kv_segment_ids)
        if name == "per-document":  # chosen for contiguous documents only, so never None here
            return document_runs_attention(q, k, v, segment_ids, scale=scale, group_tokens=1)
        if name == "flex":
            return flex_document_attention(q, k, v, segment_ids, scale=scale)
        if name not in self._varlen:
            self._varlen[name] = make_varlen_attention(make_varlen_ops(name))
        return self._varlen[name](q, k, v, causal=causal, scale=scale, segment_ids=segment_ids)
