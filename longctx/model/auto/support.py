"""Which decoders run through transformers' own class (the second model path), what longctx
handles for each, and what it refuses: torch-free, from config.json alone, before any work.

A model type runs here when its sequence mixing is all causal softmax attention that longctx
computes exactly under every context-parallel impl: full or sliding-window layers, logit
softcapping, attention sinks, any attention scaling, and the model's own output transform of the
logits. Mixture-of-experts models get their load-balancing loss on the whole sequence
(moe.py). Anything whose result depends on the local shard is refused in one line, and so is
every model type not tested here unless the user asks for it (`model.allow_untested`), which
first runs an exactness self-check (selfcheck.py).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from longctx.base.errors import UserError
from longctx.model.rope_parameters import ROPE_KEYS

SCALING_KEYS = frozenset().union(*ROPE_KEYS.values())  # what a stage's rope_parameters set

# model_type -> what the path handles for it (docs/models.md's table is made from this)
TESTED: dict[str, str] = {
    "gemma2": "sliding + full layers, attention and final-logit softcapping, query_pre_attn_scalar",
    "gemma3_text": "sliding + full layers with their own RoPE, q/k norms",
    "olmo2": "q/k norms over all heads, post-norms",
    "smollm3": "NoPE layers",
    "granite": "attention_multiplier scaling, logits_scaling",
    "glm4": "partial rotary, post-norms",
    "cohere2": "sliding + NoPE full layers, logit_scale, parallel block",
    "gpt_oss": "attention sinks, sliding + full layers, MoE with router bias",
    "mixtral": "MoE (top-2 of 8 in the originals)",
    "qwen3_moe": "MoE with q/k norms",
    "qwen2_moe": "MoE with a shared expert, per-layer sliding windows",
}
# model types the native path (longctx/model/llama.py) trains; they never take this path
NATIVE = ("llama", "mistral", "qwen2", "qwen3")
# sequence mixing that is not attention, or attention whose result depends on the local shard
_RECURRENT = {"linear_attention": "linear-attention layers (their recurrent state would restart on every cp rank)",
              "mamba": "Mamba layers (their recurrent state would restart on every cp rank)",
              "chunked_attention": "chunked attention (its chunks are counted from each shard's first token)"}
_LOCAL_ROPE = {"dynamic": "it picks its frequencies from the largest position in the local shard",
               "longrope": "it picks its short or long factors from the largest position in the local shard"}
ALLOW_FIELD = "model.allow_untested"


def tested_list() -> str:
    return ", ".join(TESTED)


def _rope_types(hf: dict) -> list[str]:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope and all(isinstance(v, dict) for v in rope.values()):  # per layer type (Gemma 3)
        return [v.get("rope_type", v.get("type", "default")) for v in rope.values()]
    return [rope.get("rope_type", rope.get("type", "default"))] if rope else ["default"]


def refusal(hf: dict, model_type: str) -> Optional[str]:
    """Why this config cannot be computed exactly under sharding, or None."""
    for kind in hf.get("layer_types") or []:
        if kind in _RECURRENT:
            return f"layer_types has {kind!r}: {_RECURRENT[kind]}"
    if hf.get("attention_chunk_size") or model_type.startswith("llama4"):
        return "Llama 4's chunked attention and NoPE temperature depend on the local sequence length"
    for rope in _rope_types(hf):
        if rope in _LOCAL_ROPE:
            return f"rope_type {rope!r} cannot be sharded exactly: {_LOCAL_ROPE[rope]}"
    if hf.get("is_decoder") is False or hf.get("is_causal") is False:
        return "non-causal attention"
    if float(hf.get("attention_dropout") or 0.0) > 0:
        return f"attention_dropout={hf['attention_dropout']} (> 0 is not computed: set it to 0)"
    return None


def _int(hf: dict, *names: str, default=None):
    for name in names:
        if hf.get(name) is not None:
            return hf[name]
    return default


@dataclass
class AutoModelSpec:
    """A transformers-class model's configuration as the rest of longctx reads it: the shape fields
    the planner and metrics use, the RoPE and maximum length a stage may change, and the whole
    config.json (`hf`) the model is built from."""

    model_type: str
    hf: dict = field(repr=False)
    vocab_size: int = 0
    hidden_size: int = 0
    intermediate_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    max_position_embeddings: int = 0
    rope_parameters: dict = field(default_factory=dict)
    tie_word_embeddings: bool = False
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    bos_token_id: Optional[int] = None
    eos_token_id: Any = None
    pad_token_id: Optional[int] = None
    path: str = "transformers"  # which model path builds it (the run's first lines say so)
    window_limit: Optional[int] = None  # windows are computed exactly: no length limit

    @classmethod
    def from_hf(cls, hf: dict, where: str = "config.json") -> "AutoModelSpec":
        model_type = hf.get("model_type")
        heads = _int(hf, "num_attention_heads")
        hidden = _int(hf, "hidden_size")
        if not model_type or not heads or not hidden:
            raise UserError(f"{where}: a decoder's config.json needs model_type, hidden_size and num_attention_heads")
        experts = _int(hf, "num_local_experts", "num_experts", default=0) or 0
        return cls(
            model_type=model_type, hf=copy.deepcopy(hf), vocab_size=hf.get("vocab_size", 0), hidden_size=hidden,
            intermediate_size=_int(hf, "intermediate_size", default=4 * hidden),
            num_hidden_layers=hf.get("num_hidden_layers", 0), num_attention_heads=heads,
            num_key_value_heads=_int(hf, "num_key_value_heads", default=heads),
            head_dim=_int(hf, "head_dim", default=hidden // heads),
            max_position_embeddings=hf.get("max_position_embeddings", 0),
            rope_parameters=_flat_rope(hf), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            num_experts=experts, experts_per_token=_int(hf, "num_experts_per_tok", default=0) or 0,
            moe_intermediate_size=_int(hf, "moe_intermediate_size", "intermediate_size", default=0) or 0,
            bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"))

    @property
    def rope_type(self) -> str:
        return self.rope_parameters.get("rope_type", "default")

    @property
    def active_intermediate_size(self) -> int:
        """The MLP width a token's activations have: its routed experts' (and a shared expert's)."""
        if not self.num_experts:
            return self.intermediate_size
        shared = self.hf.get("shared_expert_intermediate_size") or 0
        return self.experts_per_token * self.moe_intermediate_size + shared

    @property
    def sliding_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.hf.get("layer_types") or []) if t == "sliding_attention"]

    def replace(self, *, field_path: str = "model", **changes: Any) -> "AutoModelSpec":
        """A copy with `changes` (rope_parameters, max_position_embeddings, or any config.json key
        from model.overrides), written into `hf` too."""
        hf = copy.deepcopy(self.hf)
        for key, value in changes.items():
            if key == "rope_parameters":
                _set_rope(hf, value)
            else:
                hf[key] = value
        return dataclasses.replace(AutoModelSpec.from_hf(hf, where=field_path), path=self.path)

    def to_dict(self) -> dict:
        return {"model_type": self.model_type, "path": self.path, "config": self.hf}


