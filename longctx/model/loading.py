"""Find and load a model from any directory a user may point at.

Accepted: an HF Llama directory (config.json + weights), a training checkpoint directory
(`model/` HF folder inside), or a run directory (newest complete checkpoint, or its `hf/`).
A training checkpoint counts only with its COMPLETE marker and when the files of `model/`
match its manifest (sizes and SHA-256); otherwise the error names the checkpoint and file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from longctx.errors import UserError
from longctx.model.hf import load_pretrained
from longctx import manifest
from longctx.manifest import COMPLETE


def is_checkpoint(path: Path) -> bool:
    return path.name.startswith("step_") and ((path / "ds").is_dir() or (path / "trainer_state.json").is_file())


def _verified_model_dir(ckpt: Path) -> Path:
    if not (ckpt / COMPLETE).is_file():
        raise UserError(f"{ckpt}: not a complete checkpoint (no {COMPLETE} marker: its save did not finish); "
                        "use another checkpoint")
    problem = manifest.verify(ckpt, under="model")
    if problem:
        raise UserError(f"{ckpt}: {problem}; use another checkpoint")
    return ckpt / "model"


def resolve_model_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: model path does not exist")
    if not path.is_dir():
        raise UserError(f"{path}: expected a directory (HF model, checkpoint or run directory)")
    if (path / "config.json").is_file():
        if path.name == "model" and is_checkpoint(path.parent):  # model/ of a training checkpoint
            return _verified_model_dir(path.parent)
        return path
    if (path / "model" / "config.json").is_file() or is_checkpoint(path):
        return _verified_model_dir(path)
    ckpts = path / "checkpoints"
    if ckpts.is_dir():
        complete = sorted(d for d in ckpts.iterdir() if (d / COMPLETE).is_file() and (d / "model" / "config.json").is_file())
        if complete:
            return _verified_model_dir(complete[-1])
    if (path / "hf" / "config.json").is_file():
        return path / "hf"
    raise UserError(f"{path}: no config.json here, nor a checkpoint (model/config.json) or run directory (checkpoints/, hf/)")


def load_any(path: str | Path, dtype: Optional[torch.dtype] = None, **kwargs):
    return load_pretrained(resolve_model_dir(path), dtype=dtype, **kwargs)
