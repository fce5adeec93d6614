"""longctx: extend LLaMA-style models to long context."""
__version__ = "0.1.0"

from longctx.errors import UserError
from longctx.model.hf import save_pretrained  # writes a Hugging Face Llama directory that transformers loads
from longctx.model.loading import load_any


def load_pretrained(path, dtype=None, attn_fn=None):
    """Load a Hugging Face Llama directory, a longctx export, a training checkpoint (its
    verified model/) or a run directory (its newest checkpoint, else hf/) as a longctx model."""
    return load_any(path, dtype=dtype, attn_fn=attn_fn)


__all__ = ["UserError", "load_pretrained", "save_pretrained", "__version__"]