def _flat_rope(hf: dict) -> dict:
    """The RoPE a stage extends: the flat rope_parameters, or Gemma 3's full-attention layers' own."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope and all(isinstance(v, dict) for v in rope.values()):
        rope = rope.get("full_attention", next(iter(rope.values())))
    rope = dict(rope)
    if "rope_theta" not in rope and hf.get("rope_theta") is not None:
        rope["rope_theta"] = hf["rope_theta"]
    rope.setdefault("rope_type", rope.pop("type", "default"))
    return rope


def _set_rope(hf: dict, rope: dict) -> None:
    """Write a stage's RoPE (`rope`) into config.json `hf`. The stage sets the RoPE type and its
    scaling fields; every other field of the model's rope_parameters (partial_rotary_factor, and
    any a model type keeps there) stays, and so do the sliding layers' own RoPE (Gemma 3)."""
    current = hf.get("rope_parameters")
    per_layer = bool(current) and all(isinstance(v, dict) for v in current.values())
    old = (current.get("full_attention", {}) if per_layer else current) or {}
    kept = {k: v for k, v in old.items() if k not in SCALING_KEYS}
    if hf.get("partial_rotary_factor") is not None:  # a config.json written before rope_parameters held it
        kept.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    merged = {**kept, **rope}
    if per_layer:
        current["full_attention"] = merged
    else:
        hf["rope_parameters"] = merged
    hf.pop("rope_scaling", None)


def check_supported(hf: dict, where: str, allow_untested: bool = False) -> AutoModelSpec:
    """The spec of a config.json this path runs; UserError (one line) for what it refuses."""
    model_type = hf.get("model_type") or "?"
    why = refusal(hf, model_type)
    if why is not None:
        raise UserError(f"{where}: model_type {model_type!r} cannot run under longctx's exact context parallelism: "
                        f"{why}")
    if model_type not in TESTED and not allow_untested:
        arch = ", ".join(hf.get("architectures") or []) or "no architectures"
        raise UserError(f"{where}: model_type {model_type!r} ({arch}) has not been tested on longctx's transformers "
                        f"path; tested: {tested_list()} (native: {', '.join(NATIVE)}); set {ALLOW_FIELD}=true to run "
                        "it after an exactness self-check")
    return AutoModelSpec.from_hf(hf, where)
