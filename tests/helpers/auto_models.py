"""Tiny random configs of the decoders the transformers path runs (model/auto/support.py's
TESTED), with every feature switched on at sizes a test can afford: windows shorter than the
test sequences, softcaps, sinks, MoE routers whose load-balancing loss counts."""
from __future__ import annotations

import torch

WINDOW = 5  # shorter than every test sequence: a full-attention mistake shows
COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, tie_word_embeddings=False, attention_dropout=0.0)
MOE = dict(output_router_logits=True, router_aux_loss_coef=5.0, num_experts_per_tok=2)
EXTRA = {
    "gemma2": dict(sliding_window=WINDOW, attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
                   query_pre_attn_scalar=12, layer_types=["sliding_attention", "full_attention"]),
    "gemma3_text": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                        query_pre_attn_scalar=12, final_logit_softcapping=5.0),
    "olmo2": dict(),
    "smollm3": dict(no_rope_layers=[1, 0], no_rope_layer_interval=2),
    "granite": dict(attention_multiplier=0.2, logits_scaling=3.0, embedding_multiplier=2.0, residual_multiplier=0.5),
    "glm4": dict(partial_rotary_factor=0.5),
    "cohere2": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], logit_scale=0.5,
                    layer_norm_eps=1e-5),
    # six query heads: Ulysses at cp 4 takes its uneven-head path, with sinks
    "gpt_oss": dict(num_attention_heads=6, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                    num_local_experts=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **MOE),
    "mixtral": dict(num_local_experts=4, **MOE),
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=24, decoder_sparse_step=1, **MOE),
    "qwen2_moe": dict(num_experts=4, moe_intermediate_size=24, shared_expert_intermediate_size=32,
                      use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                      layer_types=["full_attention", "sliding_attention"], **MOE),
}
TYPES = tuple(EXTRA)
MOE_TYPES = ("gpt_oss", "mixtral", "qwen3_moe", "qwen2_moe")


def tiny_hf_config(model_type: str) -> dict:
    """config.json of a tiny `model_type` decoder, as transformers writes it."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, **{**COMMON, **EXTRA[model_type]})
    return cfg.to_dict()


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 11) -> torch.nn.Module:
    """Random values for what transformers initialises to constants (norm weights, biases, sinks),
    so a dropped feature changes the result."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1 or name.endswith("sinks"):
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def tiny_auto_model(model_type: str, seed: int = 3):
    """The longctx transformers-path model of `model_type` (fp32, perturbed)."""
    from longctx.model.auto import build_auto_model, check_supported

    spec = check_supported(tiny_hf_config(model_type), f"{model_type} test config")
    return perturb(build_auto_model(spec, seed=seed, dtype=torch.float32))


def reference_twin(model, implementation: str = "eager"):
    """transformers' own model with the same weights and its own attention implementation."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{**model.config.hf, "attn_implementation": implementation})
    twin = AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation, dtype=torch.float32)
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return twin.eval()


def save_tiny_hf(model_type: str, path, vocab_size: int = 512, seed: int = 3):
    """A tiny random `model_type` model saved by transformers itself (config.json + safetensors),
    with a vocabulary the byte tokenizer fits: what a user points model.init_from at."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **{**COMMON, **EXTRA[model_type], "vocab_size": vocab_size})
    torch.manual_seed(seed)
    model = perturb(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32))
    model.save_pretrained(str(path))
    return path
