"""Finding the model and tokenizer to evaluate, and checking they belong together."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Optional

import torch

from longctx.data.tokenizer import load_tokenizer
from longctx.errors import UserError
from longctx.model.loading import resolve_model_dir  # an HF directory, a training checkpoint or a run directory

__all__ = ["DTYPES", "check_lengths", "check_pair", "load_tokenizer_for", "parse_dtype", "resolve_model_dir",
           "tokenizer_spec_for"]

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def parse_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    if name is None or name == "auto":
        return None
    if name not in DTYPES:
        raise UserError(f"eval.dtype: {name!r} is not a dtype; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def tokenizer_spec_for(model_dir: Path, spec: Optional[str]) -> str:
    """--tokenizer wins; else the model directory's own tokenizer files; else a
    "longctx_tokenizer" entry of its config.json (how our exports record "byte")."""
    if spec:
        return spec
    for d in (model_dir, model_dir.parent):
        if any((d / f).is_file() for f in _TOKENIZER_FILES):
            return str(d)
    cfg = model_dir / "config.json"
    if cfg.is_file():
        try:
            recorded = json.loads(cfg.read_text()).get("longctx_tokenizer")
        except json.JSONDecodeError:
            recorded = None
        if recorded:
            return str(recorded)
    raise UserError(f"eval.tokenizer: {model_dir} has no tokenizer files; pass --tokenizer "
                    "(\"byte\", a tokenizer.json or a tokenizer directory)")


def load_tokenizer_for(model_dir: Path, spec: Optional[str]):
    return load_tokenizer(tokenizer_spec_for(model_dir, spec))


def check_pair(tokenizer, config) -> None:
    """UserError when the tokenizer can emit ids the model's embedding does not have."""
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(
            f"eval.tokenizer: {getattr(tokenizer, 'name', 'tokenizer')} has vocab_size {tokenizer.vocab_size} but the "
            f"model's vocab_size is {config.vocab_size}; use the model's own tokenizer")


def check_lengths(lengths, config, strict: bool) -> list[str]:
    """Lengths beyond max_position_embeddings: a warning (the point of an extension study), or
    a UserError with strict=True. Returns the warning lines."""
    limit = config.max_position_embeddings
    over = [L for L in lengths if L > limit]
    if not over:
        return []
    msg = (f"eval.lengths: {', '.join(map(str, over))} exceed the model's max_position_embeddings={limit}")
    if strict:
        raise UserError(msg + " (drop them, or leave out --strict-lengths to evaluate beyond the configured maximum)")
    warnings.warn(msg + "; evaluating anyway (extrapolation)", stacklevel=2)
    return [msg]
