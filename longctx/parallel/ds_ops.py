"""DeepSpeed's JIT-built C++ ops: which ones a run needs, each built once per environment.

DeepSpeed compiles some ops on first use into torch's extensions cache:

- `deepspeed_shm_comm`: DeepSpeed's CPU accelerator builds it when its comm backend starts,
  for `inference_all_reduce` (tensor-parallel inference) alone. Training's collectives, ours
  and ZeRO's, go through torch.distributed (gloo, NCCL). `skip_unused_ops` marks the op
  incompatible in DeepSpeed's own op table (`deepspeed.ops.__compatible_ops__`, the switch
  DeepSpeed itself consults to skip the op where it cannot be built), so a run builds nothing.
- `cpu_adam`: optimizer offload needs it. `longctx setup` (scripts/bootstrap.sh runs it) builds
  it ahead; at run time `ensure_built` builds it under a lock judged by the liveness of its
  holder (longctx/storage/locks.py): one process builds, the others wait with a line naming it.

torch's own lock (`<op>/lock` in the cache) names nobody, and torch waits on it forever. Under
our lock, one that no process of this host holds open is what a killed build left behind: it
is removed with a notice.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Callable

import torch
from torch.utils.cpp_extension import get_default_build_root

from longctx.storage.locks import liveness_lock

log = logging.getLogger("longctx.parallel")
BUILD_TAKES = "a first build takes 1-3 minutes on a small CPU"
_OFFLOAD_BUILDER = "CPUAdamBuilder"
_INFERENCE_ONLY_BUILDERS = ("ShareMemCommBuilder",)


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


def skip_unused_ops() -> list[str]:
    """Keep DeepSpeed from building the ops that only its inference uses; returns their names."""
    import deepspeed.ops  # lazy: deepspeed is heavy to import (see parallel/zero.py)
    from deepspeed.accelerator import get_accelerator

    skipped = []
    for class_name in _INFERENCE_ONLY_BUILDERS:
        builder = get_accelerator().create_op_builder(class_name)
        if builder is not None:
            deepspeed.ops.__compatible_ops__[builder.NAME] = False
            skipped.append(builder.NAME)
    return skipped


def offload_builders(offload_optimizer: bool) -> list:
    """DeepSpeed's builders of the ops this job will JIT-build (none are prebuilt into the wheel)."""
    if not offload_optimizer:
        return []
    from deepspeed.accelerator import get_accelerator  # lazy, see skip_unused_ops
    from deepspeed.git_version_info import installed_ops

    builder = get_accelerator().create_op_builder(_OFFLOAD_BUILDER)
    return [] if builder is None or installed_ops.get(builder.NAME) else [builder]


def is_built(name: str) -> bool:
    return any((extensions_root() / name).glob(f"{name}*.so"))


def _open_on_this_host(path: Path) -> bool:
    """Whether any process here holds `path` open (torch's lock is open while its build runs)."""
    target = str(path.resolve())
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == target for fd in fd_dir.iterdir()):
                return True
        except OSError:  # a process that ended, or another user's
            continue
    return False


def clear_dead_torch_lock(name: str, notify: Callable[[str], None]) -> None:
    lock = extensions_root() / name / "lock"
    if lock.exists() and Path("/proc/self/fd").is_dir() and not _open_on_this_host(lock):
        notify(f"removing {lock}: no running process holds it (a build killed mid-way leaves it)")
        lock.unlink(missing_ok=True)


def build_once(builder, notify: Callable[[str], None]) -> None:
    """Build (if this environment has not) and load one op builder's op, one process at a time."""
    name, root = builder.NAME, extensions_root()
    root.mkdir(parents=True, exist_ok=True)
    with liveness_lock(root / f"{name}.longctx-lock", what=f"DeepSpeed's build of {name}", notify=notify,
                       expected=BUILD_TAKES):
        clear_dead_torch_lock(name, notify)
        if not is_built(name):
            notify(f"building DeepSpeed's {name} op in {root / name} (once per environment; {BUILD_TAKES})")
        builder.load(verbose=False)


def ensure_built(offload_optimizer: bool, notify: Callable[[str], None] = log.warning) -> list[str]:
    """Build (once per environment) or load the JIT ops this job needs; returns their names."""
    builders = offload_builders(offload_optimizer)
    for builder in builders:
        build_once(builder, notify)
    return [builder.NAME for builder in builders]
