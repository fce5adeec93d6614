"""longctx's attention inside transformers' own model: the function registered with
transformers' `AttentionInterface` under the name "longctx".

transformers calls it from each attention module after RoPE, with q (B, Hq, T, D) and k/v
(B, Hkv, T, D), and the module's own extras as keyword arguments: `scaling`, `sliding_window`
(Qwen2-MoE keeps it on the module only), `softcap` (Gemma 2) and `s_aux` (GPT-OSS's sinks).
The name is not in transformers' mask registry, so no 4D mask is ever built; document ids and
each token's index in the row come from longctx (the model's `AttentionState`), never from
transformers' kwargs. Causality and windows follow token order (a global index across CP
shards), document boundaries follow segment ids, and positions reach RoPE only. Plain layers
run the installed attention function (a local kernel or a context-parallel one) as the native
model does; windowed and softcapped layers run the same distribution over `PositionalKernel`
with order codes, and sinks are merged into the finished (out, lse).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from longctx.attention import AttentionFn, get_kernel
from longctx.attention.function import kernel_attention
from longctx.attention.positional import PositionalKernel, order_codes
from longctx.model.cache import KVCache

Tensor = torch.Tensor
ATTENTION_NAME = "longctx"
_MISSING = object()


@dataclass
class AttentionState:
    """What every attention module of one model shares: the installed attention function and the
    current forward call's document ids (B, T) and indices in the row (B, T) of this rank's tokens."""

    attn_fn: AttentionFn
    segment_ids: Optional[Tensor] = None
    token_index: Optional[Tensor] = None  # (B, T) each token's place in the whole row
    kv_segment_ids: Optional[Tensor] = None  # decoding: the ids of every cached key (B, S)
    cache: Optional[KVCache] = None  # decoding: longctx's K/V cache, filled by every layer
    _codes: Optional[Tensor] = None
    _kv_codes: Optional[Tensor] = None  # decoding: the order codes of the cached keys
    _kernels: dict = field(default_factory=dict)

    def set_inputs(self, segment_ids: Optional[Tensor], token_index: Tensor,
                   kv_segment_ids: Optional[Tensor] = None, cache: Optional[KVCache] = None) -> None:
        self.segment_ids, self.token_index, self._codes = segment_ids, token_index, None
        self.kv_segment_ids, self.cache = kv_segment_ids, cache
        if cache is not None:  # the keys' codes grow with the cache (a new cache starts them anew)
            new = self.codes()
            self._kv_codes = new if cache.seq_len == 0 else torch.cat([self._kv_codes, new], dim=1)

    def codes(self) -> Tensor:
        if self._codes is None:  # one tensor per forward: the CP code gathers it once
            self._codes = order_codes(self.segment_ids, self.token_index)
        return self._codes

    def kv_codes(self) -> Optional[Tensor]:
        return self._kv_codes if self.cache is not None else None

    def kernel(self, window: Optional[int], softcap: Optional[float]) -> PositionalKernel:
        key = (window, softcap)
        if key not in self._kernels:
            self._kernels[key] = PositionalKernel(window, softcap)
        return self._kernels[key]


def _window(module, kwargs) -> Optional[int]:
    window = kwargs.get("sliding_window", _MISSING)
    if window is _MISSING:
        window = getattr(module, "sliding_window", None)
    return int(window) if window else None


def longctx_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, *, scaling=None,
                      dropout: float = 0.0, **kwargs):
    """transformers' attention signature -> (out (B, T, Hq, D), None)."""
    state: Optional[AttentionState] = getattr(module, "longctx_state", None)
    if state is None:
        raise RuntimeError(f"{type(module).__name__}: attention 'longctx' runs only inside a longctx model "
                           "(longctx.model.auto.AutoCausalLM)")
    if dropout:
        raise ValueError("attention dropout > 0 cannot run under longctx (set the config's attention_dropout to 0)")
    window, softcap, sinks = _window(module, kwargs), kwargs.get("softcap"), kwargs.get("s_aux")
    fn = state.attn_fn
    if state.cache is not None:  # decoding: this layer's keys so far (S >= T)
        key, value = state.cache.update(module.layer_idx, key, value)
    if not window and not softcap and sinks is None:
        out = fn(query, key, value, causal=True, scale=scaling, segment_ids=state.segment_ids,
                 kv_segment_ids=state.kv_segment_ids)
        return out.transpose(1, 2), None
    kernel = state.kernel(window, softcap) if (window or softcap) else None
    ids = state.codes() if kernel is not None else state.segment_ids
    kv_ids = state.kv_codes() if kernel is not None else state.kv_segment_ids
    if hasattr(fn, "attention_with_lse"):  # context parallel: the same groups, another block kernel
        cp = fn.with_kernel(kernel) if kernel is not None else fn
        out, _ = cp.attention_with_lse(query, key, value, causal=True, scale=scaling, segment_ids=ids, sinks=sinks)
    else:
        kernel = kernel if kernel is not None else get_kernel("auto", query.device)
        out, _ = kernel_attention(kernel, query, key, value, causal=True, scale=scaling, segment_ids=ids,
                                  kv_segment_ids=kv_ids, sinks=sinks)
    return out.transpose(1, 2), None


def register_attention() -> None:
    """Make "longctx" an attention implementation transformers' models can be built with."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, longctx_attention)
