"""Non-finite guard: a step whose loss or gradient norm is NaN/inf never updates the weights,
and non-finite weights never reach a checkpoint.

How a bad step is dropped without an extra collective on the fast path: a rank whose local
loss is not finite multiplies its backward by NaN (a tensor op, no sync), so the gradients of
the whole step turn non-finite; DeepSpeed's overflow check (its global gradient norm, already
all-reduced) then skips the update on every rank. The one path DeepSpeed does not guard, a
plain torch optimizer (ZeRO-0, fp32), is skipped by the trainer itself.
The decision after the step reads the all-reduced loss and the global gradient norm, which
every rank already holds, so all ranks agree.

Policies (`train.nonfinite`): `stop` ends the run after `train.max_nonfinite_steps`
consecutive bad steps with NONFINITE_EXIT_CODE and a one-line message naming the step;
`skip_step` drops every bad step's update and trains on.
"""
from __future__ import annotations

import logging
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

NONFINITE_EXIT_CODE = 3
NONFINITE_MARKER = "NONFINITE"  # written in the run directory (holds the step) when the run stops
log = logging.getLogger("longctx.train")


class NonFiniteStop(Exception):
    """The run stops because of non-finite values; the message is one line for the user."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def backward_factor(loss: torch.Tensor) -> torch.Tensor:
    """1, or NaN where `loss` is not finite: multiplying the backward by it makes the step's
    gradients non-finite, so the optimizer's overflow check drops the update (no sync)."""
    return torch.where(torch.isfinite(loss.detach()), 1.0, float("nan")).to(loss.dtype)


@contextmanager
def optimizer_step_skipped(optimizer: torch.optim.Optimizer):
    """Within the block, `optimizer.step()` does nothing (no moments, no weight decay): the
    engine's step still runs its bookkeeping and clears the gradients."""
    optimizer.step = lambda *args, **kwargs: None  # shadows the class's step on this instance
    try:
        yield
    finally:
        del optimizer.step


def local_weights_finite(model: torch.nn.Module) -> bool:
    """This rank's weights (its ZeRO-3 partition where parameters are partitioned)."""
    for p in model.parameters():
        data = getattr(p, "ds_tensor", None)
        data = p.data if data is None else data
        if data.numel() and not bool(torch.isfinite(data).all()):
            return False
    return True


def weights_finite(model: torch.nn.Module) -> bool:
    """True on every rank iff every rank's weights are finite (collective)."""
    flag = torch.tensor([1.0 if local_weights_finite(model) else 0.0])
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item() > 0)


class NonFiniteGuard:
    def __init__(self, policy: str, max_consecutive: int):
        self.policy = policy
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.skipped = 0

    @staticmethod
    def describe(loss: float, grad_norm: float) -> Optional[str]:
        """What is not finite in a step's loss / gradient norm, or None when both are."""
        bad = [name for name, v in (("loss", loss), ("gradient norm", grad_norm)) if not math.isfinite(v)]
        return " and ".join(bad) if bad else None

    def observe(self, step: int, loss: float, grad_norm: float, update_applied: bool,
                last_checkpoint: Optional[str]) -> bool:
        """After a step (numbered from 1): True if it was bad (its update dropped). Raises
        NonFiniteStop when the policy says stop, or when an update was applied anyway."""
        what = self.describe(loss, grad_norm)
        if what is None:
            self.consecutive = 0
            return False
        self.consecutive += 1
        self.skipped += 1
        kept = f"last checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint written yet"
        if update_applied:
            raise NonFiniteStop(f"train: non-finite {what} at step {step} and the optimizer applied the update; "
                                f"stopping before these weights are checkpointed ({kept})", step)
        if self.policy == "stop" and self.consecutive >= self.max_consecutive:
            raise NonFiniteStop(
                f"train: non-finite {what} at step {step} ({self.consecutive} consecutive, "
                f"train.max_nonfinite_steps={self.max_consecutive}); updates dropped, nothing checkpointed "
                f"from them ({kept}); lower optim.lr, raise optim.eps or set train.nonfinite=skip_step", step)
        return True


def report_stop(stop: NonFiniteStop, rank: int, out: Path) -> int:
    """One line on rank 0 (every rank agrees on the stop), the marker for launchers, the exit code."""
    if rank == 0:
        log.info("stopped: %s", stop)  # the console gets the error line below, the log file this
        print(f"error: {stop}", file=sys.stderr)
        (out / NONFINITE_MARKER).write_text(f"{stop.step}\n")
    else:
        log.error("%s", stop)
    return NONFINITE_EXIT_CODE
