"""Where a resumed run continues, when its config has changed since the checkpoint.

A checkpoint records the steps of every stage it was written under (`stage_steps`). Resuming:
- mid-stage: that stage continues from its step (a stage shortened below it is done);
- at the end of the old plan, with the last stage given more steps: that stage continues
  (its data loader from where it stopped; the LR schedule is re-derived over the new number
  of steps, which a constant schedule leaves unchanged);
- at the end of the old plan, with stages added: the first new stage starts;
- nothing new: nothing to train (a one-line notice, exit 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Continuation:
    stage: int  # index of the stage to run next (== number of stages: nothing left)
    stage_step: int  # steps of that stage already done
    loader_belongs: bool  # the checkpoint's data-loader state is this stage's
    note: Optional[str]  # what changed, for the log (None: the run continues as planned)


def _name(stages: Sequence, i: int) -> str:
    return f"stage {i} ({stages[i].name})" if getattr(stages[i], "name", "") else f"stage {i}"


def continue_from(saved: dict, stages: Sequence) -> Continuation:
    """`saved`: the checkpoint's trainer_state.json; `stages`: this run's resolved stages."""
    stage, stage_step = int(saved["stage"]), int(saved["stage_step"])
    old_steps = saved.get("stage_steps")
    data_stage = saved.get("data_stage", stage)
    if stage < len(stages) and stage_step > 0:  # mid-stage
        if stage_step < stages[stage].steps:
            return Continuation(stage, stage_step, data_stage == stage, None)
        note = (f"{_name(stages, stage)} now has {stages[stage].steps} steps; the checkpoint is past them "
                f"(step {stage_step}): moving on to the next stage")
        return Continuation(stage + 1, 0, False, note)
    finished_old_plan = old_steps is not None and stage == len(old_steps)
    if finished_old_plan and 0 < stage <= len(stages):
        last = stage - 1
        done, planned = int(old_steps[last]), stages[last].steps
        if planned > done:
            note = (f"extending {_name(stages, last)} from {done} to {planned} steps: its LR schedule is re-derived "
                    f"over {planned} steps")
            return Continuation(last, done, data_stage == last, note)
    if stage < len(stages):
        note = None if not finished_old_plan else (
            f"the checkpoint finished all {len(old_steps)} stage(s) it was written for; "
            f"starting {_name(stages, stage)}")
        return Continuation(stage, 0, False, note)
    return Continuation(len(stages), 0, False, None)


def nothing_left_notice(checkpoint, saved: dict, stages: Sequence) -> str:
    total = sum(s.steps for s in stages)
    return (f"nothing to train: {checkpoint} already holds step {saved['step']}, all {total} steps of "
            f"{len(stages)} stage(s) in this config; raise train.steps (or a stage's steps) or add a stage to continue")
