"""Atomic, verified, resumable training checkpoints.

    <out_dir>/checkpoints/step_0000100/
        COMPLETE                 written last; a directory without it never counts
        MANIFEST.json            every file's size and SHA-256 (longctx/checkpoint/manifest.py)
        trainer_state.json       step, tokens seen, stage, layout (and the engine's: reshard.engine_record)
        ds/                      DeepSpeed engine: model, optimizer (ZeRO partitions)
        latest                   "ds": the tag DeepSpeed's own zero_to_fp32.py reads
        zero_to_fp32.py          DeepSpeed's script, copied by DeepSpeed (ZeRO >= 1)
        rank_00000.pt ...        per rank: data-loader state, RNG states
        model/                   Hugging Face export (config.json + safetensors)

Every rank writes into `.tmp-step_XXXXXXX/`; the ranks hash it into MANIFEST.json; rank 0
renames it, writes COMPLETE, then prunes to keep_last (never the new one). A write that fails
on any rank (disk full, read-only, permissions) is agreed by all ranks after each phase, the
partial `.tmp-*` is removed and every rank raises one CheckpointError; the previous
checkpoints are untouched. A checkpoint counts for resume, export and eval only with COMPLETE
and a manifest that verifies.

A resume on the checkpoint's own layout loads DeepSpeed's files and this rank's rank file; on
another layout (world size, cp / dp, ZeRO stage, offload) the engine is loaded through
DeepSpeed's universal checkpoint (checkpoint/universal.py) and the caller reshards every saved
rank's state (checkpoint/layout.py).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from longctx.base.errors import UserError
from longctx.checkpoint import manifest
from longctx.checkpoint.layout import (
    Layout,
    check_model_shape,
    engine_native,
    engine_record,
    read_rank_states,
    saved_layout,
)
from longctx.checkpoint.manifest import COMPLETE, gather_objects, rank_and_world
from longctx.checkpoint.safe_load import check_files, load_checkpoint_file
from longctx.checkpoint.universal import load_universal, to_universal
from longctx.model.adapter import has_adapter
from longctx.parallel.zero import optimizer_param_names
from longctx.storage import atomic

log = logging.getLogger("longctx.train")
_SPACE_MARGIN = 1.1  # the next checkpoint may be a little larger than the last one
UNIVERSAL_TEMP = "universal"  # checkpoints/.universal.tmp-HOST-PID-*: a resume's converted checkpoint


class CheckpointError(UserError):
    """A checkpoint cannot be written or resumed (the file system's or the files' fault, not
    a bug). Every rank raises it together, so the job ends cleanly with one line."""


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def complete_checkpoints(out_dir: str | Path) -> list[Path]:
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.name.startswith("step_") and (d / COMPLETE).is_file())


# ------------------------------------------------------------------------------ resume
def resume_candidates(out_dir: str | Path, resume: str) -> list[Path]:
    """Before any process group: the checkpoints to try, newest first. An explicit path must
    be complete and match its manifest's sizes (cheap); hashes are checked by choose_resume."""
    if resume == "none":
        return []
    if resume == "auto":
        return complete_checkpoints(out_dir)[::-1]
    path = Path(resume)
    if not (path / COMPLETE).is_file():
        raise UserError(f"checkpoint.resume: {path} is not a complete checkpoint (no {COMPLETE} marker)")
    problem = manifest.verify(path, hashes=False)
    if problem:
        raise UserError(f"checkpoint.resume: {path}: {problem}")
    return [path]


