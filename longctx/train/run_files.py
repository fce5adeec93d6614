"""The run directory as a run starts: its lock, the resumed stage's data against what its
checkpoint recorded, the resolved config and the stale markers of an earlier run."""
from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Optional

import torch.distributed as dist

from longctx.base.errors import UserError
from longctx.checkpoint.continuation import continue_from
from longctx.checkpoint.manifest import gather_objects
from longctx.checkpoint.store import read_trainer_state
from longctx.config import RunStage, TrainConfig, to_yaml
from longctx.data.fingerprint import changed_sources, compare_sources, fingerprint_sources
from longctx.parallel.mesh import shutdown_distributed
from longctx.runtime.watchdog import STALLED_MARKER
from longctx.storage import atomic
from longctx.train import run_lock
from longctx.train.build import resolved_header
from longctx.train.nonfinite import NONFINITE_MARKER
from longctx.train.signals import PREEMPTED_MARKER

log = logging.getLogger("longctx.train")


def take_run_lock(out: Path, rank: int):
    """Collective: rank 0 takes out_dir's lock; a refusal is raised on every rank."""
    holder, refusal = None, None
    if rank == 0:
        try:
            holder = run_lock.acquire(out, notify=lambda line: print(f"note: {line}", file=sys.stderr))
        except UserError as e:
            refusal = str(e)
    refusal = gather_objects(refusal)[0]
    if refusal is not None:
        shutdown_distributed(False)
        raise UserError(refusal)
    return holder


def changed_resumed_sources(resume_from: Optional[Path], stages: list[RunStage]) -> set:
    """The resumed stage's sources against the fingerprints its checkpoint recorded: a change
    stops the run (UserError on every rank) unless data.allow_changed_sources; returns the
    changed sources, whose order the loader restarts."""
    if resume_from is None:
        return set()
    saved = read_trainer_state(resume_from)
    recorded = saved.get("data_sources")
    continuation = continue_from(saved, stages)
    if recorded is None or not continuation.loader_belongs:
        return set()  # the resumed stage's loader starts fresh: nothing to carry over
    data = stages[continuation.stage].data
    current = fingerprint_sources(data)
    for line in compare_sources(recorded, current, data.allow_changed_sources):
        log.warning("%s", line)
    return set(changed_sources(recorded, current))


def write_run_files(out: Path, rank: int, cfg: TrainConfig) -> None:
    """Rank 0, once the run is known to go ahead: the resolved config, stale markers and the
    temporary checkpoints a killed job left removed (this job holds the lock: none is being written)."""
    if rank == 0:
        atomic.write_text(out / "resolved_config.yaml", resolved_header(cfg) + to_yaml(cfg))
        (out / PREEMPTED_MARKER).unlink(missing_ok=True)
        (out / STALLED_MARKER).unlink(missing_ok=True)
        (out / NONFINITE_MARKER).unlink(missing_ok=True)
        for stale in sorted((out / "checkpoints").glob(".tmp-step_*")):
            shutil.rmtree(stale, ignore_errors=True)
            print(f"note: removed {stale}, a checkpoint a killed job left half-written", file=sys.stderr)
    dist.barrier()
