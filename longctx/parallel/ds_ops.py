"""DeepSpeed's JIT-built C++ ops and the build lock in torch's extensions cache.

DeepSpeed compiles some ops on first use into torch's extensions cache (on a CPU machine its
shared-memory collectives, `deepspeed_shm_comm`, at engine start; `cpu_adam` with optimizer
offload), under a lock file that torch takes even to load an op built earlier. A process
killed while holding it (preemption, a time limit, scancel) leaves the file, and torch waits
on it forever: every later job sharing the cache would hang at engine start.

Before DeepSpeed loads an op, `guard_build_locks` looks at its lock: one released within
LOCK_STALE_S is another process's build finishing; one older than that was left by a dead
build, and this job builds its ops in a job-private extensions directory instead, with a
warning naming the lock and how to clear it. `python -m longctx.parallel.ds_ops [--offload]`
builds the ops ahead of time (scripts/bootstrap.sh runs it), so jobs only load them.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

import torch
from torch.utils.cpp_extension import get_default_build_root

log = logging.getLogger("longctx.parallel")
LOCK_STALE_S = 60.0  # longer than a real build of these ops takes on a small CPU
_BUILDERS = {"shm_comm": "ShareMemCommBuilder", "cpu_adam": "CPUAdamBuilder"}


def extensions_root() -> Path:
    """Where torch builds JIT extensions (mirrors torch.utils.cpp_extension's choice)."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    if torch.version.hip is not None:
        accelerator = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{python}_{accelerator}"


def job_private_root() -> Path:
    """One directory per job attempt and node, the same for all of its local ranks."""
    keys = ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
            "MASTER_ADDR", "MASTER_PORT")
    job = "|".join(os.environ.get(k, "") for k in keys)
    if not job.strip("|"):
        job = str(os.getpid())  # a single process without a launcher
    digest = hashlib.sha1(job.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"longctx-torch-extensions-{digest}"


def _jit_builders(offload_optimizer: bool) -> list:
    """DeepSpeed's builders of the ops it will JIT-build for this job."""
    import deepspeed.ops  # lazy: deepspeed is heavy to import (see parallel/zero.py)
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    wanted = (["shm_comm"] if get_accelerator().device_name() == "cpu" else []) + (
        ["cpu_adam"] if offload_optimizer else [])
    builders = []
    for key in wanted:
        builder = get_accelerator().create_op_builder(_BUILDERS[key])
        if builder is None or installed_ops.get(builder.NAME):  # absent here, or prebuilt into the wheel
            continue
        if key == "shm_comm" and not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            continue  # DeepSpeed skips the op, so there is nothing to build
        builders.append(builder)
    return builders


def jit_ops(offload_optimizer: bool) -> list[str]:
    """Names (build directories) of the ops DeepSpeed will JIT-build for this job."""
    return [builder.NAME for builder in _jit_builders(offload_optimizer)]


def _lock_age(lock: Path) -> float | None:
    try:
        return time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return None


def guard_build_locks(ops: Iterable[str], *, stale_after: float = LOCK_STALE_S, poll_s: float = 0.5) -> None:
    """Wait while a fresh build lock of `ops` is held; on a stale one, build in a job-private
    directory (sets TORCH_EXTENSIONS_DIR for this process, with a warning)."""
    root = extensions_root()
    for name in ops:
        lock = root / name / "lock"
        while (age := _lock_age(lock)) is not None:
            if age > stale_after:
                private = job_private_root()
                private.mkdir(parents=True, exist_ok=True)
                os.environ["TORCH_EXTENSIONS_DIR"] = str(private)
                log.warning("stale DeepSpeed build lock %s (%.0f s old: a build killed mid-way leaves it); "
                            "building in %s for this job instead. If no build is running, clear it: rm %s",
                            lock, age, private, lock)
                return
            time.sleep(poll_s)


def build_ahead(offload_optimizer: bool = False) -> list[str]:
    """Build (or load) the ops now, e.g. at setup time; returns their names."""
    builders = _jit_builders(offload_optimizer)
    guard_build_locks(b.NAME for b in builders)
    for builder in builders:
        builder.load()
    return [b.NAME for b in builders]


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    built = build_ahead(offload_optimizer="--offload" in sys.argv[1:])
    print(f"[longctx] DeepSpeed ops ready: {', '.join(built) or 'none needed'} (in {extensions_root()})",
          file=sys.stderr)
