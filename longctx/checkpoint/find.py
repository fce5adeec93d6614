"""Find and load a model from any directory a user may point at.

Accepted: an HF Llama directory (config.json + weights), a training checkpoint directory (its
`model/` HF folder, or without one its ZeRO shards in `ds/`, consolidated by
checkpoint/model.py), or a run directory (its newest complete checkpoint, or `hf/` when that
export is at least as new or there is no checkpoint). A training checkpoint counts only with its
COMPLETE marker and when the files read match its manifest (sizes and SHA-256); otherwise the
error names the checkpoint and file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from longctx.attention import AttentionFn, sdpa_attention
from longctx.base.errors import UserError
from longctx.checkpoint import manifest
from longctx.checkpoint.adapter_source import refuse_adapter_dir
from longctx.checkpoint.manifest import COMPLETE
from longctx.checkpoint.model import CheckpointModel, has_export, load_consolidated, recorded_model, trained_model
from longctx.model.auto.support import AutoModelSpec
from longctx.model.hf import load_pretrained
from longctx.model.hf_config import read_checkpoint_or_model_config
from longctx.model.llama import Transformer
from longctx.storage.hub import MODEL_FILES, hub_or_local

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def is_checkpoint(path: Path) -> bool:
    return path.name.startswith("step_") and ((path / "ds").is_dir() or (path / "trainer_state.json").is_file())


def is_ds_only_checkpoint(path: Path) -> bool:
    """A training checkpoint whose weights are only in ds/ (resolve_model_dir returns these)."""
    return is_checkpoint(path) and not has_export(path)


def _verified(ckpt: Path) -> Path:
    """The model/ of a complete checkpoint, or the checkpoint itself when it has no model/;
    the files read (model/, else every file) match the manifest."""
    if not (ckpt / COMPLETE).is_file():
        raise UserError(f"{ckpt}: not a complete checkpoint (no {COMPLETE} marker: its save did not finish); "
                        "use another checkpoint")
    export = has_export(ckpt)
    problem = manifest.verify(ckpt, under="model" if export else None)
    if problem:
        raise UserError(f"{ckpt}: {problem}; use another checkpoint")
    return ckpt / "model" if export else ckpt


def _in_run(run: Path) -> Optional[Path]:
    """A run directory's model: its newest complete checkpoint, or hf/ when that export was
    written after it (the end of a run) or there is no checkpoint."""
    ckpts = run / "checkpoints"
    complete = sorted(d for d in ckpts.iterdir() if is_checkpoint(d) and (d / COMPLETE).is_file()) \
        if ckpts.is_dir() else []
    hf = run / "hf" / "config.json"
    if hf.is_file() and (not complete or hf.stat().st_mtime >= (complete[-1] / COMPLETE).stat().st_mtime):
        return hf.parent
    return _verified(complete[-1]) if complete else None


def resolve_model_dir(path: str | Path, revision: Optional[str] = None, field: str = "eval.model",
                      revision_field: str = "eval.revision") -> Path:
    """An HF directory, or a verified checkpoint without model/ (load it with load_model_dir);
    a Hub id ("org/name", not a path here) is its snapshot in the HF cache, downloaded if need be."""
    path = Path(hub_or_local(str(path), field, MODEL_FILES, revision=revision, revision_field=revision_field) or path)
    if not path.exists():
        raise UserError(f"{path}: model path does not exist")
    if not path.is_dir():
        raise UserError(f"{path}: expected a directory (HF model, checkpoint or run directory)")
    refuse_adapter_dir(path, field)
    if (path / "config.json").is_file():
        if path.name == "model" and is_checkpoint(path.parent):  # model/ of a training checkpoint
            return _verified(path.parent)
        return path
    if has_export(path) or is_checkpoint(path):
        return _verified(path)
    found = _in_run(path)
    if found is not None:
        return found
    raise UserError(f"{path}: no config.json here, nor a training checkpoint (model/ or ds/) or a run directory "
                    "(checkpoints/, hf/)")


def checkpoint_model(ckpt: Path) -> CheckpointModel:
    """The recorded model of a checkpoint without model/, or a UserError that says what reads it."""
    recorded = recorded_model(ckpt)
    if recorded is None:
        raise UserError(f"{ckpt}: no model/ export and no model config in trainer_state.json (written before longctx "
                        f"recorded it); `longctx export --checkpoint {ckpt} --out DIR` and `longctx eval` read it with "
                        "its run's resolved_config.yaml")
    return recorded


def load_model_dir(model_dir: Path, dtype: Optional[torch.dtype] = None, attn_fn: Optional[AttentionFn] = None,
                   recorded: Optional[CheckpointModel] = None, **kwargs) -> Transformer:
    """Load what resolve_model_dir returned. A checkpoint without model/ loads in its training
    dtype unless `dtype` is given (as its model/ export would have held it); `recorded`
    replaces what its trainer_state.json records."""
    if is_ds_only_checkpoint(model_dir):
        recorded = recorded or checkpoint_model(model_dir)
        return load_consolidated(model_dir, recorded.config, dtype=dtype or recorded.dtype, attn_fn=attn_fn, **kwargs)
    config = kwargs.pop("config", None) or read_checkpoint_or_model_config(model_dir)
    if isinstance(config, AutoModelSpec):  # transformers' own class with longctx's attention
        from longctx.model.auto.model import load_auto_model

        return load_auto_model(model_dir, config, dtype=dtype, attn_fn=attn_fn or sdpa_attention, **kwargs)
    return load_pretrained(model_dir, dtype=dtype, attn_fn=attn_fn, config=config, **kwargs)


def load_any(path: str | Path, dtype: Optional[torch.dtype] = None, **kwargs) -> Transformer:
    return load_model_dir(resolve_model_dir(path), dtype=dtype, **kwargs)


def tokenizer_spec_for(model_dir: Path, spec: Optional[str], field: str = "eval.tokenizer") -> str:
    """--tokenizer wins; else a checkpoint's recorded tokenizer (one without model/); else a
    "longctx_tokenizer" entry of config.json (how exports record "byte", which ByteTokenizer
    reads exactly); else the model directory's own tokenizer files. `field` names the option in
    the error."""
    if spec:
        return spec
    if is_ds_only_checkpoint(model_dir):
        recorded = trained_model(model_dir).tokenizer
        if recorded:
            return recorded
    cfg = model_dir / "config.json"
    if cfg.is_file():
        try:
            recorded = json.loads(cfg.read_text()).get("longctx_tokenizer")
        except json.JSONDecodeError:
            recorded = None
        if recorded:
            return str(recorded)
    for d in (model_dir, model_dir.parent):
        if any((d / f).is_file() for f in TOKENIZER_FILES):
            return str(d)
    raise UserError(f"{field}: {model_dir} has no tokenizer files; pass --tokenizer "
                    "(\"byte\", a tokenizer.json or a tokenizer directory)")
