"""RoPE whose frequencies depend on the sequence length (dynamic NTK, longrope), per sequence.

The training module (model/rope.py's RotaryEmbedding) keeps the largest dynamic base it has
seen across calls, so an eval cell's scores would depend on the cells before it (and on a
resume), and under context parallelism each rank sees only its shard's positions. Here every
row's frequencies come from its own length: the longest of the positions in the call and the
length the caller declares (`row_lengths`: the prompt, or the whole window under CP). That is
what transformers computes for one sequence on a fresh model: the base grows with the prompt,
then with every decoded token, and a row's result does not depend on what it is batched with.

    install(model)                                 # no-op for length-free RoPE types
    with row_lengths(model, [len(p) for p in prompts]):
        ... prefill and decode ...
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from longctx.model.rope import compute_inv_freq

LENGTH_DEPENDENT = ("dynamic", "longrope")


class SequenceRotary(nn.Module):
    """position_ids (B, T) -> cos, sin (B, T, head_dim) fp32, each row at its own length."""

    def __init__(self, rope_parameters: dict, head_dim: int, max_position_embeddings: int):
        super().__init__()
        self.params, self.head_dim, self.max_position_embeddings = rope_parameters, head_dim, max_position_embeddings
        self.lengths: Optional[torch.Tensor] = None  # (B,) declared row lengths (row_lengths)
        self._cache: dict = {}  # (length, device) -> (inv_freq (D/2,), attention scaling)

    def _frequencies(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        key = (length, device)
        if key not in self._cache:
            inv_freq, scaling = compute_inv_freq(self.params, self.head_dim, self.max_position_embeddings, length)
            self._cache[key] = (inv_freq.to(device), scaling)
        return self._cache[key]

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen = position_ids.amax(dim=1) + 1  # (B,)
        if self.lengths is not None and self.lengths.numel() == seen.numel():
            seen = torch.maximum(seen, self.lengths.to(seen.device))
        rows = [self._frequencies(int(n), position_ids.device) for n in seen.tolist()]
        inv_freq = torch.stack([r[0] for r in rows])  # (B, D/2)
        scaling = torch.tensor([r[1] for r in rows], dtype=torch.float32, device=position_ids.device)[:, None, None]
        freqs = position_ids[..., None].float() * inv_freq[:, None, :]  # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, D)
        return emb.cos() * scaling, emb.sin() * scaling


def install(model) -> None:
    """Give `model` per-sequence RoPE where its RoPE type depends on the length."""
    cfg = model.config
    if cfg.rope_parameters["rope_type"] in LENGTH_DEPENDENT:
        model.rotary = SequenceRotary(cfg.rope_parameters, cfg.head_dim, cfg.max_position_embeddings)


@contextmanager
def row_lengths(model, lengths: Sequence[int]) -> Iterator[None]:
    """Declare each row's length for the calls inside (a CP shard holds only part of its positions)."""
    rotary = getattr(model, "rotary", None)
    if not isinstance(rotary, SequenceRotary):
        yield
        return
    rotary.lengths = torch.tensor(list(lengths), dtype=torch.long)
    try:
        yield
    finally:
        rotary.lengths = None
        rotary._cache.clear()  # decoding adds one length per token: keep it to the sequence in flight
