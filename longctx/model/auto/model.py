"""transformers' own *ForCausalLM behind the contract the trainer, validation, probe, checkpoints
and evaluation ask of the native model (longctx/model/llama.py's Transformer):

    set_attention(fn) / attention_scope(fn)    the installed attention (local or context-parallel)
    set_context(spec)                          a stage's RoPE and maximum length
    forward(ids, position_ids, segment_ids, labels=..., loss_buckets=..., token_mask=...)
                                               (loss_sum, weight_sum[, by_bucket]) from the chunked
                                               loss, the logits never materialised; token_mask
                                               marks the real (non-padding) tokens the MoE loss counts
    auxiliary_loss()                           this rank's share of the MoE load-balancing loss

Parameter names are the model's own (`model.layers.0...`, `lm_head.weight`): the decoder and
the head are this module's children, the transformers wrapper is kept unregistered. The model
runs with attention "longctx" (attention.py); it knows nothing about distribution: a CP
attention function carries `sum_over_sequence`, which the MoE loss uses for its counts.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from longctx.attention import AttentionFn, sdpa_attention
from longctx.model.auto.attention import ATTENTION_NAME, AttentionState, register_attention
from longctx.model.auto.moe import RouterLogits, aux_loss_share
from longctx.model.auto.support import AutoModelSpec
from longctx.model.loss import chunked_cross_entropy

Tensor = torch.Tensor
# what a stage changes in transformers' config object (set_context)
ROPE_CONFIG_FIELDS = ("rope_parameters", "max_position_embeddings", "partial_rotary_factor", "rope_theta")


class AutoCausalLM(nn.Module):
    """A transformers causal LM (`hf_model`, built with attn_implementation="longctx")."""

    def __init__(self, hf_model: nn.Module, spec: AutoModelSpec, attn_fn: AttentionFn = sdpa_attention):
        super().__init__()
        if getattr(hf_model.config, "_attn_implementation", None) != ATTENTION_NAME:
            raise ValueError(f"build the transformers model with attn_implementation={ATTENTION_NAME!r}")
        head = hf_model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError(f"{spec.model_type}: a vocabulary head with a bias is not supported")
        self.model = hf_model.model  # the decoder (embeddings, layers, final norm)
        self.lm_head = head
        object.__setattr__(self, "hf", hf_model)  # not a child: no `hf.` prefix on the names
        self.config = spec
        self.state = AttentionState(attn_fn)
        for name, module in self.model.named_modules():
            if name.endswith("self_attn"):
                object.__setattr__(module, "longctx_state", self.state)
        self.routers = RouterLogits(hf_model)
        self._aux: Optional[Tensor] = None
        self._aux_value: Optional[Tensor] = None
        hf = hf_model.config
        self.logit_divisor = float(getattr(hf, "logits_scaling", None) or 1.0)  # Granite
        self.logit_scale = float(getattr(hf, "logit_scale", None) or 1.0)  # Cohere
        self.final_softcap = getattr(hf, "final_logit_softcapping", None)  # Gemma 2

    # -- what the trainer and eval reach for -------------------------------------------------
    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    @property
    def output_weight(self) -> Tensor:
        """(V, hidden) weight of the vocabulary head (the embedding when tied)."""
        return self.lm_head.weight

    def attention_modules(self) -> list[nn.Module]:
        return [m for n, m in self.model.named_modules() if n.endswith("self_attn")]

    def set_attention(self, attn_fn: AttentionFn) -> None:
        self.state.attn_fn = attn_fn

    @contextmanager
    def attention_scope(self, attn_fn: AttentionFn) -> Iterator[None]:
        saved = self.state.attn_fn
        self.state.attn_fn = attn_fn
        try:
            yield
        finally:
            self.state.attn_fn = saved

    def set_mlp_tiling(self, tile_tokens: int) -> None:
        if tile_tokens:
            raise ValueError("parallel.mlp_tile_tokens: MLP tiling is the native path's; use 0 with "
                             f"a {self.config.model_type} model")

    def set_context(self, spec: AutoModelSpec) -> None:
        """Switch to `spec`'s RoPE and maximum length (a stage's context extension): the model is
        then what `build_auto_model(spec)` builds with these weights. The config's rope fields
        and maximum length come from `spec`'s config.json as transformers reads it (the fields
        the stage does not set, such as partial_rotary_factor, included), and every rotary
        module is rebuilt from them."""
        same = (spec.rope_parameters == self.config.rope_parameters
                and spec.max_position_embeddings == self.config.max_position_embeddings)
        self.config = spec
        if same:
            return
        from transformers import AutoConfig

        fresh = AutoConfig.for_model(**{**spec.hf, "attn_implementation": ATTENTION_NAME})
        hf = self.hf.config
        for name in ROPE_CONFIG_FIELDS:
            if hasattr(fresh, name):
                setattr(hf, name, copy.deepcopy(getattr(fresh, name)))
        for parent in list(self.model.modules()):
            for name, old in list(parent.named_children()):
                if type(old).__name__.endswith("RotaryEmbedding"):
                    with torch.device(next(iter(old.buffers())).device):
                        setattr(parent, name, type(old)(config=hf))  # its frequencies from the new RoPE

    def auxiliary_loss(self) -> Optional[Tensor]:
        """The last forward call's MoE load-balancing loss share of this rank, times the config's
        router_aux_loss_coef (None for a dense model, or when the config does not train it:
        transformers adds it only with output_router_logits)."""
        return self._aux

    def aux_loss_value(self) -> Optional[Tensor]:
        """The last forward's unscaled load-balancing loss share (logged), or None."""
        return self._aux_value

    # -- forward ------------------------------------------------------------------------------
    def forward_hidden(self, input_ids: Tensor, position_ids: Optional[Tensor] = None,
                       segment_ids: Optional[Tensor] = None, kv_segment_ids: Optional[Tensor] = None,
                       cache=None, token_mask: Optional[Tensor] = None) -> Tensor:
        """input_ids (B, T) -> final-normed hidden states (B, T, hidden). With `cache` (longctx's
        KVCache, decoding) every layer adds its keys to it and attends to all cached keys, whose
        document ids are `kv_segment_ids` (B, S) (transformers' own cache is not used).
        token_mask (B, T) bool: the real tokens, the only ones the MoE loss counts (None: all)."""
        B, T = input_ids.shape
        start = cache.seq_len if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(start, start + T, device=input_ids.device).expand(B, T)
        self.state.set_inputs(segment_ids, self._token_index(B, T, start, input_ids.device),
                              kv_segment_ids if cache is not None else None, cache)
        self.routers.logits.clear()
        self.routers.recording = True
        try:
            h = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        finally:
            self.routers.recording = False
            # the documents and positions stay: an activation-checkpoint recompute in the backward
            # runs the attention again; a decoding cache does not outlive its call
            self.state.cache = self.state.kv_segment_ids = None
        if cache is not None:
            cache.advance(T)
        self._moe_loss(token_mask)
        return h

    def _token_index(self, B: int, T: int, start: int, device) -> Tensor:
        """(B, T) each local token's index in the whole row: what causality and windows follow.
        A context-parallel attention function knows its shard's global indices."""
        global_index = getattr(self.state.attn_fn, "global_token_index", None)
        if global_index is not None:
            return global_index(T, device).expand(B, T)
        return torch.arange(start, start + T, device=device).expand(B, T)

    def _moe_loss(self, token_mask: Optional[Tensor]) -> None:
        self._aux = self._aux_value = None
        if not self.routers or not self.routers.logits:
            return
        reduce = getattr(self.state.attn_fn, "sum_over_sequence", None)
        share = aux_loss_share(self.routers.logits, self.hf.num_experts, self.hf.num_experts_per_tok, reduce,
                               token_mask)
        self.routers.logits.clear()
        self._aux_value = share.detach()
        if getattr(self.hf.config, "output_router_logits", False):
            self._aux = share * float(self.hf.config.router_aux_loss_coef)

    def _head_input(self, h: Tensor) -> Tensor:
        """The hidden states whose product with output_weight is the model's logits (the linear
        output transforms folded in); the softcap is applied in the loss."""
        factor = self.logit_scale / self.logit_divisor
        return h if factor == 1.0 else h * factor

    def forward(self, input_ids: Tensor, position_ids: Optional[Tensor] = None,
                segment_ids: Optional[Tensor] = None, kv_segment_ids: Optional[Tensor] = None,
                cache=None, labels: Optional[Tensor] = None, loss_weights: Optional[Tensor] = None,
                loss_chunk_size: int = 1024, loss_buckets: Optional[Tensor] = None,
                logits_at: Optional[Tensor] = None, token_mask: Optional[Tensor] = None):
        """The native model's forward (llama.py's Transformer.forward), through transformers' model;
        token_mask (B, T) bool marks the real tokens the MoE load-balancing loss counts."""
        h = self._head_input(self.forward_hidden(input_ids, position_ids, segment_ids, kv_segment_ids, cache,
                                                 token_mask))
        softcap = self.final_softcap
        if labels is not None:
            if loss_buckets is None:
                return chunked_cross_entropy(h, self.output_weight, labels, loss_weights, loss_chunk_size,
                                             softcap=softcap)
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            k = loss_buckets.numel()
            bucket = torch.bucketize(position_ids.contiguous(), loss_buckets, right=True).clamp_max_(k - 1)
            return chunked_cross_entropy(h, self.output_weight, labels, loss_weights, loss_chunk_size,
                                         buckets=bucket, n_buckets=k, softcap=softcap)
        if logits_at is not None:
            h = h[logits_at]  # (N, hidden)
        logits = F.linear(h, self.output_weight)
        return logits if softcap is None else torch.tanh(logits / softcap) * softcap


