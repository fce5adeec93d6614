"""`longctx export --adapter`: an adapter run's PEFT adapter directory (checkpoint/peft_export.py)
from a run directory (its adapter/, written with hf/ at the end of the run), a checkpoint with
adapter/ (checkpoint.save_hf), or a checkpoint without it (its DeepSpeed files, the LoRA factors
apart, and the adapter and model it records)."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

from longctx.base.errors import UserError
from longctx.checkpoint import manifest
from longctx.checkpoint.adapter_record import RECORD
from longctx.checkpoint.find import is_checkpoint
from longctx.checkpoint.model import ds_state_dict, trained_model, trainer_state
from longctx.checkpoint.peft_export import write_adapter_dir
from longctx.model.hf import export_target
from longctx.storage import atomic


def _newest_checkpoint(run: Path) -> Path | None:
    ckpts = run / "checkpoints"
    complete = sorted(d for d in ckpts.iterdir() if is_checkpoint(d) and (d / "COMPLETE").is_file()) \
        if ckpts.is_dir() else []
    return complete[-1] if complete else None


def export_adapter(src: Path, out: Path) -> Path:
    """Write the PEFT adapter of `src` to `out` (a temporary sibling, then swapped in); returns
    what it was read from."""
    if (src / "adapter" / "adapter_config.json").is_file():
        if is_checkpoint(src):
            _verified(src)
        _copy_dir(src / "adapter", out)
        return src / "adapter"
    ckpt = src if is_checkpoint(src) else _newest_checkpoint(src)
    if ckpt is None:
        raise UserError(f"--checkpoint: {src} is not an adapter run's directory or checkpoint (no adapter/, no "
                        "checkpoints/)")
    _verified(ckpt)
    record = trainer_state(ckpt).get(RECORD)
    if not record:
        raise UserError(f"--adapter: {ckpt} is a full-training checkpoint (its trainer_state.json records no "
                        "train.adapter); export it without --adapter")
    adapter = SimpleNamespace(**{k: record[k] for k in ("r", "alpha", "dropout", "target_modules", "trainable")})
    write_adapter_dir(ds_state_dict(ckpt, merge=False), adapter, trained_model(ckpt).config, export_target(out),
                      base=record.get("base"))
    return ckpt


def _verified(ckpt: Path) -> None:
    problem = manifest.verify(ckpt)
    if problem:
        raise UserError(f"{ckpt}: {problem}; use another checkpoint")


def _copy_dir(src: Path, out: Path) -> None:
    target = export_target(out)
    atomic.remove_stale(target.parent, atomic.note, name=target.name)
    tmp = atomic.make_temp_dir(target)
    try:
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        atomic.swap_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
