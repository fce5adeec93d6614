"""Processes of a multi-rank benchmark: a free TCP port, and world-N gloo groups spawned on this
machine whose ranks each return JSON rows to the parent."""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longctx.parallel.mesh import import_before_process_groups, shutdown_distributed

from .memory import return_freed_memory


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for MASTER_PORT / torchrun's --master-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_rank(rank: int, world: int, port: int, threads: int, deepspeed: bool = False) -> None:
    """Join the gloo group of `world` ranks at `port` with `threads` intra-op threads; big blocks
    are mmapped so freed tensors leave RSS at once. `deepspeed`: also DeepSpeed's comm layer."""
    return_freed_memory()
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import_before_process_groups(*(["deepspeed"] if deepspeed else []))
    if deepspeed:
        import logging

        import deepspeed as ds

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if deepspeed:
        ds.init_distributed(dist_backend="gloo")


def _rank_main(rank: int, fn: Callable, world: int, port: int, out: str, args: tuple) -> None:
    rows = fn(rank, world, port, *args)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(rows, f)
    shutdown_distributed(completed=True)


def spawn_group(fn: Callable, world: int, args: tuple = (), timeout: float | None = None,
                exit_reasons: dict[int, str] | None = None) -> tuple[list | None, str | None]:
    """Run `fn(rank, world, port, *args)` on `world` spawned processes (fn joins the group, e.g.
    with init_rank, and returns JSON-able rows). Returns (every rank's rows, None), or (None, why)
    when a rank failed or `timeout` seconds passed; `exit_reasons` names a rank's exit codes."""
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows")
        ctx = mp.start_processes(_rank_main, args=(fn, world, port, out, args), nprocs=world,
                                 start_method="spawn", join=False)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not ctx.join(timeout=5):
                if deadline is not None and time.monotonic() > deadline:
                    for p in ctx.processes:
                        p.kill()
                    return None, "timeout"
        except mp.ProcessExitedException as e:
            return None, (exit_reasons or {}).get(e.exit_code, f"exit {e.exit_code}")
        except mp.ProcessRaisedException as e:
            return None, str(e).strip().splitlines()[-1][:200]
        ranks = []
        for r in range(world):
            with open(f"{out}.{r}") as f:
                ranks.append(json.load(f))
        return ranks, None
