"""Which form of an adapter run a model directory holds, for the commands that read it (`longctx
eval` prints it before the weights load and records it in results.json's meta `adapter`):

- a checkpoint without model/ holds the trained tensors only: what loads is the base its record
  names (rebuilt and checked against its sha256: adapter_base.py) with the adapter merged into it
  (checkpoint/model.py);
- a run's hf/ or a checkpoint's model/ with adapter/ beside it is the merged export (each LoRA
  update folded into its weight), the PEFT adapter in adapter/.

Any other model directory is no adapter run's (None). A PEFT adapter directory alone holds no
weights: a model option given one is refused in one line that names the run to give instead.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from longctx.base.errors import UserError
from longctx.checkpoint.adapter_record import RECORD
from longctx.checkpoint.model import has_export, trainer_state
from longctx.config.checks import WEIGHT_FILES

BASE_PLUS_ADAPTER = "base + adapter"  # the checkpoint's base rebuilt, the adapter merged as it loads
MERGED_EXPORT = "merged export"  # hf/ or model/, written merged by the run
PEFT_CONFIG = "adapter_config.json"


def adapter_source(model_dir: Path) -> Optional[dict]:
    """What loading `model_dir` (as resolve_model_dir returned it) evaluates of an adapter run:
    {"loaded", "description", ...the adapter's settings}; None for a model no adapter run wrote."""
    model_dir = Path(model_dir)
    if (model_dir / "trainer_state.json").is_file() and not has_export(model_dir):
        record = trainer_state(model_dir).get(RECORD)
        return _from_checkpoint(model_dir, record) if record else None
    beside = model_dir.parent / "adapter"
    if model_dir.name in ("hf", "model") and (beside / PEFT_CONFIG).is_file():
        return _from_export(model_dir, beside)
    return None


def _from_checkpoint(ckpt: Path, record: dict) -> dict:
    base = record.get("base") or f"the preset's random init (seed {record.get('seed')})"
    sha = record.get("base_sha256") or ""
    source = {"loaded": BASE_PLUS_ADAPTER, "checkpoint": str(ckpt), "base": base, "base_sha256": sha,
              "r": record.get("r"), "alpha": record.get("alpha"), "target_modules": record.get("target_modules"),
              "trainable": record.get("trainable")}
    source["description"] = (f"adapter run: {ckpt} holds the trained tensors only; evaluating its base ({base}, sha256 "
                             f"{sha[:12]}) with the adapter ({_settings(source)}) merged in as it loads")
    return source


def _from_export(export: Path, adapter_dir: Path) -> dict:
    try:
        peft = json.loads((adapter_dir / PEFT_CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        peft = {}
    peft = peft if isinstance(peft, dict) else {}
    source = {"loaded": MERGED_EXPORT, "export": str(export), "adapter": str(adapter_dir),
              "base": peft.get("base_model_name_or_path"), "r": peft.get("r"), "alpha": peft.get("lora_alpha"),
              "target_modules": peft.get("target_modules"), "trainable": peft.get("modules_to_save")}
    source["description"] = (f"adapter run: evaluating its merged export {export} ({_settings(source)}, folded "
                             f"into the base weights), the PEFT adapter in {adapter_dir}")
    return source


def _settings(source: dict) -> str:
    targets = source.get("target_modules")
    targets = ", ".join(sorted(targets)) if isinstance(targets, (list, tuple)) else str(targets)
    trainable = source.get("trainable") or []
    whole = f" with {', '.join(trainable)} trained whole" if trainable else ""
    return f"LoRA r {source.get('r')} on {targets}{whole}"


def refuse_adapter_dir(path: Path, field: str) -> None:
    """UserError for a PEFT adapter directory given as a model (it holds no weights of its own):
    the line names what to give instead."""
    if not (path / PEFT_CONFIG).is_file() or any((path / name).is_file() for name in WEIGHT_FILES):
        return
    run = path.parent
    if (run / "hf" / "config.json").is_file() or (run / "checkpoints").is_dir() or has_export(run):
        instead = f"give its run instead ({field}={run}: its merged export, or its base with the adapter)"
    else:
        instead = ("give the merged model instead (PEFT's merge_and_unload() over the base it names, saved with "
                   "save_pretrained)")
    raise UserError(f"{field}: {path} is a PEFT adapter directory (no weights of its own); {instead}")
