"""The second model path: any decoder transformers has, as transformers' own class with
longctx's exact attention (support.py says which, and why others are refused)."""
from longctx.base.lazy_exports import exported_names, lazy_exports

_EXPORTS = {
    "support": ["AutoModelSpec", "TESTED", "check_supported", "refusal"],
    "model": ["AutoCausalLM", "build_auto_model", "load_auto_model"],
    "attention": ["ATTENTION_NAME", "register_attention"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = exported_names(_EXPORTS)
