"""The model families longctx trains, as data: each is the one LLaMA-style model with a few
fields fixed the way transformers' class for it builds them (modeling_llama / mistral / qwen2 /
qwen3). A field a family fixes cannot be set otherwise (its export would load into a different
model); the others are free. Torch-free, so config validation loads no torch.

    llama    LlamaForCausalLM    attention_bias (q, k, v, o) and mlp_bias free
    mistral  MistralForCausalLM  no biases; a sliding window on every layer (v0.1: 4096; later: none)
    qwen2    Qwen2ForCausalLM    bias on q, k, v (never o or the MLP); window per layer, off in releases
    qwen3    Qwen3ForCausalLM    q/k RMSNorm over head_dim before RoPE; attention_bias (all four) free
"""
from __future__ import annotations

from dataclasses import dataclass, field

from longctx.base.errors import UserError


@dataclass(frozen=True)
class Family:
    architecture: str  # config.json's `architectures` entry
    fixed: dict = field(default_factory=dict)  # ModelConfig field -> the only value this family has
    defaults: dict = field(default_factory=dict)  # fields left None take these
    windowed: bool = False  # the family's config.json has a sliding window
    per_layer_window: bool = False  # ... set per layer (use_sliding_window, max_window_layers, layer_types)


_NO_WINDOW = {"sliding_window": None, "layer_types": None}
FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", fixed={"qkv_bias": False, "qk_norm": False, **_NO_WINDOW}),
    "mistral": Family("MistralForCausalLM", windowed=True,
                      fixed={"attention_bias": False, "mlp_bias": False, "qkv_bias": False, "qk_norm": False,
                             "layer_types": None}),
    "qwen2": Family("Qwen2ForCausalLM", windowed=True, per_layer_window=True, defaults={"qkv_bias": True},
                    fixed={"attention_bias": False, "mlp_bias": False, "qkv_bias": True, "qk_norm": False}),
    "qwen3": Family("Qwen3ForCausalLM", windowed=True, per_layer_window=True, defaults={"qk_norm": True},
                    fixed={"mlp_bias": False, "qkv_bias": False, "qk_norm": True}),
}
ARCHITECTURES = {f.architecture: name for name, f in FAMILIES.items()}


def family_defaults(model_type: str) -> dict:
    """Values for the optional fields a config leaves None (qkv_bias, qk_norm)."""
    base = {"qkv_bias": False, "qk_norm": False}
    return {**base, **FAMILIES[model_type].defaults}


def check_family(cfg, at) -> None:
    """UserError naming the first field whose value `cfg.model_type`'s transformers class cannot hold."""
    family = FAMILIES[cfg.model_type]
    for name, value in family.fixed.items():
        got = getattr(cfg, name)
        if got != value:
            raise UserError(f"{at(name)}: a {cfg.model_type} model ({family.architecture}) has {name}={_show(value)}; "
                            f"got {_show(got)}{_hint(cfg.model_type, name)}")


def _show(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def _hint(model_type: str, name: str) -> str:
    others = [m for m, f in FAMILIES.items() if m != model_type and name not in f.fixed]
    return f" (model_type {' or '.join(others)} allows it)" if others else ""
