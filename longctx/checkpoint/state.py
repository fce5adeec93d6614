"""What a checkpoint says about its run, as typed objects built in one place.

    TrainState     where the run is (steps, tokens, stage); the trainer advances it
    TrainerState   trainer_state.json: TrainState + the layout that saved it, the stages' steps,
                   the data it read and the model it holds (TrainerState.of builds it)

Both offer state_dict() / load_state_dict() as the run's other components do (the data loader,
the engine); trainer_state.json's keys are TrainerState's fields, unchanged from the dicts
earlier versions wrote, so every checkpoint reads back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

from longctx.checkpoint.model import checkpoint_record
from longctx.model.config import ModelConfig


@dataclass
class TrainState:
    """Where the run is: optimizer steps taken (in all stages), real tokens trained on, the
    stage and the steps taken in it."""
    step: int = 0
    tokens: int = 0
    stage: int = 0
    stage_step: int = 0

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, saved: dict) -> None:
        for name in ("step", "tokens", "stage", "stage_step"):
            setattr(self, name, int(saved.get(name, 0)))


@dataclass(frozen=True)
class TrainerState:
    """trainer_state.json. `stage_steps` / `data_stage`: how a resume with a changed config
    continues (checkpoint/continuation.py); `model_config` / `tokenizer`: the model it holds,
    for export and eval without model/ (checkpoint/model.py)."""
    step: int
    tokens: int
    stage: int
    stage_step: int
    data_sources: list
    world_size: int
    cp_size: int
    dp_size: int
    stage_steps: list
    data_stage: int
    model_config: dict = field(default_factory=dict)
    tokenizer: Optional[str] = None

    @classmethod
    def of(cls, progress: TrainState, *, world_size: int, cp_size: int, stage_steps: list, data_stage: int,
           data_sources: list, model: ModelConfig, dtype: torch.dtype, tokenizer: str) -> "TrainerState":
        return cls(**progress.state_dict(), data_sources=data_sources, world_size=world_size, cp_size=cp_size,
                   dp_size=world_size // cp_size, stage_steps=list(stage_steps), data_stage=data_stage,
                   **checkpoint_record(model, dtype, tokenizer))

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)
