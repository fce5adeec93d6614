"""The plain LLaMA model, its configuration, RoPE family, cache, generation and HF interop."""
from longctx.model.cache import KVCache
from longctx.model.config import PRESETS, ModelConfig, get_preset
from longctx.model.llama import Transformer, build_model, count_parameters

__all__ = ["KVCache", "ModelConfig", "PRESETS", "Transformer", "build_model", "count_parameters", "get_preset"]
