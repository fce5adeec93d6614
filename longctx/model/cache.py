"""A preallocated key/value cache for incremental decoding."""
from __future__ import annotations

import torch


class KVCache:
    """Per-layer K/V of shape (B, Hkv, max_len, D), filled left to right.

    The model calls `update(layer, k, v)` in every layer, then `advance(T)` once per forward,
    so all layers see the same `seq_len` during a call.
    """

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int,
                 max_len: int, *, dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.seq_len = 0

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> "KVCache":
        cfg = model.config
        weight = model.embed_tokens.weight
        return cls(cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, cfg.head_dim, max_len,
                   dtype=weight.dtype, device=weight.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v (B, Hkv, T, D) after the cached tokens; return all keys/values so far."""
        end = self.seq_len + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KVCache full: {end} tokens > max_len {self.max_len}")
        self.k[layer][:, :, self.seq_len:end] = k
        self.v[layer][:, :, self.seq_len:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, num_tokens: int) -> None:
        self.seq_len += num_tokens
