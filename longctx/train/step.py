"""One optimizer step: grad_accum micro-batches -> (cp shards) -> scaled backward -> update; what
it measured (train/step_metrics.py turns it into the logged record).

Loss normalisation (why every dp x cp layout gives the same loss and update): with N the
number of real (weighted) label tokens in the whole optimizer step, summed over all ranks and
micro-batches, each rank backpropagates  loss_sum_rank_micro * world * grad_accum / N.
DeepSpeed divides by grad_accum and averages over the world, so the applied gradient is the
gradient of  sum(all token losses) / N  -- the single-device mean.

Host synchronisation: the step's numbers stay on the device while its micro-batches run. It
reads the host twice per optimizer step: the all-reduced label weight before the first
forward (the loss scale is a number DeepSpeed's backward takes) and the all-reduced loss
after the update (plus the gradient norm at the boundary), never once per micro-batch.
The loss by position bucket (per-bucket loss and weight sums from inside the chunked loss)
rides in the loss's all-reduce: no collective and no host read of its own.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn

from longctx.base.errors import UserError
from longctx.base.labels import IGNORE_INDEX
from longctx.model.llama import window_positions
from longctx.parallel.mesh import Mesh
from longctx.parallel.sharding import shard_batch
from longctx.train.nonfinite import backward_factor, optimizer_step_skipped


@dataclass
class StepSetup:
    """What a step of the current stage needs besides its batches."""
    mesh: Mesh
    world: int
    device: torch.device
    grad_accum: int
    micro_batch_size: int
    seq_len: int
    loss_chunk_size: int
    bucket_ends: tuple  # exclusive upper ends of the position buckets, the last the stage's seq_len
    loss_buckets: torch.Tensor  # (K,) int64 on the device: the same ends


@dataclass
class StepResult:
    """What one optimizer step did and how long it took."""
    loss: float  # the step's mean loss over its real (weighted) label tokens
    lr: float
    grad_norm: float
    tokens: int  # real (non-padding) tokens in the whole step
    update_applied: bool
    elapsed_s: float
    data_wait_s: float
    computed: float  # share of the columns run (unscored row tails are cut)
    micro_batches: int
    by_position: list  # [loss sums per position bucket, weight sums per bucket], over the whole step
    aux_loss: Optional[float] = None  # MoE load-balancing loss, the mean over the step's forward calls


def all_reduce_sum(values: torch.Tensor) -> list[float]:
    """Sum a 1-D tensor over the world and read it once (one host sync for all its entries)."""
    t = values.detach().to(torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.cpu().tolist()


def replicated_grad_norm(model: nn.Module) -> float:
    """L2 norm of the (already all-reduced, replicated) gradients, before clipping."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def to_rank(inputs: dict, setup: StepSetup) -> dict:
    """Model inputs (B, T) on this rank's device, cut to its zigzag cp shard (B, T / cp)."""
    inputs = {k: v.to(setup.device) for k, v in inputs.items()}
    if setup.mesh.cp_size > 1:
        inputs = shard_batch(inputs, setup.mesh.cp_rank, setup.mesh.cp_size)
    return inputs


def label_weight(inputs: dict) -> torch.Tensor:
    """This shard's real label tokens, weighted by loss_weights when present: a 0-d tensor on
    the shard's device (read with the step's other numbers, not here)."""
    valid = (inputs["labels"] != IGNORE_INDEX).to(torch.float64)  # (B, T)
    weights = inputs.get("loss_weights")
    return (valid * weights).sum() if weights is not None else valid.sum()


