"""Shared helpers for model tests: tiny configs per RoPE type and an HF twin of our model."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from longctx.model import ModelConfig, build_model
from longctx.model.hf import config_to_hf, to_hf_key
from longctx.parallel.checkpointing import model_key

ORIGINAL = 32  # original_max_position_embeddings of the scaled RoPE types in tests
HEAD_DIM = 16

ROPE_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "abf": {"rope_type": "default", "rope_theta": 500000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": ORIGINAL},
    "yarn-mscale": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 16, "beta_slow": 2,
                    "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False,
                    "original_max_position_embeddings": ORIGINAL},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)],
                 "long_factor": [1.0 + 0.5 * i for i in range(HEAD_DIM // 2)],
                 "original_max_position_embeddings": ORIGINAL},
}

HEADS = {"mha": (4, 4), "gqa": (8, 2), "mqa": (4, 1)}


def tiny_config(rope: str = "default", heads: str = "gqa", **overrides) -> ModelConfig:
    n_heads, n_kv = HEADS[heads]
    # dynamic NTK treats max_position_embeddings as the original length (as transformers does)
    max_pos = ORIGINAL if rope == "dynamic" else 4 * ORIGINAL
    kwargs = dict(vocab_size=128, hidden_size=n_heads * HEAD_DIM, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=HEAD_DIM,
                  max_position_embeddings=max_pos, rms_norm_eps=1e-6,
                  rope_parameters=dict(ROPE_CASES[rope]), bos_token_id=None, eos_token_id=None)
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def tiny_model(rope: str = "default", heads: str = "gqa", seed: int = 0, **overrides):
    return perturb_norms_and_biases(build_model(tiny_config(rope, heads, **overrides), seed=seed), seed + 1).eval()


@torch.no_grad()
def perturb_norms_and_biases(model, seed: int):
    """Norm weights away from 1 and biases away from 0 (their initial values), so a wrong norm or a
    dropped bias would show; returns the model."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):  # layernorms, the final norm, Qwen3's q_norm / k_norm
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith(".bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


# tiny configs of each family: what transformers' class for it builds differently from Llama
FAMILY_CASES = {
    "llama": {},
    "mistral": {"model_type": "mistral", "sliding_window": 4096},  # a window longer than any test sequence
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3", "head_dim": 24},  # head_dim != hidden / heads, as Qwen3-4B's
}


def hf_config(config: ModelConfig, dtype: torch.dtype = torch.float32):
    """transformers' config of the family, read from every field of the config.json our export
    writes (rope_scaling and the legacy fields too), as from_pretrained reads that file."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    written = json.loads(json.dumps(config_to_hf(config, dtype)))
    return CONFIG_MAPPING[written["model_type"]].from_dict(written)


def hf_twin(model):
    """transformers' *ForCausalLM of the model's family with the same config and weights."""
    from transformers import AutoModelForCausalLM

    config = hf_config(model.config)
    config._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(config).eval()
    state = {to_hf_key(k): v for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k or (k == "lm_head.weight" and model.lm_head is None) for k in missing)
    return hf


def loss_and_grads(model, ids, labels, segs=None):
    """One forward/backward of the model's chunked loss: (mean loss, gradients by plain-model name)."""
    s, n = model(ids, labels=labels, segment_ids=segs)
    (s / n).backward()
    grads = {model_key(k): p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    return (s / n).item(), grads


def save_byte_model(d: Path, max_position_embeddings: int = 1024) -> Path:
    """A debug-tiny model saved in `d` whose config names the byte tokenizer ("longctx_tokenizer"),
    so `longctx eval --model d` needs no --tokenizer; returns d."""
    from longctx import save_pretrained
    from longctx.model import get_preset

    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=max_position_embeddings)
    save_pretrained(build_model(cfg, seed=0).eval(), d)
    config = json.loads((d / "config.json").read_text())
    config["longctx_tokenizer"] = "byte"
    (d / "config.json").write_text(json.dumps(config))
    return d
