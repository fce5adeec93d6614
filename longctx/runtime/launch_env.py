"""What the launcher told this process: its global rank, the world size and its local rank.

Read from the environment only (no torch import), so that the command line can act on the
rank before anything heavy loads (longctx/runtime/third_party_logs.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    launcher: str  # torchrun | slurm | mpi | single

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env() -> DistEnv:
    """torchrun, `accelerate launch` and the DeepSpeed launcher set RANK/WORLD_SIZE/LOCAL_RANK;
    `srun` without torchrun sets SLURM_*; mpirun sets OMPI_COMM_WORLD_*."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), "torchrun")
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        return DistEnv(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)), "slurm")
    if "OMPI_COMM_WORLD_RANK" in env:
        return DistEnv(int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"]),
                       int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)), "mpi")
    return DistEnv(0, 1, 0, "single")
