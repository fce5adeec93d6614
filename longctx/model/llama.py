"""A LLaMA-style decoder in plain PyTorch. It knows nothing about distribution: attention is
a function handed in from outside (local kernels, or a context-parallel one)."""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from longctx.attention import AttentionFn, sdpa_attention
from longctx.base.errors import UserError
from longctx.model.cache import KVCache
from longctx.model.config import ModelConfig
from longctx.model.loss import chunked_cross_entropy
from longctx.model.norm import RMSNorm
from longctx.model.rope import RotaryEmbedding, apply_rotary
from longctx.model.swiglu import tiled_module, tiled_swiglu


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_fn: AttentionFn):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        qkv_bias = cfg.attention_bias or cfg.qkv_bias  # Qwen2: q, k and v only; Llama/Qwen3: all four
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        # Qwen3: one RMSNorm weight over head_dim shared by the heads, on q and k (not v), before RoPE
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.attn_fn = attn_fn

    def forward(self, x, cos, sin, segment_ids=None, kv_segment_ids=None,
                cache: Optional[KVCache] = None, layer_idx: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)  # (B, T, Hq, D)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, Hq, T, D), (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v)  # (B, Hkv, S, D)
        out = self.attn_fn(q, k, v, causal=True, scale=self.scale,
                           segment_ids=segment_ids, kv_segment_ids=kv_segment_ids)  # (B, Hq, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.tile_tokens = 0  # > 0: run in sequence tiles of this many tokens (see model/swiglu.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if 0 < self.tile_tokens < x.numel() // x.shape[-1]:
            if not self._plain():  # adapters on the projections: tiles through the modules (model/swiglu.py)
                trained = [p for p in self.parameters() if p.requires_grad]
                return tiled_module(x, self.tile_tokens, self._whole, trained)
            return tiled_swiglu(x, self.tile_tokens, self.gate_proj.weight, self.gate_proj.bias,
                                self.up_proj.weight, self.up_proj.bias, self.down_proj.weight, self.down_proj.bias)
        return self._whole(x)

    def _whole(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU

    def _plain(self) -> bool:
        return all(type(m) is nn.Linear for m in (self.gate_proj, self.up_proj, self.down_proj))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_fn: AttentionFn, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, attn_fn)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, cos, sin, segment_ids=None, kv_segment_ids=None, cache=None):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, segment_ids, kv_segment_ids,
                               cache, self.layer_idx)
        return h + self.mlp(self.post_attention_layernorm(h))


