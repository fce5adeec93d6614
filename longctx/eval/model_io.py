"""Finding the model and tokenizer to evaluate, and checking they belong together."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Optional

import torch

from longctx.base.errors import UserError

# which model and tokenizer a directory holds (an HF directory, a checkpoint, a run): one place
from longctx.checkpoint.find import is_ds_only_checkpoint, load_model_dir, resolve_model_dir, tokenizer_spec_for
from longctx.checkpoint.model import trained_model
from longctx.data.tokenizer import load_tokenizer
from longctx.eval import sequence_rope
from longctx.eval.dtypes import TORCH_NAMES, check_dtype_name
from longctx.eval.fields import TOKENIZER_FIELD
from longctx.model.config import ModelConfig

__all__ = ["DTYPES", "check_lengths", "check_pair", "eval_device", "load_model", "load_tokenizer_for", "parse_dtype",
           "resolve_model_dir", "tokenizer_spec_for", "trained_model", "is_ds_only_checkpoint"]

DTYPES = {name: getattr(torch, torch_name) for name, torch_name in TORCH_NAMES.items()}


def parse_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    check_dtype_name(name)
    return None if name is None or name == "auto" else DTYPES[name]


def eval_device(name: str, local_rank: int) -> torch.device:
    """Where a rank evaluates: eval.device cpu or cuda, or auto: this rank's GPU (by its local
    rank) when CUDA is available, else the CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def load_model(model_dir: Path, dtype: Optional[torch.dtype] = None, config: Optional[ModelConfig] = None, **kwargs):
    """Load what resolve_model_dir returned (a checkpoint without model/: its ds/ consolidated);
    `config` replaces the stored configuration (model_overrides.apply_overrides: same shapes).
    RoPE that depends on the length is computed per sequence (eval/sequence_rope.py)."""
    recorded = trained_model(model_dir) if is_ds_only_checkpoint(model_dir) else None
    if recorded is not None and config is not None:
        recorded = dataclasses.replace(recorded, config=config)
    elif config is not None:
        kwargs["config"] = config
    model = load_model_dir(model_dir, dtype=dtype, recorded=recorded, **kwargs)
    sequence_rope.install(model)
    return model


def load_tokenizer_for(model_dir: Path, spec: Optional[str]):
    return load_tokenizer(tokenizer_spec_for(model_dir, spec), field=TOKENIZER_FIELD)


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
