"""Presets of transformers-path models: each the config.json of its Hugging Face release (or a
tiny one for tests and the CPU recipe), so plans and dry runs work before the weights exist."""
from __future__ import annotations

from longctx.model.auto.support import AutoModelSpec

# Qwen/Qwen3-30B-A3B's config.json (Qwen3 Technical Report, arXiv:2505.09388): 48 layers of 32
# query / 4 kv heads, 128 experts of width 768 with 8 routed per token; 30.5B parameters, 3.3B active
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rope_scaling": None, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "router_aux_loss_coef": 0.001, "output_router_logits": False, "use_sliding_window": False,
    "sliding_window": None, "max_window_layers": 48, "attention_bias": False, "attention_dropout": 0.0,
    "hidden_act": "silu", "initializer_range": 0.02, "bos_token_id": 151643, "eos_token_id": 151645,
}
# the same architecture at test size: 4 experts of width 32, 2 routed per token, a byte-tokenizer vocabulary
DEBUG_TINY_QWEN3_MOE = {
    **QWEN3_30B_A3B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 160, "moe_intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4,
    "num_experts_per_tok": 2, "max_position_embeddings": 256, "max_window_layers": 2, "bos_token_id": None,
    "eos_token_id": None,
}


def qwen3_30b_a3b() -> AutoModelSpec:
    return AutoModelSpec.from_hf(QWEN3_30B_A3B, "preset qwen3-30b-a3b")


def debug_tiny_qwen3_moe() -> AutoModelSpec:
    return AutoModelSpec.from_hf(DEBUG_TINY_QWEN3_MOE, "preset debug-tiny-qwen3-moe")
