"""Run a function on N spawned CPU processes joined in a gloo process group (for CP tests).

    results = run_distributed(worker, world_size, *args)   # list of each rank's return value

The worker is `worker(rank, world_size, *args)`, a module-level function (spawn pickles it
by name). Failures in any rank raise in the caller; a hang is cut off by `timeout`.
"""
from __future__ import annotations

import os
import pickle
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.train import free_port
from longctx.parallel.mesh import import_before_process_groups, shutdown_distributed


def _entry(rank, world_size, port, outdir, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # N processes share the machine's cores
    import_before_process_groups()  # else the groups outlive shutdown (see its docstring)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    try:
        result = ("ok", fn(rank, world_size, *args))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        result = ("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # every rank finishes before anyone tears the group down (rank 0 hosts the TCP store)
    shutdown_distributed(completed=True)


def run_distributed(fn, world_size: int, *args, timeout: float = 240.0):
    with tempfile.TemporaryDirectory() as outdir:
        ctx = mp.start_processes(_entry, args=(world_size, free_port(), outdir, fn, args), nprocs=world_size,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"distributed test did not finish within {timeout}s (hang?)")
        results = []
        for r in range(world_size):
            with open(os.path.join(outdir, f"rank{r}.pkl"), "rb") as f:
                status, value = pickle.load(f)
            if status != "ok":
                raise AssertionError(value)
            results.append(value)
        return results


def max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.float() - want.float()).abs().max().item()


def check_all(results, min_checks: int):
    """results: per-rank lists of (case, what, err, tol). Asserts every comparison, and that
    at least `min_checks` comparisons were made on every rank."""
    failures = []
    for rank, checks in enumerate(results):
        assert len(checks) >= min_checks, f"rank {rank} made {len(checks)} comparisons, expected >= {min_checks}"
        for case, what, err, tol in checks:
            if not err <= tol:  # also catches NaN
                failures.append(f"rank {rank} {case} {what}: err {err:.3e} > tol {tol:.1e}")
    assert not failures, "\n".join(failures[:40])