class Transformer(nn.Module):
    """Parameter names match Hugging Face's *ForCausalLM (Llama, Mistral, Qwen2, Qwen3) without the
    `model.` prefix."""

    def __init__(self, config: ModelConfig, attn_fn: AttentionFn = sdpa_attention):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, attn_fn, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.rope_parameters, config.head_dim, config.max_position_embeddings)
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    @property
    def output_weight(self) -> torch.Tensor:
        """(V, hidden) weight of the vocabulary head (the embedding when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def attention_modules(self) -> list[Attention]:
        """Every block's attention, in layer order (found through any wrapper of the blocks)."""
        return [m for m in self.modules() if isinstance(m, Attention)]

    def set_attention(self, attn_fn: AttentionFn) -> None:
        """Hand every block the attention function (a local kernel or a context-parallel one)."""
        for attention in self.attention_modules():
            attention.attn_fn = attn_fn

    @contextmanager
    def attention_scope(self, attn_fn: AttentionFn) -> Iterator[None]:
        """`attn_fn` in every block inside the `with`; each block's own function back on exit,
        also after an error (set_attention inside the scope lasts until the scope ends)."""
        modules = self.attention_modules()
        saved = [m.attn_fn for m in modules]
        self.set_attention(attn_fn)
        try:
            yield
        finally:
            for module, fn in zip(modules, saved):
                module.attn_fn = fn

    def auxiliary_loss(self) -> Optional[torch.Tensor]:
        """A dense model has no auxiliary loss (the transformers path's MoE models do)."""
        return None

    def aux_loss_value(self) -> Optional[torch.Tensor]:
        return None

    def set_mlp_tiling(self, tile_tokens: int) -> None:
        """Run every block's MLP in sequence tiles of `tile_tokens` tokens (0: the whole sequence
        at once): the backward then holds one tile's MLP activations instead of the sequence's."""
        if tile_tokens < 0:
            raise ValueError("tile_tokens must be >= 0")
        for module in self.modules():
            if isinstance(module, MLP):
                module.tile_tokens = tile_tokens

    def set_context(self, config: ModelConfig) -> None:
        """Switch to `config`'s RoPE and maximum length (a training stage's context extension);
        every other field must be this model's."""
        same = dict(rope_parameters=config.rope_parameters, max_position_embeddings=config.max_position_embeddings)
        if self.config.replace(**same) != config:
            raise ValueError("set_context changes only rope_parameters and max_position_embeddings")
        self.config = config
        self.rotary = RotaryEmbedding(config.rope_parameters, config.head_dim, config.max_position_embeddings)

    @torch.no_grad()
    def reset_parameters(self, seed: Optional[int] = None) -> None:
        """Normal(0, initializer_range) for matrices, zeros for biases, ones for norms."""
        gen = torch.Generator(device="cpu")
        gen.manual_seed(0 if seed is None else seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                w = torch.empty(module.weight.shape, dtype=torch.float32)
                w.normal_(0.0, self.config.initializer_range, generator=gen)
                module.weight.copy_(w)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def forward_hidden(self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                       segment_ids: Optional[torch.Tensor] = None,
                       kv_segment_ids: Optional[torch.Tensor] = None,
                       cache: Optional[KVCache] = None) -> torch.Tensor:
        """input_ids (B, T) -> final-normed hidden states (B, T, hidden)."""
        B, T = input_ids.shape
        if position_ids is None:
            start = cache.seq_len if cache is not None else 0
            position_ids = torch.arange(start, start + T, device=input_ids.device).expand(B, T)
        if self.config.window_limit is not None:
            check_within_window(position_ids, self.config.window_limit)
        cos, sin = self.rotary(position_ids)  # (B, T, D) fp32
        h = self.embed_tokens(input_ids)  # (B, T, hidden)
        for layer in self.layers:
            h = layer(h, cos, sin, segment_ids, kv_segment_ids, cache)
        if cache is not None:
            cache.advance(T)
        return self.norm(h)

    def forward(self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                segment_ids: Optional[torch.Tensor] = None, kv_segment_ids: Optional[torch.Tensor] = None,
                cache: Optional[KVCache] = None, labels: Optional[torch.Tensor] = None,
                loss_weights: Optional[torch.Tensor] = None, loss_chunk_size: int = 1024,
                loss_buckets: Optional[torch.Tensor] = None, logits_at: Optional[torch.Tensor] = None,
                token_mask: Optional[torch.Tensor] = None):
        """input_ids (B, T) -> logits (B, T, V); with `logits_at` (B, T) bool, the logits of those
        positions only (N, V), in row-major order (a few answer tokens of a long prompt).

        With `labels` (B, T) (pre-shifted: labels[t] is the target of position t, -100 ignored)
        it returns (loss_sum, weight_sum) instead, from a chunked cross-entropy that never
        materialises the full logits; optional `loss_weights` (B, T) up-weight tokens.
        `loss_buckets` (K,) int64, the ascending exclusive upper ends of position buckets, adds a
        third value: the (2, K) loss and weight sums of the labels by the position id of the token
        that predicts them (labels past the last end count in the last bucket).
        `token_mask` (B, T) bool, the real (non-padding) tokens, is part of the contract both model
        paths share (the transformers path's MoE loss counts only these); a dense model's outputs
        do not depend on it: causality already hides trailing padding from every real token.
        """
        del token_mask
        h = self.forward_hidden(input_ids, position_ids, segment_ids, kv_segment_ids, cache)
        if labels is not None:
            if loss_buckets is None:
                return chunked_cross_entropy(h, self.output_weight, labels, loss_weights, loss_chunk_size)
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            k = loss_buckets.numel()
            bucket = torch.bucketize(position_ids.contiguous(), loss_buckets, right=True).clamp_max_(k - 1)  # (B, T)
            return chunked_cross_entropy(h, self.output_weight, labels, loss_weights, loss_chunk_size,
                                         buckets=bucket, n_buckets=k)
        if logits_at is not None:
            h = h[logits_at]  # (N, hidden)
        return F.linear(h, self.output_weight)


def check_within_window(position_ids: torch.Tensor, window: int, what: str = "position_ids") -> None:
    """A model with a sliding window is exact here only while no query is `window` or more
    positions past a key it attends to; positions count from each document's start, so the
    largest position id bounds that distance (one host read, only for windowed models).

    Under context parallelism the caller checks the global positions (window_positions) before
    sharding them: every rank of the group holds the same ones, so all raise together before any
    collective. A rank checking only its own shard could raise while its peers wait in the ring."""
    farthest = int(position_ids.max())
    if farthest >= window:
        raise UserError(f"sliding_window: {what} reach position {farthest}, past the model's window of {window} "
                        "tokens: longctx computes full attention only (set the model's sliding_window to null to run "
                        "it with full attention, or keep sequences within the window)")


def window_positions(config: ModelConfig, position_ids: torch.Tensor, what: str) -> None:
    """check_within_window for a model of `config` (nothing without a window): the global
    (unsharded) position ids a context-parallel forward is about to shard."""
    window = getattr(config, "window_limit", None)
    if window is not None:
        check_within_window(position_ids, window, what)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (a tied head is counted once), works on the meta device."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def build_model(config: ModelConfig, *, device: str | torch.device = "cpu", dtype: Optional[torch.dtype] = None,
                attn_fn: AttentionFn = sdpa_attention, seed: Optional[int] = None) -> Transformer:
    """Build on `device` ("meta" allocates nothing) and initialise deterministically by seed."""
    with torch.device("meta"):
        model = Transformer(config, attn_fn)
    if str(device) == "meta":
        return model if dtype is None else model.to(dtype)
    model = model.to_empty(device=device)
    model.reset_parameters(seed)
    return model if dtype is None else model.to(dtype)