def build_auto_model(spec: AutoModelSpec, *, dtype: Optional[torch.dtype] = None, seed: Optional[int] = None,
                     attn_fn: AttentionFn = sdpa_attention, device: str | torch.device = "cpu") -> AutoCausalLM:
    """A randomly initialised model of `spec` (transformers' own init, seeded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    register_attention()
    hf_cfg = AutoConfig.for_model(**{**spec.hf, "attn_implementation": ATTENTION_NAME})
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        hf_model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=ATTENTION_NAME, dtype=dtype)
    return AutoCausalLM(hf_model, spec, attn_fn)


def load_auto_model(path, spec: AutoModelSpec, *, dtype: Optional[torch.dtype] = None,
                    attn_fn: AttentionFn = sdpa_attention, device: str | torch.device = "cpu") -> AutoCausalLM:
    """The model in HF directory `path`, with `spec`'s configuration (a stage may change its RoPE)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    register_attention()
    hf_cfg = AutoConfig.for_model(**{**spec.hf, "attn_implementation": ATTENTION_NAME})
    hf_model = AutoModelForCausalLM.from_pretrained(str(path), config=hf_cfg, attn_implementation=ATTENTION_NAME,
                                                    dtype=dtype, device_map={"": str(device)})
    return AutoCausalLM(hf_model, spec, attn_fn)
