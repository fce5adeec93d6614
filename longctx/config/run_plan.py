"""The run plan: what validate_config derives from a TrainConfig once, handed down to the
trainer, the dry run and the planner so that none of them derives it again."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from longctx.config.sections import TrainConfig
from longctx.config.stages import RunStage, origin_config, resolve_stages, stage_model_config
from longctx.model.config import ModelConfig

# unscored row tails are trimmed to a multiple of the attention kernels' 64-token blocks that
# the zigzag's 2 x cp chunks also divide
KERNEL_BLOCK = 64


def trim_multiple(cp_size: int) -> int:
    """The length multiple a stage's rows are trimmed to (data collate's trim_multiple)."""
    return math.lcm(KERNEL_BLOCK, 2 * cp_size)


@dataclass(frozen=True)
class RunPlan:
    """A validated run: its stages with their model configs, the architecture of the weights'
    origin (model.init_from's config.json, read once, or model.preset's) and the user's
    DeepSpeed JSON, parsed (None without parallel.deepspeed_config)."""

    stages: tuple[RunStage, ...]
    model_configs: tuple[ModelConfig, ...]  # one per stage
    origin: ModelConfig
    deepspeed: Optional[dict]
    world_size: int  # the world the plan was validated for
    files: bool  # whether weights and data files were checked (False: a dry run, --print-config)

    def trim_multiple(self, index: int) -> int:
        return trim_multiple(self.stages[index].parallel.cp_size)


def derive_plan(cfg: TrainConfig, world_size: int, *, stages: Optional[Sequence[RunStage]] = None,
                deepspeed: Optional[dict] = None, files: bool = False) -> RunPlan:
    """The plan of `cfg` without validate_config's checks (which call this once they have read
    what it needs): its stages (`stages`, else resolve_stages), init_from's config.json read once,
    each stage's model config from it. For `longctx plan` (a job that runs elsewhere) and
    callers handed a config already checked."""
    stages = tuple(resolve_stages(cfg) if stages is None else stages)
    origin = origin_config(cfg.model)  # the one read of init_from's config.json
    return RunPlan(stages=stages, model_configs=tuple(stage_model_config(s, origin) for s in stages), origin=origin,
                   deepspeed=deepspeed, world_size=world_size, files=files)
