"""The model of a training checkpoint that has no `model/` export (checkpoint.save_hf=false, the
CPU recipes' setting): its weights consolidated from the DeepSpeed files in `ds/`, its
architecture and tokenizer from what the trainer records in `trainer_state.json`.

    recorded = recorded_model(ckpt)                    # .config .tokenizer .dtype; None if not recorded
    trained = trained_model(ckpt)                      # the same, else from its run's resolved_config.yaml
    state = ds_state_dict(ckpt)                        # {name: tensor}, the model's own names
    model = load_consolidated(ckpt, recorded.config)   # a Transformer

Weights: with ZeRO optimizer partitions (stages 1-3) the fp32 master weights, consolidated
in this process as DeepSpeed's own zero_to_fp32.py does; at ZeRO-0 the module's weights
DeepSpeed saved (in the training dtype; in an fp32 run they are the optimizer's weights).
An adapter run's weights come out merged (each LoRA update folded into its module's weight).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch

from longctx.attention import AttentionFn, sdpa_attention
from longctx.base.errors import UserError
from longctx.checkpoint.adapter_base import with_base
from longctx.checkpoint.adapter_record import RECORD as ADAPTER_RECORD
from longctx.checkpoint.peft_export import merged_state_dict
from longctx.checkpoint.safe_load import check_files, load_checkpoint_file
from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.model.auto.support import AutoModelSpec
from longctx.model.config import ModelConfig
from longctx.model.hf_config import config_from_hf, config_to_hf
from longctx.model.llama import Transformer

RECORD_CONFIG = "model_config"  # trainer_state.json: the model's config.json ("dtype": the training dtype)
RECORD_TOKENIZER = "tokenizer"  # trainer_state.json: data.tokenizer ("byte", an absolute path or a hub id)
ZERO0_STATES = "mp_rank_00_model_states.pt"  # ds/ at ZeRO 0-2: the full module (ZeRO-3 partitions it)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_record(config: ModelConfig, dtype: torch.dtype, tokenizer: str) -> dict:
    """What the trainer adds to each checkpoint's trainer_state.json so the checkpoint alone
    says which model it holds (a run's resolved_config.yaml changes when a resumed run changes
    its config, and a relative tokenizer path depends on the directory a job ran in)."""
    spec = (os.path.abspath(os.path.expanduser(tokenizer)) if os.path.exists(os.path.expanduser(tokenizer))
            else tokenizer)
    return {RECORD_CONFIG: config_to_hf(config, dtype), RECORD_TOKENIZER: spec}


def has_export(ckpt: Path) -> bool:
    return (ckpt / "model" / "config.json").is_file()


def trainer_state(ckpt: Path) -> dict:
    path = ckpt / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: unreadable ({e})") from None
    if not isinstance(state, dict):
        raise UserError(f"{path}: not a longctx trainer state")
    return state


@dataclass
class CheckpointModel:
    """Which model a checkpoint holds: its config, tokenizer spec and training dtype."""

    config: ModelConfig
    tokenizer: Optional[str]
    dtype: torch.dtype


def recorded_model(ckpt: Path) -> Optional[CheckpointModel]:
    """The model as the trainer recorded it in trainer_state.json; None for a checkpoint
    written before the trainer recorded it."""
    state = trainer_state(ckpt)
    hf = state.get(RECORD_CONFIG)
    if not isinstance(hf, dict):
        return None
    config = config_from_hf(hf, where=f"{ckpt / 'trainer_state.json'} ({RECORD_CONFIG})", any_decoder=True)
    return CheckpointModel(config, state.get(RECORD_TOKENIZER), DTYPES.get(hf.get("dtype"), torch.float32))


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


def zero_masters(ckpt: Path, merge: bool = True) -> Optional[dict[str, torch.Tensor]]:
    """The fp32 master weights of the ZeRO optimizer partitions in `ckpt/ds/` (consolidated as
    DeepSpeed's zero_to_fp32.py does), or None at ZeRO-0 (no partitions)."""
    if not any((ckpt / "ds").glob("*zero_pp_rank_*_optim_states.pt")):
        return None
    check_files(sorted((ckpt / "ds").glob("*.pt")))  # DeepSpeed's reader unpickles freely
    # deepspeed: imported here, where it is used (seconds, and it sets up its accelerator)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    quiet = io.StringIO()  # its progress lines and bars are this step's detail, kept off the console
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        state = dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="ds"))
    return _merged(ckpt, state) if merge else state


