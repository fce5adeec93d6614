"""How long a collective may wait for its peers before the job treats a rank as lost.

Two limits (the habit of torchtitan's `comm.train_timeout_seconds`): a long one while the job
starts -- process groups, loading, the engine build and the first step, which compiles and
warms caches -- and a short one from the first finished step on, so a hung rank costs minutes,
not the 30 minutes of torch's default. Both reach every process group the job made (ours and
DeepSpeed's), gloo and NCCL alike, and every point-to-point wait of the ring and Ulysses
(parallel/comm.py reads `p2p_timeout`).

On NCCL the limits keep this order, so that a stall always ends through the Python handler
(exit 86 and STALLED, runtime/watchdog.py), never through NCCL's own abort (SIGABRT, no marker):
1. a collective times out after the collective timeout: NCCL aborts its communicators but not
   the process (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, "clean up only"), and the waiting Python call
   raises;
2. a rank whose main thread never sees that error is ended by the watch's own limit, which is at
   least the collective timeout (timeouts.py holds no limit of its own past this one);
3. NCCL's heartbeat monitor, which ends the process when NCCL's own watchdog thread hangs, waits
   longer than every Python limit (`nccl_environment`), and dump-on-timeout, whose path ends the
   process after writing its dump, is off.
docs/operations.md ("When a rank hangs") explains the choice.
"""
from __future__ import annotations

import datetime
import logging
import math
import os

import torch.distributed as dist
from torch.distributed import distributed_c10d

from longctx.parallel.timeout_values import DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_TIMEOUT_S, timeout_problem

__all__ = ["DEFAULT_STARTUP_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "NCCL_CLEAN_UP_ONLY", "as_timedelta",
           "enable_nccl_async_errors", "nccl_environment", "p2p_timeout", "set_collective_timeout",
           "timeout_problem"]

NCCL_CLEAN_UP_ONLY = "2"  # TORCH_NCCL_ASYNC_ERROR_HANDLING: abort the communicators, raise; the process lives
NCCL_MODES_THAT_KILL = {"1": "tear down", "3": "skip clean-up"}  # these end the process with SIGABRT
NCCL_HEARTBEAT_MARGIN_S = 120.0  # past the longest Python limit and the stall report's own deadline

log = logging.getLogger("longctx.parallel")
_current_s = DEFAULT_STARTUP_TIMEOUT_S  # the collective timeout of this rank now


def nccl_environment(startup_timeout_s: float) -> dict[str, str]:
    """NCCL's error settings for a job whose longest Python limit is `startup_timeout_s` (the
    slow phases' and the start-up's; every in-step limit is shorter)."""
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": NCCL_CLEAN_UP_ONLY,
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(math.ceil(startup_timeout_s + NCCL_HEARTBEAT_MARGIN_S))}


def enable_nccl_async_errors(startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S, env=os.environ) -> None:
    """NCCL's error settings (nccl_environment), before the first NCCL group: read by torch when
    a group is created. A value the user set wins; one that lets NCCL end the process first is
    named in a warning (the stall then ends with SIGABRT: no STALLED, no requeue)."""
    for key, value in nccl_environment(startup_timeout_s).items():
        env.setdefault(key, value)
    mode = env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    if mode in NCCL_MODES_THAT_KILL:
        log.warning("TORCH_NCCL_ASYNC_ERROR_HANDLING=%s (%s) ends a process whose collective timed out with "
                    "SIGABRT before longctx can report it: a stall then leaves no STALLED and is not requeued; "
                    "unset it to get %s (docs/operations.md)", mode, NCCL_MODES_THAT_KILL[mode], NCCL_CLEAN_UP_ONLY)
    heartbeat = env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]
    if heartbeat.isdigit() and int(heartbeat) < startup_timeout_s:
        log.warning("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=%s is shorter than the start-up limit (%.0f s): NCCL may end "
                    "a slow phase with SIGABRT before longctx reports it", heartbeat, startup_timeout_s)


def as_timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def p2p_timeout() -> datetime.timedelta:
    """What a point-to-point wait (the ring's, Ulysses') may last: the collective timeout now."""
    return as_timedelta(_current_s)


def set_collective_timeout(seconds: float) -> int:
    """Every process group of this rank (the world's, the cp/dp groups, DeepSpeed's) waits at
    most `seconds` for a collective issued from now on, and every point-to-point wait as long.
    Returns how many groups were changed."""
    global _current_s
    _current_s = seconds
    if not dist.is_initialized():
        return 0
    changed = 0
    for group in list(distributed_c10d._world.pg_map):
        if distributed_c10d._rank_not_in_group(group):
            continue
        distributed_c10d._set_pg_timeout(as_timedelta(seconds), group)
        changed += 1
    return changed
