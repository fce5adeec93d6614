"""How long a collective may wait for its peers before the job treats a rank as lost.

Two limits (the habit of torchtitan's `comm.train_timeout_seconds`): a long one while the job
starts -- process groups, loading, the engine build and the first step, which compiles and
warms caches -- and a short one from the first finished step on, so a hung rank costs minutes,
not the 30 minutes of torch's default. Both reach every process group the job made (ours and
DeepSpeed's), gloo and NCCL alike; NCCL's async error handling is switched on before its first
group, so a timed-out collective aborts instead of blocking forever.
"""
from __future__ import annotations

import datetime
import os

import torch.distributed as dist
from torch.distributed import distributed_c10d

from longctx.parallel.timeout_values import DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_TIMEOUT_S, timeout_problem

__all__ = ["DEFAULT_STARTUP_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "as_timedelta", "enable_nccl_async_errors",
           "set_collective_timeout", "timeout_problem"]


def enable_nccl_async_errors() -> None:
    """A timed-out NCCL collective aborts its communicator (and the process) instead of blocking
    the rank for good; a value the user set wins. Read by torch when an NCCL group is created."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")


def as_timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def set_collective_timeout(seconds: float) -> int:
    """Every process group of this rank (the world's, the cp/dp groups, DeepSpeed's) waits at
    most `seconds` for a collective issued from now on. Returns how many groups were changed."""
    if not dist.is_initialized():
        return 0
    changed = 0
    for group in list(distributed_c10d._world.pg_map):
        if distributed_c10d._rank_not_in_group(group):
            continue
        distributed_c10d._set_pg_timeout(as_timedelta(seconds), group)
        changed += 1
    return changed
