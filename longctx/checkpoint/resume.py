"""The resume path, top to bottom. What the trainer calls, in order:

    candidates = resume_candidates(out, resume)      store.py: before any process group (bad path: one line)
    checkpoint = choose_resume(candidates, resume)   store.py: collective; the newest that verifies (auto falls back)
    point = resume_point(checkpoint, stages, ...)    where the run continues; model shape and global
                                                     batch checked before the engine exists
    ... the engine is built ...
    loader_state = restore(point, into, ...)         weights, optimizer, counters, RNG, the loader's position:
                                                     the saved layout's own files, or resharded for this one
                                                     (layout.py, universal.py)

`point` is None for a fresh run; `point.finished` when the checkpoint already holds every step
of this run's stages (the notice is printed and nothing is loaded).
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from longctx.checkpoint.continuation import Continuation, continue_from, nothing_left_notice
from longctx.checkpoint.layout import Layout, check_resume, engine_record, loader_state, rng_for
from longctx.checkpoint.state import TrainState
from longctx.checkpoint.store import (
    choose_resume,
    load_checkpoint,
    read_trainer_state,
    resume_candidates,
    set_rng_state,
)
from longctx.model.config import ModelConfig

log = logging.getLogger("longctx.train")
__all__ = ["RankPlace", "RestoreTarget", "ResumePoint", "choose_resume", "restore", "resume_candidates",
           "resume_point"]


@dataclass(frozen=True)
class ResumePoint:
    """A verified checkpoint, what it recorded, and where this run continues from it."""
    checkpoint: Path
    saved: dict  # its trainer_state.json
    continuation: Continuation
    stages: int  # this run's number of stages

    @property
    def finished(self) -> bool:
        """The checkpoint holds every step of this run's stages: nothing left to train."""
        return self.continuation.stage == self.stages


def resume_point(checkpoint: Optional[Path], stages, *, model_config: ModelConfig, world_size: int,
                 grad_accum: int, rank: int) -> Optional[ResumePoint]:
    """Where a run resumed from `checkpoint` continues (None: a fresh run). A checkpoint of
    another model shape, or of another global batch on another dp size, is one line and nothing
    is loaded; one whose steps cover every stage prints the notice (rank 0)."""
    if checkpoint is None:
        return None
    saved = read_trainer_state(checkpoint)
    continuation = continue_from(saved, stages)
    point = ResumePoint(checkpoint, saved, continuation, len(stages))
    if point.finished:
        if rank == 0:
            print(nothing_left_notice(checkpoint, saved, stages), file=sys.stderr)
        return point
    check_resume(checkpoint, saved, model_config=model_config, world_size=world_size,
                 stage=stages[continuation.stage], grad_accum=grad_accum, loader_continues=continuation.loader_belongs)
    return point


@dataclass(frozen=True)
class RestoreTarget:
    """What a checkpoint is loaded into: the DeepSpeed engine, the plain model it trains (its
    config is checked against the checkpoint's) and the run's counters."""
    engine: object
    model: object
    state: TrainState


@dataclass(frozen=True)
class RankPlace:
    """This process among the run's: its global rank of world_size, and its dp rank of dp_size in
    the stage the run continues with (whose loader state it takes)."""
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int


def restore(point: ResumePoint, into: RestoreTarget, *, stage, place: RankPlace, grad_accum: int,
            fresh_loader: Callable[[], object], announce: Callable[[str], None]) -> Optional[dict]:
    """Load the checkpoint into the engine and the state of `into`; returns the loader state when
    it belongs to the stage the run continues with. A checkpoint of another layout is resharded:
    the engine through DeepSpeed's universal checkpoint, the loader states to this dp size
    (`fresh_loader` builds this rank's loader to replay where needed), the RNG state of rank r mod
    the old world."""
    continuation, state, world_size = point.continuation, into.state, place.world_size
    cp, micro = stage.parallel.cp_size, stage.data.micro_batch_size
    record = engine_record(into.engine)
    layout = Layout(world_size, cp, world_size // cp, record["zero_stage"], record["offload_optimizer"],
                    micro * grad_accum)
    restored = load_checkpoint(point.checkpoint, engine=into.engine, model=into.model, layout=layout)
    state.load_state_dict(restored.trainer_state)
    state.stage, state.stage_step = continuation.stage, continuation.stage_step
    log.info("resumed from %s at step %d", point.checkpoint, state.step)
    if continuation.note:
        log.warning("checkpoint.resume: %s", continuation.note)
    if restored.same_layout:
        rank_state = restored.rank_states[0]
        set_rng_state(rank_state["rng"])
        return rank_state["data"] if continuation.loader_belongs else None
    set_rng_state(rng_for(restored.rank_states, place.rank))
    if not continuation.loader_belongs:
        return None
    data, note = loader_state(restored.rank_states, dp_rank=place.dp_rank, dp_size=place.dp_size,
                              micro_batch_size=micro, fresh_loader=fresh_loader)
    if note:
        announce(note)
    return data