def forward_backward(engine, model: nn.Module, shards: list[dict], scale: float, setup: StepSetup):
    """Backward of every micro-batch's loss_sum * scale, then the engine's step. Returns
    (this rank's summed loss and its (2, K) loss / weight sums by position bucket as one float64
    device tensor (1 + 2K,), the gradient norm when the engine does not report it, whether the
    update was dropped for a non-finite gradient)."""
    loss_total, grad_norm, dropped = None, None, False
    for inputs in shards:
        loss_sum, _, by_bucket = engine(inputs["input_ids"], position_ids=inputs["position_ids"],
                                        segment_ids=inputs.get("segment_ids"), labels=inputs["labels"],
                                        token_mask=inputs.get("token_mask"),
                                        loss_weights=inputs.get("loss_weights"),
                                        loss_chunk_size=setup.loss_chunk_size, loss_buckets=setup.loss_buckets)
        objective = loss_sum * scale
        aux = model.auxiliary_loss()  # this rank's share of the forward call's MoE loss (times its coefficient)
        if aux is not None:
            # the shares of a cp group sum to the call's loss; DeepSpeed averages over dp x cp and
            # micro-batches, so x cp_size makes the update the mean of the calls' losses
            objective = objective + aux * setup.mesh.cp_size
        engine.backward(objective * backward_factor(objective))  # see train/nonfinite.py
        if engine.is_gradient_accumulation_boundary() and engine.zero_optimization_stage() == 0:
            grad_norm = replicated_grad_norm(model)  # DeepSpeed does not report it without ZeRO
            # a plain torch optimizer (no bf16/fp16 wrapper) has no overflow check of its own
            dropped = not math.isfinite(grad_norm) and not (engine.bfloat16_enabled() or engine.fp16_enabled())
        with optimizer_step_skipped(engine.optimizer) if dropped else contextlib.nullcontext():
            engine.step()
        aux_value = model.aux_loss_value()  # logged: the sum of a cp group's shares is the call's loss
        aux_value = loss_sum.new_zeros(()) if aux_value is None else aux_value
        loss = torch.cat([loss_sum.detach().reshape(1), by_bucket.flatten(),
                          aux_value.detach().reshape(1).to(loss_sum.device)]).to(torch.float64)  # (1 + 2K + 1,)
        loss_total = loss if loss_total is None else loss_total + loss
    return loss_total, grad_norm, dropped


def train_step(engine, model: nn.Module, batches: Iterator[dict], lr: float, setup: StepSetup) -> StepResult:
    """One optimizer step on the next grad_accum batches (ModelInputs)."""
    t0 = time.perf_counter()
    micro = [next(batches) for _ in range(setup.grad_accum)]
    t_data = time.perf_counter() - t0
    set_lr(engine.optimizer, lr)
    columns = sum(inputs["labels"].shape[1] for inputs in micro)  # after the unscored tails were cut
    for inputs in micro:  # the global positions, before any shard or collective (on the host: no sync)
        window_positions(model.config, inputs["position_ids"], "a training batch's position_ids")
    shards = [to_rank(inputs, setup) for inputs in micro]
    # every rank of a cp group holds the same rows: the world's sum counts each row cp times
    real = torch.stack([real_tokens(inputs, setup) for inputs in micro]).sum() / setup.mesh.cp_size
    weight = torch.stack([label_weight(s) for s in shards]).sum()
    total_weight, real = all_reduce_sum(torch.stack([weight, real.to(weight.device)]))
    if total_weight <= 0:
        raise UserError("data: a whole optimizer step has no label tokens (all labels ignored)")
    scale = setup.world * setup.grad_accum / total_weight
    loss_total, grad_norm, dropped = forward_backward(engine, model, shards, scale, setup)
    global_loss, *by_position, aux_total = all_reduce_sum(loss_total)
    elapsed = time.perf_counter() - t0
    if grad_norm is None:
        grad_norm = engine.get_global_grad_norm()
    return StepResult(loss=global_loss / total_weight, lr=lr,
                      grad_norm=float(grad_norm) if grad_norm is not None else float("nan"), tokens=int(round(real)),
                      update_applied=not dropped and engine.was_step_applied(), elapsed_s=elapsed,
                      data_wait_s=t_data, computed=columns / (setup.seq_len * len(micro)),
                      micro_batches=len(micro), by_position=by_position,
                      aux_loss=aux_total / (setup.mesh.dp_size * len(micro)) if model.aux_loss_value() is not None
                      else None)


def real_tokens(inputs: dict, setup: StepSetup) -> torch.Tensor:
    """A micro-batch's non-padding tokens (all its slots when the batch does not say): a float64
    0-d tensor on the batch's (host) device, read with the step's other numbers."""
    if "real_tokens" in inputs:
        return inputs["real_tokens"].sum().to(torch.float64)
    return torch.tensor(float(inputs["input_ids"].shape[0] * setup.seq_len), dtype=torch.float64)
