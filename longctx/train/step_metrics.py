"""A step's logged record: what train_step measured, with throughput, MFU and memory derived
from it. No collective and no measurement: the numbers are the step's own."""
from __future__ import annotations

from dataclasses import dataclass

from longctx.model.config import ModelConfig
from longctx.train.metrics import peak_memory_bytes
from longctx.train.mfu import flops_per_token
from longctx.train.positions import means_by_position, split_sums
from longctx.train.step import StepResult, StepSetup


@dataclass(frozen=True)
class StepRates:
    """What a stage's metrics are measured against."""
    flops_per_token: float
    peak_flops: float


def stage_rates(model_cfg: ModelConfig, setup: StepSetup, peak_flops: float) -> StepRates:
    return StepRates(flops_per_token(model_cfg, setup.seq_len), peak_flops)


def step_record(result: StepResult, setup: StepSetup, rates: StepRates) -> dict:
    """The metrics record of one step (metrics.jsonl, TensorBoard, the progress line)."""
    sums, counts = split_sums(result.by_position, len(setup.bucket_ends))
    moe = {} if result.aux_loss is None else {"moe_aux_loss": result.aux_loss}  # MoE models only
    return {"loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm, "tokens": result.tokens,
            **moe, **throughput(setup, rates, result.elapsed_s, result.data_wait_s, result.computed),
            "loss_by_position": means_by_position(sums, counts, setup.bucket_ends),
            "update_applied": result.update_applied}


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
