"""longctx: extend LLaMA-style language models to long context.

`import longctx` is light: the model code (and torch) loads on first use of
`load_pretrained` / `save_pretrained`, so `longctx --help` starts fast.
"""
__version__ = "0.1.0"

from longctx.base.errors import UserError


def load_pretrained(path, dtype=None, attn_fn=None):
    """Load a Hugging Face Llama directory, a longctx export, a training checkpoint (its
    verified model/, else its consolidated ZeRO shards) or a run directory (its newest
    checkpoint, else hf/) as a longctx model."""
    from longctx.checkpoint.find import load_any  # torch and the model: loaded on use, not on `import longctx`

    return load_any(path, dtype=dtype, attn_fn=attn_fn)


def save_pretrained(model, path, tokenizer=None, **kwargs):
    """Write `model` as a Hugging Face Llama directory that transformers loads; `tokenizer`
    ("byte", a tokenizer.json, a tokenizer directory or a hub id) travels with it."""
    from longctx.data.hf_tokenizer import TokenizerFiles  # see load_pretrained
    from longctx.model.hf import save_pretrained as save

    files = TokenizerFiles(tokenizer) if isinstance(tokenizer, str) else tokenizer
    return save(model, path, tokenizer=files, **kwargs)


__all__ = ["UserError", "load_pretrained", "save_pretrained", "__version__"]
