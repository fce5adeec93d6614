"""Exact parameter counts of a transformers-path model, from transformers' own class built on the
meta device (nothing allocated): every expert of a mixture of experts counts, as ZeRO holds them."""
from __future__ import annotations

import json
from functools import lru_cache

from longctx.model.auto.support import AutoModelSpec


def parameter_counts(spec: AutoModelSpec) -> dict:
    """{total, layer, embed, head, mlp, attn} as plan/layout.py's parameter_counts gives them."""
    return dict(_counts(json.dumps(spec.hf, sort_keys=True, default=str)))


@lru_cache(maxsize=8)
def _counts(hf_json: str) -> tuple:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**json.loads(hf_json))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)

    def size(module) -> int:
        return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())

    layer = model.model.layers[-1]  # a full MoE layer (Qwen MoE's first layers may be dense)
    embed = model.model.embed_tokens.weight.numel()
    head = model.get_output_embeddings().weight
    tied = head is model.model.embed_tokens.weight
    mlp = next((size(m) for n, m in layer.named_children() if n in ("mlp", "block_sparse_moe", "feed_forward")), 0)
    attn = size(layer.self_attn)
    return tuple({"total": size(model), "layer": size(layer), "embed": embed, "head": embed if tied else head.numel(),
                  "mlp": mlp, "attn": attn}.items())
