"""What an adapter run's checkpoint records of its adapter (trainer_state.json's `adapter`) and
the checks a resume makes against it: the same adapter configuration (before any work), the
same base weights, named by the sha256 of the frozen tensors (after the model is built, before
the checkpoint is loaded). A full-training checkpoint and an adapter run do not mix either way."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from longctx.base.errors import UserError

RECORD = "adapter"
FIELDS = ("type", "r", "alpha", "dropout", "target_modules", "trainable")


def adapter_config_record(adapter) -> Optional[dict]:
    """train.adapter as recorded (None: a full-training run)."""
    if adapter is None:
        return None
    return {"type": adapter.type, "r": int(adapter.r), "alpha": float(adapter.alpha),
            "dropout": float(adapter.dropout), "target_modules": list(adapter.target_modules),
            "trainable": list(adapter.trainable)}


def base_hash(model: nn.Module) -> str:
    """sha256 over the frozen parameters (name, dtype, shape, bytes) in name order: the base
    weights an adapter trains on. Reads each tensor once through host memory."""
    return base_hash_of((n, p) for n, p in model.named_parameters() if not p.requires_grad)


@torch.no_grad()
def base_hash_of(named) -> str:
    """base_hash of (name, tensor) pairs (a LoRA-wrapped module's `.base_layer.` left out of its name)."""
    digest = hashlib.sha256()
    for name, p in sorted(((name.replace(".base_layer.", "."), p) for name, p in named), key=lambda item: item[0]):
        t = p.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def check_adapter_config(ckpt: Path, saved: dict, adapter) -> None:
    """UserError when the checkpoint's adapter configuration is not this run's train.adapter."""
    recorded, current = saved.get(RECORD), adapter_config_record(adapter)
    if recorded is None and current is None:
        return
    if recorded is None:
        raise UserError(f"train.adapter: {ckpt} is a full-training checkpoint (no adapter); resume it without "
                        "train.adapter, or start the adapter run in another out_dir")
    if current is None:
        raise UserError(f"train.adapter: {ckpt} trained an adapter ({_describe(recorded)}); set the same "
                        "train.adapter to resume it")
    for field in FIELDS:
        if recorded.get(field) != current[field]:
            raise UserError(f"train.adapter.{field}: {ckpt} was trained with {field}={recorded.get(field)}; this run "
                            f"has {field}={current[field]} (a resume keeps the adapter's configuration: set it back, "
                            "or start a new run in another out_dir)")


def check_base(ckpt: Path, saved: dict, current_hash: str) -> None:
    """UserError when the base weights this run built are not the ones the checkpoint's adapter
    was trained on."""
    recorded = (saved.get(RECORD) or {}).get("base_sha256")
    if recorded is not None and recorded != current_hash:
        raise UserError(f"model.init_from: the base weights (sha256 {current_hash[:12]}) are not the ones {ckpt} "
                        f"trained its adapter on (sha256 {recorded[:12]}); resume with that base model "
                        "(model.init_from, or the model.preset and train.seed it was built from)")


def _describe(record: dict) -> str:
    return f"{record.get('type')} r={record.get('r')} on {', '.join(record.get('target_modules') or [])}"
