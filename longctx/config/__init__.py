"""Training configuration: typed dataclasses + omegaconf (YAML files and key=value overrides).

    cfg = load_config("configs/cpu/x.yaml", ["train.steps=100"])   # loader.py: strict, typed
    validate_config(cfg, world_size)                                 # checks.py: before any work
    for stage in resolve_stages(cfg): ...                            # stages.py: complete per stage

The sections (sections.py) validate their own fields; the loader (loader.py) is the one every
command uses (eval's EvalConfig, the demo's DemoConfig too).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from longctx.config.checks import check_out_dir, validate_config, validate_portable
from longctx.config.loader import load_structured, to_yaml
from longctx.config.sections import (CheckpointSection, LogSection, ModelSection, OptimSection, ParallelSection,
                                     StageSection, TrainConfig, TrainSection)
from longctx.config.stages import LENGTH_FREE_ROPE, RunStage, resolve_stages
from longctx.config.stages import stage_model_config as _stage_model_config
from longctx.data.config import DataConfig, SourceConfig


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None) -> TrainConfig:
    """YAML file (optional) + key=value overrides -> a TrainConfig (types checked; the
    cross-field checks are validate_config's)."""
    return load_structured(TrainConfig, path, overrides or [])


# ---------------------------------------------------------------- until train/ has moved to RunStage
def resolved_stages(cfg: TrainConfig) -> list[StageSection]:
    if cfg.stages:
        return cfg.stages
    return [StageSection(name="main", seq_len=cfg.data.seq_len, steps=cfg.train.steps)]


def _run_stage(cfg: TrainConfig, stage: StageSection) -> RunStage:
    index = next((i for i, s in enumerate(cfg.stages) if s is stage), 0)
    return resolve_stages(cfg)[index]


def stage_data_config(cfg: TrainConfig, stage: StageSection) -> DataConfig:
    sources = stage.sources if stage.sources is not None else cfg.data.sources
    return dataclasses.replace(cfg.data, seq_len=stage.seq_len, sources=list(sources))


def stage_model_config(stage, old_stage=None, where=None):
    if old_stage is not None:  # the old (cfg, stage) form
        return _stage_model_config(_run_stage(stage, old_stage))
    return _stage_model_config(stage)


__all__ = [
    "CheckpointSection", "DataConfig", "LENGTH_FREE_ROPE", "LogSection", "ModelSection", "OptimSection",
    "ParallelSection", "RunStage", "SourceConfig", "StageSection", "TrainConfig", "TrainSection", "check_out_dir",
    "load_config", "load_structured", "resolve_stages", "stage_model_config", "to_yaml", "validate_config",
    "validate_portable",
]
