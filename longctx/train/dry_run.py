"""`train --dry-run`: build the model of every stage on the meta device, report parameters and
the memory planner's estimate per process, without allocating or starting processes.

The estimate is `longctx plan`'s (the same function and device semantics): per GPU for a
config written for GPUs (its `# cluster:` line) or on a machine with one, else host memory per
process (CPU, gloo), each checked against the memory it would have when that is known.
"""
from __future__ import annotations

from typing import Optional

from longctx.config import RunPlan, TrainConfig, derive_plan
from longctx.model import build_model, count_parameters
from longctx.plan import estimate_memory, format_estimate
from longctx.plan.layout import parameter_counts
from longctx.plan.target import cluster_line, memory_per_process, planned_device, this_machine_device


def dry_run(cfg: TrainConfig, world_size: int, config_path: Optional[str] = None,
            plan: Optional[RunPlan] = None) -> str:
    """`plan`: validate_config's for `cfg` (derived here, unchecked, when not given)."""
    plan = plan or derive_plan(cfg, world_size)
    cluster = cluster_line(config_path)
    device = planned_device(cluster, fallback=this_machine_device())
    device_bytes, _ = memory_per_process(device, cluster, world_size)
    lines = []
    for stage, model_cfg in zip(plan.stages, plan.model_configs):
        # the native model on the meta device; a transformers-path model's exact count from its class
        n = (parameter_counts(model_cfg)["total"] if hasattr(model_cfg, "hf")
             else count_parameters(build_model(model_cfg, device="meta")))
        cp = stage.parallel.cp_size
        lines.append(f"stage {stage.index} ({stage.name}): seq_len {stage.seq_len}, steps {stage.steps}, "
                     f"cp {cp} x dp {world_size // cp}, rope {model_cfg.rope_type}, params {n:,}")
        lines.append(format_estimate(estimate_memory(cfg, stage, model_cfg, world_size, device=device,
                                                       deepspeed=plan.deepspeed), device_bytes))
    return "\n".join(lines)
