"""Model configuration: one dataclass with Hugging Face field names, plus presets.

The families (Llama, Mistral, Qwen2/Qwen2.5, Qwen3) are one model with a few fields set
differently, not subclasses (longctx/model/families.py says which fields each family fixes)."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import Any, Optional

from longctx.base.errors import UserError
from longctx.model.auto import presets as auto_presets
from longctx.model.families import FAMILIES, check_family, family_defaults
from longctx.model.rope_parameters import normalize_rope_parameters

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class ModelConfig:
    model_type: str = "llama"  # the family: llama | mistral | qwen2 | qwen3 (what an export writes)
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
    attention_bias: bool = False  # bias on q, k, v and o (HF Llama's and Qwen3's meaning)
    mlp_bias: bool = False
    qkv_bias: Optional[bool] = None  # bias on q, k and v only (Qwen2); None: the family's
    qk_norm: Optional[bool] = None  # RMSNorm over head_dim on q and k before RoPE (Qwen3); None: the family's
    # attention to the last `sliding_window` keys (the token itself included) on the layers that
    # layer_types marks "sliding_attention" (None: all of them); None: full attention everywhere.
    # longctx computes full attention only: a window shorter than a sequence is refused (window_limit)
    sliding_window: Optional[int] = None
    layer_types: Optional[list] = None
    initializer_range: float = 0.02
    bos_token_id: Optional[int] = 1
    eos_token_id: Optional[int] = 2
    pad_token_id: Optional[int] = None

    # where the fields come from, for the error messages: "model" (a training config's section),
    # "eval.model_overrides", or "" (a config.json, whose path the reader puts in front)
    field_path: InitVar[str] = "model"

    def __post_init__(self, field_path: str) -> None:
        def at(name: str) -> str:
            return f"{field_path}.{name}" if field_path else name

        if self.model_type not in FAMILIES:
            raise UserError(f"{at('model_type')}: unknown {self.model_type!r}; valid: {', '.join(FAMILIES)}")
        for name, value in family_defaults(self.model_type).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.num_attention_heads > 0:
                self.head_dim = self.hidden_size // self.num_attention_heads
        self._validate(at)

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
        self._validate_window(at)
        check_family(self, at)
        self.rope_parameters = normalize_rope_parameters(
            self.rope_parameters, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, where=at("rope_parameters"),
        )

    def _validate_window(self, at) -> None:
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
            raise UserError(f"{at('sliding_window')}: must be a positive integer or null (full attention), "
                            f"got {window!r}")
        if self.layer_types is not None:
            types = list(self.layer_types)
            if len(types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
                raise UserError(f"{at('layer_types')}: must list one of {', '.join(LAYER_TYPES)} for each of the "
                                f"{self.num_hidden_layers} layers, got {types!r}")
            self.layer_types = types

    @property
    def sliding_layers(self) -> list[int]:
        """The layers whose attention is limited to the window (none without a window)."""
        if self.sliding_window is None:
            return []
        if self.layer_types is None:
            return list(range(self.num_hidden_layers))
        return [i for i, t in enumerate(self.layer_types) if t == "sliding_attention"]

    @property
    def window_limit(self) -> Optional[int]:
        """The longest span of positions (a document, or a sequence with its cache) over which this
        model is full attention, which is all longctx computes: the sliding window where a layer
        slides, else None (no limit). transformers' window keeps W keys including the token itself,
        so a sequence of W tokens sees no difference."""
        return self.sliding_window if self.sliding_layers else None

    @property
    def rope_type(self) -> str:
        return self.rope_parameters["rope_type"]

    def replace(self, *, field_path: str = "model", **changes: Any) -> "ModelConfig":
        """A copy with `changes`, validated; errors name `field_path`.<field>."""
        return dataclasses.replace(copy.deepcopy(self), field_path=field_path, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_window(model_cfg: ModelConfig, length: int, length_field: str, turn_off: str) -> None:
    """UserError when the model's sliding window is shorter than the sequences it would run on:
    longctx computes full attention only (every kernel and cp impl), which equals the window's
    only up to the window's length."""
    window = model_cfg.window_limit
    if window is not None and window < length:
        raise UserError(f"sliding_window: the model's window is {window} tokens, shorter than {length_field} {length}; "
                        f"longctx trains and evaluates full attention only: set {turn_off} to run this model "
                        f"with full attention (its export then has no window), or keep sequences to {window} tokens")


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


def _qwen25_7b() -> ModelConfig:
    """Qwen/Qwen2.5-7B: 28 query / 4 kv heads, q/k/v biases; 32k native (128k with YaRN x4 per its
    card); the released config's window is off (use_sliding_window false)."""
    return ModelConfig(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=151643, eos_token_id=151643, pad_token_id=None,
    )


def _qwen25_05b() -> ModelConfig:
    """Qwen/Qwen2.5-0.5B: 14 query / 2 kv heads, tied embeddings."""
    return _qwen25_7b().replace(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)


def _qwen3_8b() -> ModelConfig:
    """Qwen/Qwen3-8B: q/k norms, head_dim 128, 32 query / 8 kv heads; config.json says 40,960
    positions, its card 32k native (128k with YaRN x4 from 32,768)."""
    return ModelConfig(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=151643, eos_token_id=151645, pad_token_id=None,
    )


def _qwen3_06b() -> ModelConfig:
    """Qwen/Qwen3-0.6B: head_dim 128 over a 1024 hidden size (16 heads), tied embeddings."""
    return _qwen3_8b().replace(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True)


def _mistral_7b_v03() -> ModelConfig:
    """mistralai/Mistral-7B-v0.3: Llama's shape with 32k positions, rope_theta 1e6, no window."""
    return ModelConfig(
        model_type="mistral", vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, bos_token_id=1, eos_token_id=2,
    )


def _debug_tiny(**family) -> ModelConfig:
    """Tests: tiny, GQA 2:1, vocab large enough for the byte tokenizer."""
    return ModelConfig(
        vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=None, **family,
    )


PRESETS = {
    "debug-tiny": _debug_tiny,
    # the same shapes in the other families (CPU recipes and tests)
    "debug-tiny-qwen2": lambda: _debug_tiny(model_type="qwen2"),
    "debug-tiny-qwen3": lambda: _debug_tiny(model_type="qwen3", head_dim=24),
    "debug-tiny-mistral": lambda: _debug_tiny(model_type="mistral"),
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
    "qwen2.5-0.5b": _qwen25_05b,
    "qwen2.5-7b": _qwen25_7b,
    "qwen3-0.6b": _qwen3_06b,
    "qwen3-8b": _qwen3_8b,
    "mistral-7b-v0.3": _mistral_7b_v03,
    # transformers-path models (longctx/model/auto/): their config.json as an AutoModelSpec
    "qwen3-30b-a3b": auto_presets.qwen3_30b_a3b,
    "debug-tiny-qwen3-moe": auto_presets.debug_tiny_qwen3_moe,
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise UserError(f"model.preset: unknown preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    cfg = PRESETS[name]()
    return cfg.replace(**overrides) if overrides else cfg
