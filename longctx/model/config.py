"""Model configuration: one dataclass with Hugging Face Llama field names, plus presets."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import Any, Optional

from longctx.errors import UserError
from longctx.model.rope_parameters import normalize_rope_parameters


@dataclass
class ModelConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: Optional[int] = None  # None = MHA
    head_dim: Optional[int] = None  # None = hidden_size // num_attention_heads
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    bos_token_id: Optional[int] = 1
    eos_token_id: Optional[int] = 2
    pad_token_id: Optional[int] = None

    # where the fields come from, for the error messages: "model" (a training config's section),
    # "eval.model_overrides", or "" (a config.json, whose path the reader puts in front)
    field_path: InitVar[str] = "model"

    def __post_init__(self, field_path: str) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.num_attention_heads > 0:
                self.head_dim = self.hidden_size // self.num_attention_heads
        self._validate(lambda name: f"{field_path}.{name}" if field_path else name)

    def _validate(self, at) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"{at(name)}: must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise UserError(
                f"{at('num_key_value_heads')}: {self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.head_dim % 2 != 0:
            raise UserError(f"{at('head_dim')}: must be even for RoPE, got {self.head_dim}")
        if not (self.rms_norm_eps > 0):
            raise UserError(f"{at('rms_norm_eps')}: must be > 0, got {self.rms_norm_eps}")
        self.rope_parameters = normalize_rope_parameters(
            self.rope_parameters, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, where=at("rope_parameters"),
        )

    @property
    def rope_type(self) -> str:
        return self.rope_parameters["rope_type"]

    def replace(self, *, field_path: str = "model", **changes: Any) -> "ModelConfig":
        """A copy with `changes`, validated; errors name `field_path`.<field>."""
        return dataclasses.replace(copy.deepcopy(self), field_path=field_path, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _llama2_7b() -> ModelConfig:
    return ModelConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def _llama3_8b() -> ModelConfig:
    return ModelConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=128000, eos_token_id=128001,
    )


def _llama31_8b() -> ModelConfig:
    cfg = _llama3_8b()
    return cfg.replace(
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        },
    )


def _smollm2_135m() -> ModelConfig:
    """HuggingFaceTB/SmolLM2-135M(-Instruct): 30 narrow layers, 9 query / 3 kv heads, tied
    embeddings, an 8k context with rope_theta 1e5."""
    return ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


PRESETS = {
    # Tests: tiny, GQA 2:1, vocab large enough for the byte tokenizer.
    "debug-tiny": lambda: ModelConfig(
        vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=None,
    ),
    # The CPU benchmark model (~44M parameters with its 32k vocabulary).
    "bench-44m": lambda: ModelConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    "llama2-7b": _llama2_7b,
    "llama3-8b": _llama3_8b,
    "llama3.1-8b": _llama31_8b,
    "smollm2-135m": _smollm2_135m,
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise UserError(f"model.preset: unknown preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    cfg = PRESETS[name]()
    return cfg.replace(**overrides) if overrides else cfg
