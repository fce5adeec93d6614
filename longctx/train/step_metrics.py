"""A step's logged record: what train_step measured, with throughput, MFU, memory and on CPU the
fraction of this machine's measured limit (train/metrics.py) derived from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from longctx.model.config import ModelConfig
from longctx.train.metrics import flops_per_token, peak_memory_bytes
from longctx.train.stage_limits import StageLimits
from longctx.train.step import StepResult, StepSetup


@dataclass
class StepRates:
    """What a stage's metrics are measured against."""
    flops_per_token: float
    peak_flops: float
    cpu_limits: Optional[StageLimits]  # CPU: this machine's best times of the stage's operations


def stage_rates(model_cfg: ModelConfig, setup: StepSetup, dtype: torch.dtype, peak_flops: float) -> StepRates:
    """A stage's rates: its FLOPs per token, the device's peak and, on CPU, this machine's GEMM
    and attention-kernel rates at the stage's shapes, measured on every rank at once."""
    cpu_limits = StageLimits(model_cfg, setup, dtype) if setup.device.type == "cpu" else None
    return StepRates(flops_per_token(model_cfg, setup.seq_len), peak_flops, cpu_limits)


def step_record(result: StepResult, setup: StepSetup, rates: StepRates) -> dict:
    """The metrics record of one step (metrics.jsonl, TensorBoard, the progress line)."""
    record = {"loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm, "tokens": result.tokens,
              **throughput(setup, rates, result.elapsed_s, result.data_wait_s, result.computed),
              "update_applied": result.update_applied}
    if rates.cpu_limits is not None:  # collective: every rank may re-measure the limits (train/stage_limits.py)
        record.update(rates.cpu_limits.fraction_for(result))
    return record


def throughput(setup: StepSetup, rates: StepRates, elapsed: float, t_data: float, computed: float) -> dict:
    """Throughput, utilisation and memory of a step that took `elapsed` seconds and ran the
    share `computed` of its columns. `slots`: the step's row positions, padding included (what
    tokens_per_s and MFU count, as peers count batch x sequence length)."""
    slots = setup.seq_len * setup.micro_batch_size * setup.grad_accum * setup.mesh.dp_size
    tps = slots / elapsed
    return {
        "slots": slots, "tokens_per_s": tps, "tokens_per_s_per_device": tps / setup.world,
        "mfu": rates.flops_per_token * tps * computed / setup.world / rates.peak_flops,
        "computed_fraction": computed, "peak_memory_gb": peak_memory_bytes() / 2**30,
        "data_wait_fraction": t_data / elapsed, "step_time_s": elapsed, "seq_len": setup.seq_len,
        "cp_size": setup.mesh.cp_size, "dp_size": setup.mesh.dp_size,
    }