def _merged(ckpt: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An adapter run's weights (trainer_state.json records its adapter) with the LoRA updates
    folded in, under the plain model's names, the frozen base (which its DeepSpeed files do not
    hold) rebuilt and checked against its recorded hash (adapter_base.py); any other run's as
    they are."""
    adapter = trainer_state(ckpt).get(ADAPTER_RECORD)
    if not adapter:
        return state
    if not any(key.endswith(".base_layer.weight") for key in state):
        trained = trained_model(ckpt)
        state = with_base(ckpt, state, adapter, trained.config, trained.dtype)
    return merged_state_dict(state, SimpleNamespace(**adapter))


def ds_state_dict(ckpt: Path, merge: bool = True) -> dict[str, torch.Tensor]:
    """The model's weights in `ckpt/ds/` under the model's own names (see the module docstring;
    merge=False: an adapter run's as it trained them, the LoRA factors apart)."""
    masters = zero_masters(ckpt, merge)
    if masters is not None:
        return masters
    states = ckpt / "ds" / ZERO0_STATES
    if not states.is_file():
        raise UserError(f"{ckpt / 'ds'}: neither ZeRO optimizer partitions nor {ZERO0_STATES}; "
                        "not a DeepSpeed checkpoint")
    saved = load_checkpoint_file(states)
    module = saved.get("module") if isinstance(saved, dict) else None
    if not isinstance(module, dict) or not module:
        raise UserError(f"{states}: holds no module weights")
    return _merged(ckpt, dict(module)) if merge else dict(module)


def load_consolidated(ckpt: Path, config: ModelConfig, *, dtype: Optional[torch.dtype] = None,
                      attn_fn: Optional[AttentionFn] = None, device: str | torch.device = "cpu") -> Transformer:
    """A Transformer of `config` with the weights of `ckpt/ds/`, cast to `dtype` (None: as stored);
    a transformers-path model (AutoModelSpec) as transformers' own class."""
    if isinstance(config, AutoModelSpec):
        from longctx.model.auto.model import build_auto_model

        model = build_auto_model(config, dtype=dtype, attn_fn=attn_fn or sdpa_attention, device=device)
        state = {k: v for k, v in ds_state_dict(ckpt).items()
                 if not (k == "lm_head.weight" and config.tie_word_embeddings)}
        try:
            model.load_state_dict(state, strict=not config.tie_word_embeddings)
        except RuntimeError as e:
            raise UserError(f"{ckpt / 'ds'}: the weights do not fit the recorded model config ({e})") from None
        return model
    with torch.device("meta"):
        model = Transformer(config, attn_fn or sdpa_attention)
    expected = model.state_dict()
    state = {}
    for key, tensor in ds_state_dict(ckpt).items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if key not in expected:
            raise UserError(f"{ckpt / 'ds'}: unexpected tensor {key!r} for the recorded model config")
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise UserError(f"{ckpt / 'ds'}: tensor {key!r} has shape {list(tensor.shape)}, the recorded model config "
                            f"implies {list(expected[key].shape)}")
        state[key] = tensor.to(device=device, dtype=dtype or tensor.dtype)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise UserError(f"{ckpt / 'ds'}: weights are missing tensor {missing[0]!r}"
                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    model.load_state_dict(state, strict=True, assign=True)
    return model
