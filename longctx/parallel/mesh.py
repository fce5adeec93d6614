"""Process setup from any launcher's environment, and the dp x cp arrangement of ranks.

Ranks are laid out cp-innermost: rank = dp_index * cp_size + cp_index, so a cp group is a
block of consecutive ranks (one node's GPUs first, where the fast links are).
"""
from __future__ import annotations

import importlib
import os
import socket
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from longctx.parallel.timeouts import (
    DEFAULT_STARTUP_TIMEOUT_S,
    as_timedelta,
    enable_nccl_async_errors,
    set_collective_timeout,
)
from longctx.runtime.launch_env import DistEnv, read_env
from longctx.runtime.third_party_logs import quiet_other_ranks


def init_distributed(timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S, preload: Sequence[str] = ()) -> DistEnv:
    """Initialise torch.distributed (NCCL on GPUs, gloo on CPU). A single process still gets a
    1-rank gloo group so that every code path (ZeRO, collectives) is the same. `timeout_s`: the
    collective timeout while the job starts (parallel/timeouts.py). `preload`: more modules to
    import before the group exists (see import_before_process_groups)."""
    info = read_env()
    if dist.is_initialized():
        return info
    quiet_other_ranks(info.rank)  # before DeepSpeed (in preload) is imported and prints its notices
    import_before_process_groups(*preload)
    if not torch.cuda.is_available():
        configure_cpu_threads(info.local_rank, _local_world_size(info))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if info.launcher == "single":
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    else:
        os.environ.setdefault("MASTER_PORT", "29500")
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(info.rank), str(info.world_size)
    os.environ["LOCAL_RANK"] = str(info.local_rank)
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
        backend = "nccl"
        enable_nccl_async_errors(timeout_s)
    else:
        backend = "gloo"
    dist.init_process_group(backend, rank=info.rank, world_size=info.world_size,
                            timeout=as_timedelta(timeout_s))
    set_collective_timeout(timeout_s)  # point-to-point waits too
    return info


def _local_world_size(info: DistEnv) -> int:
    env = os.environ
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if env.get(key, "").isdigit():
            return max(1, int(env[key]))
    return info.world_size  # one node (the DeepSpeed launcher and mp.spawn set no local size)


def configure_cpu_threads(local_rank: int, local_world: int, pin: Optional[bool] = None) -> tuple[int, list[int]]:
    """CPU ranks: intra-op threads = this process's CPUs / ranks on the node, unless the user
    set OMP_NUM_THREADS (launch/env.sh sets the same default); with no setting torch would run
    every rank with all the node's cores (2 ranks x 2 threads on 2 cores: oversubscribed).
    pin (default: when the ranks tile the CPUs exactly and the user set no threads) binds each
    rank to its own block of CPUs, so the ranks' threads never share a core. Returns (threads,
    the CPUs this rank may run on)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    user_threads = os.environ.get("OMP_NUM_THREADS", "").isdigit()
    threads = int(os.environ["OMP_NUM_THREADS"]) if user_threads else max(1, len(cpus) // max(1, local_world))
    if pin is None:
        pin = not user_threads and threads * local_world == len(cpus)
    if pin and hasattr(os, "sched_setaffinity") and 0 <= local_rank < local_world:
        cpus = cpus[local_rank * threads:(local_rank + 1) * threads]
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)
    return threads, cpus


def import_before_process_groups(*modules: str) -> None:
    """Import torch._dynamo (and `modules`, e.g. "deepspeed") before any process group exists.

    Importing either keeps references to the process groups alive at that moment (torch 2.13,
    DeepSpeed 0.19), out of reach of destroy_process_group: such a group keeps its gloo
    threads and is destroyed, if at all, in interpreter shutdown, where a rank can die with
    SIGABRT. torch._dynamo is imported lazily by the first call of a torch.library custom op
    (the CP attention op), DeepSpeed by the trainer; both paths pay the import anyway.
    tests/integration/test_process_group_teardown.py checks that every group is freed."""
    for name in ("torch._dynamo", *modules):
        importlib.import_module(name)


def last_barrier() -> None:
    """The ranks of a completed job meet before teardown: a rank that leaves while another still
    talks to the group (rank 0 writing reports, say) gets its gloo threads killed mid-operation
    and the process dies with SIGABRT at exit. Raises what the barrier raises: a caller under a
    stall watch lets a lost peer end the job as a stall (the watch must still run here, or a
    node lost at the end leaves this rank and its launcher waiting)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown_distributed(completed: bool) -> None:
    """Tear the process group down; after a completed job (`completed`) the ranks first meet at
    last_barrier, unless the caller has. After a failure no barrier (the other ranks may be
    gone); errors here are not worth masking the job's."""
    if not dist.is_initialized():
        return
    try:
        if completed:
            last_barrier()
    except Exception:  # noqa: BLE001 - teardown must not replace the job's result
        pass
    try:
        ds_comm = sys.modules.get("deepspeed.comm")
        if ds_comm is not None and ds_comm.is_initialized():
            ds_comm.destroy_process_group()  # also drops DeepSpeed's own references to the groups
        else:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Mesh:
    """This rank's place in the dp x cp grid and the process groups of its row and column."""

    dp_size: int
    cp_size: int
    dp_rank: int
    cp_rank: int
    cp_group: Optional[dist.ProcessGroup]
    dp_group: Optional[dist.ProcessGroup]
    cp_ranks: list[int]


def build_mesh(cp_size: int, timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> Mesh:
    """Create the groups (every rank must call this, in the same order); `timeout_s` as in
    init_distributed (set_collective_timeout changes it later)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % cp_size != 0:
        raise ValueError(f"cp_size {cp_size} does not divide world size {world}")
    dp_size = world // cp_size
    cp_group = dp_group = None
    my_cp_ranks: list[int] = []
    for d in range(dp_size):
        ranks = list(range(d * cp_size, (d + 1) * cp_size))
        group = dist.new_group(ranks, timeout=as_timedelta(timeout_s))
        if rank in ranks:
            cp_group, my_cp_ranks = group, ranks
    for c in range(cp_size):
        ranks = list(range(c, world, cp_size))
        group = dist.new_group(ranks, timeout=as_timedelta(timeout_s))
        if rank in ranks:
            dp_group = group
    return Mesh(dp_size, cp_size, rank // cp_size, rank % cp_size, cp_group, dp_group, my_cp_ranks)
