"""Decode-time context parallelism: greedy generation with the prompt split across a CP group.

Prefill: the (left-padded) prompt batch is cut into the zigzag layout of longctx.parallel and
run through the model with context-parallel attention (ring / allgather / ulysses); every rank
keeps the K/V of *its own shard only*, so no rank ever holds the whole prompt's cache.

Decode: the new token is replicated on all ranks. Each rank attends it to its local K/V (with
the log-sum-exp), and the partial results are merged across the group in fp32:

    m = max_r lse_r,   out = sum_r exp(lse_r - m) * out_r / sum_r exp(lse_r - m)

(one all-reduce MAX and one all-reduce SUM per layer and step). The decoded tokens' K/V are
appended on a single owner rank, so the merge sees every key exactly once.

The model itself is unchanged: we hand it an attention function and a cache object that has
the KVCache interface (`update`, `advance`, `seq_len`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from longctx.attention import get_kernel
from longctx.model.generate import RowStopped, greedy_decode
from longctx.model.llama import window_positions
from longctx.parallel.cp import make_cp_attention
from longctx.parallel.sharding import shard_sequence
from longctx.parallel.zigzag import zigzag_multiple

PAD_SEGMENT = -1


class ShardedKVCache:
    """This rank's K/V: its zigzag shard of the prompt, plus decoded tokens when `owner`."""

    def __init__(self, model, batch_size: int, local_len: int, max_new_tokens: int, owner: bool):
        cfg = model.config
        w = model.embed_tokens.weight
        cap = local_len + (max_new_tokens if owner else 0)
        shape = (batch_size, cfg.num_key_value_heads, cap, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=w.dtype, device=w.device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=w.dtype, device=w.device) for _ in range(cfg.num_hidden_layers)]
        self.kv_segments = torch.full((batch_size, cap), PAD_SEGMENT, dtype=torch.long, device=w.device)
        self.owner = owner
        self.decoding = False
        self.seq_len = 0  # keys stored on this rank

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.decoding and not self.owner:  # the owner rank keeps decoded tokens
            return self.k[layer][:, :, :self.seq_len], self.v[layer][:, :, :self.seq_len]
        end = self.seq_len + k.shape[2]
        self.k[layer][:, :, self.seq_len:end] = k
        self.v[layer][:, :, self.seq_len:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, num_tokens: int) -> None:
        if not self.decoding or self.owner:
            self.seq_len += num_tokens

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class DistributedDecodeAttention:
    """Attention of replicated decode queries against per-rank K/V shards, merged in fp32."""

    def __init__(self, group, cache: ShardedKVCache, kernel):
        self.group, self.cache, self.kernel = group, cache, kernel

    def __call__(self, q, k, v, *, causal=True, scale=None, segment_ids=None, kv_segment_ids=None):
        # q (B, Hq, T, D) the same on every rank; k/v (B, Hkv, S_local, D) this rank's keys.
        B, H, T, _ = q.shape
        kv_seg = self.cache.kv_segments[:, :k.shape[2]]  # (B, S_local)
        q_seg = torch.zeros((B, T), dtype=kv_seg.dtype, device=q.device)
        # All local keys precede the new tokens, so no causal mask is needed (T == 1 here).
        out, lse = self.kernel.forward(q, k, v, causal=False, scale=scale, segment_ids=q_seg,
                                       kv_segment_ids=kv_seg)  # (B, H, T, D), (B, H, T) fp32
        m = lse.clone()
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=self.group)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        w = torch.exp(lse - m)  # (B, H, T), 0 where this rank sees no key
        buf = torch.cat([(out.float() * w[..., None]).reshape(-1), w.reshape(-1)])
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
        num, den = buf[:-w.numel()].view(out.shape), buf[-w.numel():].view(w.shape)
        return (num / den.clamp_min(1e-30)[..., None]).to(q.dtype)


@torch.no_grad()
def cp_generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, group=None,
                impl: str = "ring", eos_id: Optional[int] = None, pad_id: int = 0,
                backend: str = "auto", stopped: RowStopped = None) -> tuple[list[list[int]], dict]:
    """Greedy continuation of `prompts` (identical arguments on every rank of `group`; `stopped`:
    model/generate.greedy_decode's, which sees the same tokens on every rank).

    Returns (new tokens per prompt, cut before EOS; stats with this rank's cache bytes).
    """
    P = dist.get_world_size(group)
    rank = dist.get_rank(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    device = model.embed_tokens.weight.device
    B = len(prompts)
    longest = max(len(p) for p in prompts)
    L = -(-longest // zigzag_multiple(P)) * zigzag_multiple(P)  # padded to the zigzag granularity
    ids = torch.full((B, L), pad_id, dtype=torch.long, device=device)
    seg = torch.full((B, L), PAD_SEGMENT, dtype=torch.long, device=device)
    pos = torch.zeros((B, L), dtype=torch.long, device=device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    for b, p in enumerate(prompts):
        n = len(p)
        ids[b, L - n:] = torch.tensor(list(p), dtype=torch.long, device=device)
        seg[b, L - n:] = 0
        pos[b, L - n:] = torch.arange(n, device=device)
    padded = bool((lengths < L).any())
    # the prompt's and the decoded tokens' global positions, the same on every rank: a window they
    # pass is every rank's error here, before the prefill's first collective
    window_positions(model.config, torch.tensor(longest - 1 + max(max_new_tokens - 1, 0)),
                     "the prompt and its new tokens (max_new_tokens)")

    local_ids, local_pos, local_seg = (shard_sequence(x, rank, P, dim=1).contiguous() for x in (ids, pos, seg))
    owner = rank == P - 1
    cache = ShardedKVCache(model, B, L // P, max_new_tokens, owner)
    cache.kv_segments[:, :L // P] = local_seg
    with model.attention_scope(make_cp_attention(group, impl=impl, backend=backend)):
        s = local_seg if padded else None
        hidden = model.forward_hidden(local_ids, local_pos, s, s, cache)  # (B, L/P, hidden)
        # The last global position sits at the end of cp rank 0's second zigzag chunk.
        nxt = F.linear(hidden[:, -1], model.output_weight).argmax(-1)  # (B,)
        dist.broadcast(nxt, src=src, group=group)

        cache.decoding = True
        model.set_attention(DistributedDecodeAttention(group, cache, get_kernel(backend, device)))

        def step(i: int, tok: torch.Tensor) -> torch.Tensor:
            if owner:
                cache.kv_segments[:, cache.seq_len] = 0
            hidden = model.forward_hidden(tok[:, None], (lengths + i)[:, None], None, None, cache)
            predicted = F.linear(hidden[:, -1], model.output_weight).argmax(-1)
            dist.broadcast(predicted, src=src, group=group)  # identical already; keeps ranks in lockstep
            return predicted

        results = greedy_decode(nxt, step, max_new_tokens, eos_id=eos_id, pad_id=pad_id, stopped=stopped)
    return results, {"cache_bytes": cache.nbytes(), "padded_len": L}
