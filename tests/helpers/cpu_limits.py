"""A fake machine for train/stage_limits.py: measure_cpu_limits replaced by measurements that
return chosen best times and cost chosen seconds of a fake clock, and the step results to
feed StageLimits.fraction_for."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from longctx.model.config import ModelConfig
from longctx.train import stage_limits
from longctx.train.step import StepResult, StepSetup

TINY_CFG = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
SETUP = StepSetup(SimpleNamespace(cp_size=1), world=1, device=torch.device("cpu"), grad_accum=1, micro_batch_size=1,
                  seq_len=64, loss_chunk_size=32, count_attention_pairs=True)


def fake_limits(op_seconds: float) -> dict:
    """Limits of one linear layer and one attention call of op_seconds each (a full step's limit:
    2 * op_seconds)."""
    ops = [{"kind": "linear", "shape": [1, 64, 64, 64], "count": 1, "flops": 1e6, "seconds": op_seconds},
           {"kind": "attention", "shape": [4, 2, 64, 16], "count": 1, "flops": 1e6, "seconds": op_seconds}]
    return {"ops": ops, "threads": 1, "micro_batch_size": 1, "gemm_flops_per_s": 1e6 / op_seconds,
            "attention_flops_per_s": 1e6 / op_seconds}


class FakeMachine:
    """Stands in for measure_cpu_limits: its i-th measurement returns fake_limits(op_seconds[i])
    (the last one repeated) and advances `clock` by `cost` seconds; `calls` holds each call's
    keyword arguments."""

    def __init__(self, op_seconds: list[float], cost: float = 0.0):
        self.op_seconds, self.cost = op_seconds, cost
        self.now = 0.0
        self.calls: list[dict] = []

    def clock(self) -> float:
        return self.now

    def measure(self, *args, **kwargs) -> dict:
        self.calls.append(dict(kwargs, args=args))
        self.now += self.cost
        return fake_limits(self.op_seconds[min(len(self.calls), len(self.op_seconds)) - 1])

    def install(self) -> "FakeMachine":
        """Replace measure_cpu_limits where StageLimits calls it (in this process)."""
        stage_limits.measure_cpu_limits = self.measure
        return self

    def limits(self, **kwargs) -> stage_limits.StageLimits:
        """A stage's limits on this machine (measured once)."""
        return stage_limits.StageLimits(TINY_CFG, SETUP, torch.float32, clock=self.clock, **kwargs)


def step(elapsed_s: float) -> StepResult:
    """A step of one full micro-batch that took elapsed_s."""
    return StepResult(loss=1.0, lr=1e-3, grad_norm=1.0, tokens=64, update_applied=True, elapsed_s=elapsed_s,
                      data_wait_s=0.0, computed=1.0, attention_fraction=None, micro_batches=1)
