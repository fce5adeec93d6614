"""Find and load a model from any directory a user may point at.

Accepted: an HF Llama directory (config.json + weights), a training checkpoint directory
(`model/` HF folder inside), or a run directory (newest complete checkpoint, or its `hf/`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from longctx.errors import UserError
from longctx.model.hf import load_pretrained


def resolve_model_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: model path does not exist")
    if not path.is_dir():
        raise UserError(f"{path}: expected a directory (HF model, checkpoint or run directory)")
    if (path / "config.json").is_file():
        return path
    if (path / "model" / "config.json").is_file():  # a training checkpoint
        return path / "model"
    ckpts = path / "checkpoints"
    if ckpts.is_dir():
        complete = sorted(d for d in ckpts.iterdir() if (d / "COMPLETE").is_file() and (d / "model" / "config.json").is_file())
        if complete:
            return complete[-1] / "model"
    if (path / "hf" / "config.json").is_file():
        return path / "hf"
    raise UserError(f"{path}: no config.json here, nor a checkpoint (model/config.json) or run directory (checkpoints/, hf/)")


def load_any(path: str | Path, dtype: Optional[torch.dtype] = None, **kwargs):
    return load_pretrained(resolve_model_dir(path), dtype=dtype, **kwargs)