def choose_resume(candidates: list[Path], resume: str) -> Optional[Path]:
    """Collective: the newest candidate whose manifest verifies (sizes and SHA-256, split over
    the ranks). With resume=auto a bad one is skipped with a warning naming it and its file;
    an explicit path that fails, or auto with none that verifies, is a UserError."""
    failed = []
    for path in candidates:
        problem = manifest.verify_collective(path)
        if problem is None:
            if failed:
                log.warning("checkpoint.resume=auto: resuming from %s instead (%s)", path, "; ".join(failed))
            return path
        failed.append(f"{path} fails verification: {problem}")
        if resume != "auto":
            raise CheckpointError(f"checkpoint.resume: {failed[-1]}")
    if failed:
        raise CheckpointError(f"checkpoint.resume=auto: no checkpoint verifies ({'; '.join(failed)}); "
                              "restore or remove them, or set checkpoint.resume=none to start over")
    return None


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_trainer_state(path: Path) -> dict:
    try:
        return json.loads((path / "trainer_state.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"checkpoint.resume: {path / 'trainer_state.json'} is unreadable ({e})") from None


@dataclass
class Restored:
    """What a resume read besides the engine: the trainer state, and the saved rank states --
    this rank's own when the layout is the checkpoint's (`same_layout`), else every saved rank's
    (checkpoint/layout.py turns them into this rank's)."""

    trainer_state: dict
    rank_states: list[dict]
    same_layout: bool


def load_checkpoint(path: Path, *, engine, model, layout: Layout) -> Restored:
    """Collective: restore the engine in place from `path`, written at this `layout` or another
    (reshard.check_resume has checked the global batch). A model of another shape is a UserError."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    trainer_state = read_trainer_state(path)
    check_model_shape(path, trainer_state, model.config)
    check_torch_files(path)
    saved = saved_layout(trainer_state, path, current_zero=layout.zero_stage)
    if saved.placement() == layout.placement():  # the checkpoint's layout: DeepSpeed's files, this rank's own
        _load_native(path, engine)
        return Restored(trainer_state, [_read_rank_file(path, rank)], True)
    states = read_rank_states(path, saved.world_size)
    log.warning("checkpoint.resume: %s was written at %s; this run has %s", path, saved.describe(), layout.describe())
    if engine_native(saved, layout):
        _load_native(path, engine)
    else:
        _load_universal(path, engine, model)
    return Restored(trainer_state, states, False)


def _load_native(path: Path, engine) -> None:
    # an adapter checkpoint holds the trained weights only: the frozen base is this run's (hash-checked)
    load_path, _ = engine.load_checkpoint(str(path), tag="ds", load_optimizer_states=True,
                                          load_lr_scheduler_states=False,
                                          load_module_strict=not has_adapter(engine.module))
    if load_path is None:
        raise UserError(f"checkpoint.resume: DeepSpeed could not load {path / 'ds'}")
    # ZeRO-3's load leaves the parameters gathered: a checkpointed block's first forward would skip
    # the all-gather its recomputation does, and torch.utils.checkpoint stops the backward
    # ("... encountered during backward but not found in storage"). Release them (no-op below ZeRO-3).
    engine.empty_partition_cache()


def _read_rank_file(path: Path, rank: int) -> dict:
    return load_checkpoint_file(path / f"rank_{rank:05d}.pt")


def check_torch_files(path: Path) -> None:
    """Collective: every torch file of checkpoint `path` (the rank files and DeepSpeed's, which
    DeepSpeed unpickles freely when it loads or converts them) has its pickle read by the
    weights_only unpickler first (safe_load.check_file: no tensor data), before anything from the
    checkpoint is loaded; a refusal on any rank is every rank's UserError naming the file.

    The files are shared among the ranks of each node, not of the job: a node-local checkpoint
    directory (each node holding its own copy) is checked on every node, and each rank checks
    only files its node can see."""
    files = sorted(path.glob("rank_*.pt")) + sorted((path / "ds").rglob("*.pt"))
    place, peers = node_place()
    problem = run_phase(lambda: check_files(files[place::peers]))
    if problem:
        raise UserError(problem.split(": ", 1)[1])  # the file's own line, without "rank r: "


def node_place() -> tuple[int, int]:
    """Collective: (this rank's index among the ranks on its host, how many ranks its host runs),
    from every rank's host name."""
    rank, _ = rank_and_world()
    hosts = gather_objects(socket.gethostname())
    mine = [r for r, host in enumerate(hosts) if host == hosts[rank]]
    return mine.index(rank), len(mine)


def _universal_bytes(ds_dir: Path) -> int:
    """Free space the conversion needs: DeepSpeed's converter keeps the extracted fragments and
    the merged parameters at once (twice the optimizer partitions); ZeRO-0's one file once."""
    partitions = sum(f.stat().st_size for f in ds_dir.glob("*optim_states.pt"))
    if partitions:
        return 2 * partitions
    return sum(f.stat().st_size for f in ds_dir.glob("*model_states.pt"))


def _as_runtime(fn: Callable[[], None]) -> None:
    """Run DeepSpeed's converter or loader, its assertions and lookups raised as RuntimeError, so
    that every rank agrees on the failure (run_phase) instead of one rank leaving the others
    waiting."""
    try:
        fn()
    except (OSError, RuntimeError, UserError):
        raise
    except Exception as e:  # noqa: BLE001 -- AssertionError, KeyError, ... from DeepSpeed's code
        raise RuntimeError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


def _load_universal(path: Path, engine, model) -> None:
    """Collective: rank 0 converts the checkpoint to DeepSpeed's universal form in a temporary
    folder beside the checkpoints, every rank loads its partitions from it, rank 0 removes it."""
    rank, _ = rank_and_world()
    root = path.parent
    folder: list[Optional[Path]] = [None]

    def convert() -> None:
        if rank != 0:
            return
        atomic.remove_stale(root, lambda line: log.warning("%s", line), name=UNIVERSAL_TEMP)
        need, free = _universal_bytes(path / "ds"), shutil.disk_usage(root).free
        if need > free:
            raise OSError(errno.ENOSPC, f"needs ~{atomic.human_size(need)}, {atomic.human_size(free)} free", str(root))
        folder[0] = atomic.make_temp_dir(root / UNIVERSAL_TEMP)
        _as_runtime(lambda: to_universal(path / "ds", folder[0], optimizer_param_names(model)))

    problem = run_phase(convert, after_failure=lambda: folder[0] and shutil.rmtree(folder[0], ignore_errors=True))
    if problem:
        raise CheckpointError(f"checkpoint.resume: cannot convert {path} for the new layout: {problem}")
    where = Path(gather_objects(str(folder[0]) if folder[0] else None)[0])
    try:
        problem = run_phase(lambda: _as_runtime(lambda: load_universal(engine, model, where)))
    finally:
        _barrier()
        if rank == 0:
            shutil.rmtree(where, ignore_errors=True)
    if problem:
        raise CheckpointError(f"checkpoint.resume: cannot load {path} on the new layout: {problem}")
    engine.empty_partition_cache()


# -------------------------------------------------------------------------------- saving
def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError):
        where = error.filename or "?"
        cause = error.strerror or str(error)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            cause += ": the disk (or quota) is full"
        return f"{where} ({cause})"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _agree(error: Optional[BaseException]) -> Optional[str]:
    """Collective: the first rank's failure of this phase (as one line), or None."""
    rank, _ = rank_and_world()
    mine = None if error is None else f"rank {rank}: {_describe(error)}"
    failures = [f for f in gather_objects(mine) if f]
    return failures[0] if failures else None


def run_phase(fn: Callable[[], None], after_failure: Optional[Callable[[], None]] = None) -> Optional[str]:
    """Run `fn` on this rank, then agree with every rank on whether the phase failed."""
    error = None
    try:
        fn()
    except (OSError, RuntimeError, UserError) as e:  # what file systems raise through torch / safetensors
        error = e
        if after_failure is not None:
            after_failure()
    return _agree(error)


def _estimate_bytes(root: Path, engine) -> int:
    """The size of the newest complete checkpoint, else 16 bytes per parameter (weights,
    fp32 master and Adam moments, the HF copy), times a margin."""
    newest = complete_checkpoints(root.parent)
    if newest:
        files, _ = manifest.read_manifest(newest[-1])
        if files:
            return int(sum(e.get("size", 0) for e in files.values()) * _SPACE_MARGIN)
    params = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    return int(16 * params * _SPACE_MARGIN)


def _intact(out_dir: Path) -> str:
    kept = complete_checkpoints(out_dir)
    return f"previous checkpoints intact ({kept[-1].name} newest)" if kept else "no previous checkpoint"


def _prune(out_dir: Path, keep_last: int, new: Path) -> None:
    older = [d for d in complete_checkpoints(out_dir) if d != new]
    for old in older[:max(0, len(older) - (keep_last - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(out_dir: str | Path, step: int, *, engine, trainer_state: dict, rank_state: dict,
                    keep_last: int, hf_writer=None) -> Path:
    """Collective: every rank calls it. `hf_writer(path)` (collective too, rank 0 writes)
    writes model/. Returns the new checkpoint; raises CheckpointError on every rank."""
    rank, _ = rank_and_world()
    trainer_state = dict(trainer_state, **engine_record(engine))  # what a resume on another layout reads
    out_dir = Path(out_dir)
    root = checkpoint_dir(out_dir)
    tmp, final = root / f".tmp-step_{step:07d}", root / f"step_{step:07d}"
    for phase in _save_phases(rank, step, root, tmp, final, engine, trainer_state, rank_state, hf_writer):
        problem = phase()
        if problem:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            _barrier()
            raise CheckpointError(f"checkpoint: cannot save step {step}: {problem}; {_intact(out_dir)}")
    if rank == 0:
        _prune(out_dir, keep_last, final)
    _barrier()
    return final


def _save_phases(rank: int, step: int, root: Path, tmp: Path, final: Path, engine, trainer_state: dict,
                 rank_state: dict, hf_writer) -> list[Callable[[], Optional[str]]]:
    """The phases of a save, in order; each returns the failure every rank agreed on, or None."""
    def own_files() -> Optional[str]:
        problem = run_phase(lambda: _write_own(rank, tmp, rank_state, trainer_state))
        return problem if problem is not None or hf_writer is None else hf_writer(tmp / "model")

    def listed() -> Optional[str]:
        _barrier()
        return manifest.write_manifest(tmp, step)

    return [
        lambda: run_phase(lambda: _prepare(rank, root, tmp, final, engine)),
        # A write failing inside DeepSpeed's save skips its closing barrier on this rank only;
        # joining it here keeps the ranks' collectives in step (its other collectives come first).
        # an adapter run's frozen base is not copied: the checkpoint names it by hash (adapter_record.py)
        lambda: run_phase(lambda: engine.save_checkpoint(str(tmp), tag="ds", save_latest=True,
                                                         exclude_frozen_parameters=has_adapter(engine.module)),
                          after_failure=_barrier),
        own_files,
        listed,
        lambda: run_phase(lambda: _commit(rank, tmp, final, step)),
    ]


def _prepare(rank: int, root: Path, tmp: Path, final: Path, engine) -> None:
    """Rank 0: an empty temporary directory, stale ones removed, enough free space."""
    if rank != 0:
        return
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    need, free = _estimate_bytes(root, engine), shutil.disk_usage(root).free
    if need > free:
        raise OSError(errno.ENOSPC, f"needs ~{atomic.human_size(need)}, {atomic.human_size(free)} free", str(root))
    if final.exists() and not (final / COMPLETE).is_file():  # an incomplete one left by a crash here
        shutil.rmtree(final)
    tmp.mkdir()


def _write_own(rank: int, tmp: Path, rank_state: dict, trainer_state: dict) -> None:
    torch.save(rank_state, tmp / f"rank_{rank:05d}.pt")
    if rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))


def _commit(rank: int, tmp: Path, final: Path, step: int) -> None:
    """Rank 0: the temporary directory becomes the checkpoint, then COMPLETE (fsynced)."""
    if rank != 0:
        return
    if final.exists():  # a complete one of the same step (a re-run from an earlier checkpoint)
        shutil.rmtree(final)
    os.replace(tmp, final)
    with open(final / COMPLETE, "w") as f:
        f.write(f"{step}\n")
        f.flush()
        os.fsync(f.fileno())
