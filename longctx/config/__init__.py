"""Training configuration: typed dataclasses + omegaconf (YAML files and key=value overrides).

    cfg = load_config("configs/cpu/x.yaml", ["train.steps=100"])   # loader.py: strict, typed
    plan = validate_config(cfg, world_size)                          # checks.py: before any work
    for stage, model_cfg in zip(plan.stages, plan.model_configs): ... # run_plan.py: derived once

The sections (sections.py) validate their own fields; the loader (loader.py) is the one every
command uses (eval's EvalConfig, the demo's DemoConfig too).
"""
from __future__ import annotations

from typing import Optional

from longctx.config.checks import check_out_dir, load_deepspeed_json, validate_config, validate_portable
from longctx.config.loader import load_structured, to_yaml
from longctx.config.run_plan import RunPlan, derive_plan, trim_multiple
from longctx.config.sections import (
    CheckpointSection,
    LogSection,
    ModelSection,
    OptimSection,
    ParallelSection,
    StageSection,
    TrainConfig,
    TrainSection,
)
from longctx.config.stages import (
    LENGTH_FREE_ROPE,
    RunStage,
    missing_data_note,
    missing_weights_note,
    origin_config,
    resolve_stages,
    stage_model_config,
)
from longctx.data.config import DataConfig
from longctx.data.source_config import SourceConfig


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None) -> TrainConfig:
    """YAML file (optional) + key=value overrides -> a TrainConfig (types checked; the
    cross-field checks are validate_config's)."""
    return load_structured(TrainConfig, path, overrides or [])


__all__ = [
    "CheckpointSection", "DataConfig", "LENGTH_FREE_ROPE", "LogSection", "ModelSection", "OptimSection",
    "ParallelSection", "RunPlan", "RunStage", "SourceConfig", "StageSection", "TrainConfig", "TrainSection",
    "check_out_dir", "derive_plan", "load_config", "load_deepspeed_json", "load_structured", "missing_data_note",
    "missing_weights_note", "origin_config", "resolve_stages", "stage_model_config", "to_yaml", "trim_multiple",
    "validate_config", "validate_portable",
]
