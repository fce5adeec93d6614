"""The CPU limits a stage's steps are measured against (train/metrics.py), and each step's
cpu_mfu: the limits are re-measured when a step beats them, and a fraction above 1 is never
logged.

A limit is each operation's best time while measuring; measured on a loaded machine, a later
step on a quieter one runs faster than it (cpu_mfu > 1). Such a step triggers a re-measure on
every rank at once (the ranks share the cores as in the step; they agree through one MAX
all-reduce), merged with the earlier ones (best_limits: each operation's best time).
Re-measures are capped by time: together they take at most REMEASURE_BUDGET of the stage's
step time so far, the next one estimated as long as the last measurement (a run of
millisecond steps never spends seconds re-measuring). A step still above 1, or one whose
re-measure the budget does not allow yet, logs cpu_mfu null with cpu_limits_stale true.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from longctx.model.config import ModelConfig
from longctx.train.metrics import best_limits, cpu_limit_fraction, measure_cpu_limits
from longctx.train.step import StepResult, StepSetup

LIMIT_SECONDS = 0.25  # each operation's repeats per measurement
REMEASURE_BUDGET = 0.05  # re-measures take at most this share of the stage's step time


def agree_max(values: list[float]) -> list[float]:
    """Each value's maximum over the ranks (a CPU all-reduce on the default group); the values
    themselves in a single process."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


class StageLimits:
    """A stage's measured limits (measured on construction: call it on every rank at once)
    and the cpu_mfu of its steps (fraction_for, also on every rank: it may re-measure)."""

    def __init__(self, model_cfg: ModelConfig, setup: StepSetup, dtype: torch.dtype, clock=time.perf_counter,
                 budget: float = REMEASURE_BUDGET):
        self.model_cfg, self.setup, self.dtype = model_cfg, setup, dtype
        self.clock, self.budget = clock, budget
        self.limits = None
        self.measurements = 0
        self.last_measure_s = self.remeasure_s = self.step_s = 0.0
        self.measure()

    def measure(self) -> float:
        """Measure the limits once more and keep each operation's best time; returns the seconds it took."""
        setup, start = self.setup, self.clock()
        new = measure_cpu_limits(self.model_cfg, setup.seq_len, cp_size=setup.mesh.cp_size, dtype=self.dtype,
                                 seconds=LIMIT_SECONDS, micro_batch_size=setup.micro_batch_size,
                                 loss_chunk_size=setup.loss_chunk_size)
        self.limits = best_limits(self.limits, new)
        self.measurements += 1
        self.last_measure_s = self.clock() - start
        return self.last_measure_s

    def fraction_for(self, result: StepResult) -> dict:
        """The step's cpu_mfu (None when above 1 even after a re-measure the budget allowed),
        gemm_limit_s, attention_limit_s, cpu_limits_stale and cpu_limit_measurements."""
        self.step_s += result.elapsed_s
        fraction = self._fraction(result)
        worst, overrun = agree_max([fraction["cpu_mfu"], self._budget_overrun()])
        if worst > 1.0 and overrun <= 0.0:
            self.remeasure_s += self.measure()
            fraction = self._fraction(result)
        stale = fraction["cpu_mfu"] > 1.0
        return dict(fraction, cpu_mfu=None if stale else fraction["cpu_mfu"], cpu_limits_stale=stale,
                    cpu_limit_measurements=self.measurements)

    def _fraction(self, result: StepResult) -> dict:
        return cpu_limit_fraction(self.limits, result.elapsed_s, micro_batches=result.micro_batches,
                                  computed=result.computed, attention_fraction=result.attention_fraction)

    def _budget_overrun(self) -> float:
        """Seconds by which one more re-measure, as long as the last measurement, would exceed the budget."""
        return self.remeasure_s + self.last_measure_s - self.budget * self.step_s
