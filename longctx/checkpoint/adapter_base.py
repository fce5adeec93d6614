"""The frozen base of an adapter checkpoint, which its DeepSpeed files do not hold: rebuilt from
what the checkpoint records (trainer_state.json's `adapter`: `base`, model.init_from, or the
preset's random init from `seed`) and accepted only when its sha256 is the recorded one."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from longctx.base.errors import UserError
from longctx.checkpoint.adapter_record import base_hash_of
from longctx.model.auto.support import AutoModelSpec
from longctx.storage.hub import MODEL_FILES, hub_or_local

Tensor = torch.Tensor


def with_base(ckpt: Path, state: dict[str, Tensor], record: dict, config, dtype: torch.dtype) -> dict[str, Tensor]:
    """`state` (the checkpoint's trained tensors, own names) with the frozen base weights added
    (a LoRA-wrapped module's as `<module>.base_layer.weight`)."""
    base = _base_model(record, config)
    frozen = {}
    for name, p in base.named_parameters():
        if name in state:
            continue
        module = name.rsplit(".", 1)[0]
        wrapped = f"{module}.lora_A.default.weight" in state
        frozen[f"{module}.base_layer.{name.rsplit('.', 1)[1]}" if wrapped else name] = p.detach().to(dtype)
    recorded = record.get("base_sha256")
    found = base_hash_of(frozen.items())
    if recorded and found != recorded:
        where = record.get("base") or f"the preset's random init (seed {record.get('seed')})"
        raise UserError(f"{ckpt}: its base weights ({where}) now hash to sha256 {found[:12]}, not the recorded "
                        f"{recorded[:12]}: the base changed since the run; restore it to read this checkpoint")
    return {**frozen, **state}


def _base_model(record: dict, config):
    base: Optional[str] = record.get("base")
    if isinstance(config, AutoModelSpec):
        from longctx.model.auto.model import build_auto_model, load_auto_model

        if base:
            return load_auto_model(_local(base), config)
        return build_auto_model(config, seed=record.get("seed"))
    from longctx.model.hf import load_pretrained
    from longctx.model.llama import build_model

    if base:
        return load_pretrained(_local(base), config=config)
    return build_model(config, seed=record.get("seed"))


def _local(base: str) -> Path:
    local = hub_or_local(base, "model.init_from", MODEL_FILES, download=False)
    path = Path(local or base)
    if not path.is_dir():
        raise UserError(f"model.init_from: {base}, the base this adapter checkpoint was trained on, is not here "
                        "(a local directory, or a Hub id in the HF cache)")
    return path
