"""`train --dry-run`: build the model of every stage on the meta device, report parameters and
a per-device memory estimate, without allocating or starting processes."""
from __future__ import annotations

from longctx.config import TrainConfig, resolve_stages, stage_model_config
from longctx.model import build_model, count_parameters
from longctx.plan import estimate_memory, format_estimate


def dry_run(cfg: TrainConfig, world_size: int) -> str:
    lines = []
    for stage in resolve_stages(cfg):
        model_cfg = stage_model_config(stage)
        model = build_model(model_cfg, device="meta")
        n = count_parameters(model)
        cp = stage.parallel.cp_size
        lines.append(f"stage {stage.index} ({stage.name}): seq_len {stage.seq_len}, steps {stage.steps}, "
                     f"cp {cp} x dp {world_size // cp}, rope {model_cfg.rope_type}, params {n:,}")
        lines.append(format_estimate(estimate_memory(cfg, stage, model_cfg, world_size)))
    return "\n".join(lines)
