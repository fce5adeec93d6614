"""The plain LLaMA model, its configuration, RoPE family, cache, generation and HF interop."""
from longctx.base.lazy_exports import exported_names, lazy_exports

_EXPORTS = {
    "cache": ["KVCache"],
    "config": ["PRESETS", "ModelConfig", "get_preset"],
    "llama": ["Transformer", "build_model", "count_parameters"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = exported_names(_EXPORTS)
