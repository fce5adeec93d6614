"""Finding the model and tokenizer to evaluate, and checking they belong together."""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Optional

import torch

from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.data.tokenizer import load_tokenizer
from longctx.errors import UserError
from longctx.eval import sequence_rope
from longctx.eval.dtypes import TORCH_NAMES, check_dtype_name
from longctx.eval.fields import TOKENIZER_FIELD
from longctx.model.config import ModelConfig
from longctx.model.consolidate import CheckpointModel, recorded_model, trainer_state

# resolve_model_dir: an HF directory, or a training checkpoint whose weights are only in ds/
from longctx.model.loading import is_ds_only_checkpoint, load_model_dir, resolve_model_dir

__all__ = ["DTYPES", "check_lengths", "check_pair", "eval_device", "load_model", "load_tokenizer_for", "parse_dtype",
           "resolve_model_dir", "tokenizer_spec_for", "trained_model", "is_ds_only_checkpoint"]

DTYPES = {name: getattr(torch, torch_name) for name, torch_name in TORCH_NAMES.items()}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def parse_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    check_dtype_name(name)
    return None if name is None or name == "auto" else DTYPES[name]


def eval_device(name: str, local_rank: int) -> torch.device:
    """Where a rank evaluates: eval.device cpu or cuda, or auto: this rank's GPU (by its local
    rank) when CUDA is available, else the CPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def _stage_trained(state: dict) -> int:
    """The index of the stage whose weights a checkpoint holds (a save at a stage's end has
    already moved "stage" on to the next one)."""
    if "data_stage" in state:
        return int(state["data_stage"])
    stage = int(state.get("stage", 0))
    return stage - 1 if stage > 0 and int(state.get("stage_step", 0)) == 0 else stage


def _from_run_config(ckpt: Path) -> CheckpointModel:
    """A checkpoint that records no model (written before the trainer recorded it): the model of
    the stage it trained, from its run's resolved_config.yaml."""
    resolved = ckpt.parent.parent / "resolved_config.yaml"
    if ckpt.parent.name != "checkpoints" or not resolved.is_file():
        raise UserError(f"{ckpt}: no model/ export and no model config in trainer_state.json (written before longctx "
                        f"recorded it), and no run directory with a resolved_config.yaml around it; put it back at "
                        "<its run>/checkpoints/")
    cfg = load_config(str(resolved))
    stages = resolve_stages(cfg)
    stage = stages[min(_stage_trained(trainer_state(ckpt)), len(stages) - 1)]
    return CheckpointModel(stage_model_config(stage), cfg.data.tokenizer, getattr(torch, cfg.train.dtype))


def trained_model(ckpt: Path) -> CheckpointModel:
    """Config, tokenizer and training dtype of a checkpoint without model/: as recorded in its
    trainer_state.json, else from its run's resolved_config.yaml."""
    return recorded_model(ckpt) or _from_run_config(ckpt)


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


def tokenizer_spec_for(model_dir: Path, spec: Optional[str]) -> str:
    """--tokenizer wins; else a checkpoint's recorded tokenizer (one without model/); else a
    "longctx_tokenizer" entry of config.json (how exports record "byte", which ByteTokenizer
    reads exactly); else the model directory's own tokenizer files."""
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
        if any((d / f).is_file() for f in _TOKENIZER_FILES):
            return str(d)
    raise UserError(f"{TOKENIZER_FIELD}: {model_dir} has no tokenizer files; pass --tokenizer "
                    "(\"byte\", a tokenizer.json or a tokenizer directory)")


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
