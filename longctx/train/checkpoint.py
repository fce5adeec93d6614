"""Atomic, resumable training checkpoints.

    <out_dir>/checkpoints/step_0000100/
        COMPLETE                 written last; a directory without it never counts
        trainer_state.json       step, tokens seen, stage, layout
        ds/                      DeepSpeed engine: model, optimizer (ZeRO partitions)
        rank_00000.pt ...        per rank: data-loader state, RNG states
        model/                   Hugging Face export (config.json + safetensors)

Every rank writes into `.tmp-step_XXXXXXX/`; after a barrier rank 0 renames it, then writes
COMPLETE, then prunes to keep_last.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from longctx.errors import UserError

COMPLETE = "COMPLETE"


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def complete_checkpoints(out_dir: str | Path) -> list[Path]:
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.name.startswith("step_") and (d / COMPLETE).is_file())


def find_resume(out_dir: str | Path, resume: str) -> Optional[Path]:
    if resume == "none":
        return None
    if resume == "auto":
        found = complete_checkpoints(out_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / COMPLETE).is_file():
        raise UserError(f"checkpoint.resume: {path} is not a complete checkpoint (no {COMPLETE} marker)")
    return path


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(out_dir: str | Path, step: int, *, engine, trainer_state: dict, rank_state: dict,
                    keep_last: int, hf_writer=None) -> Path:
    """Collective: every rank calls it. `hf_writer(path)` (collective too) writes model/."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    root = checkpoint_dir(out_dir)
    name = f"step_{step:07d}"
    tmp, final = root / f".tmp-{name}", root / name
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # e.g. an incomplete one left by a crash at this very step
            shutil.rmtree(final)
        tmp.mkdir()
    _barrier()
    engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
    torch.save(rank_state, tmp / f"rank_{rank:05d}.pt")
    if hf_writer is not None:
        hf_writer(tmp / "model")
    if rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
    _barrier()
    if rank == 0:
        os.replace(tmp, final)
        with open(final / COMPLETE, "w") as f:
            f.write(f"{step}\n")
            f.flush()
            os.fsync(f.fileno())
        for old in complete_checkpoints(out_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load_checkpoint(path: Path, *, engine, world_size: int) -> tuple[dict, dict]:
    """Restore the engine in place; returns (trainer_state, this rank's state)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    saved_world = trainer_state.get("world_size")
    if saved_world != world_size:
        raise UserError(f"checkpoint.resume: {path} was written by {saved_world} ranks; this run has {world_size} "
                        "(resume with the same number of processes)")
    load_path, _ = engine.load_checkpoint(str(path), tag="ds", load_optimizer_states=True,
                                          load_lr_scheduler_states=False)
    if load_path is None:
        raise UserError(f"checkpoint.resume: DeepSpeed could not load {path / 'ds'}")
    rank_state = torch.load(path / f"rank_{rank:05d}.pt", weights_only=False)
    return trainer_state, rank_state
