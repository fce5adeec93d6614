"""What a config's memory is planned for: GPUs or CPU processes (host memory), and the memory
each one has -- from the flags, a recipe's `# cluster: nodes=8 gpus_per_node=8 gpu_mem=80GB`
line (`device=cpu` for a CPU recipe), else a fallback: `longctx plan` plans GPU jobs that run
elsewhere, a dry run plans the run on this machine (a GPU if it has one, else CPU).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from longctx.base.errors import UserError
from longctx.plan.report import parse_size

DEVICES = ("gpu", "cpu")
_CLUSTER = re.compile(r"^#\s*cluster:\s*(.*)$", re.MULTILINE)


def cluster_line(config: Optional[str]) -> dict:
    """A config file's `# cluster:` line as a dict ({} without a file or line)."""
    if not config:
        return {}
    try:
        text = Path(config).read_text()
    except OSError:
        return {}
    match = _CLUSTER.search(text)
    if not match:
        return {}
    return dict(item.split("=", 1) for item in match.group(1).split() if "=" in item)


def local_gpu_memory() -> Optional[float]:
    """Bytes of this machine's GPU 0, None without one."""
    import torch  # the one use of torch in planning: a config is checked before it loads

    return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None


def this_machine_device() -> str:
    return "cpu" if local_gpu_memory() is None else "gpu"


def planned_device(cluster: dict, flag: Optional[str] = None, fallback: str = "gpu") -> str:
    """--device, else the cluster line's device= (gpu_mem= means GPUs), else `fallback`."""
    device = flag or cluster.get("device") or ("gpu" if "gpu_mem" in cluster else fallback)
    if device not in DEVICES:
        raise UserError(f"# cluster: device={device} is not a device; valid: {', '.join(DEVICES)}")
    return device


def host_memory_bytes() -> float:
    """Physical memory of this machine."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def processes_per_node(cluster: dict, world_size: int) -> int:
    """Processes sharing one machine: the cluster line's gpus_per_node, else all of them."""
    try:
        return max(1, min(world_size, int(cluster["gpus_per_node"])))
    except (KeyError, ValueError):
        return max(1, world_size)


def memory_per_process(device: str, cluster: dict, world_size: int) -> tuple[Optional[float], Optional[str]]:
    """(bytes each process may use, how that was found): the cluster line's gpu_mem on GPUs;
    this machine's memory shared by the processes of one node on CPU; the local GPU's memory on
    a GPU machine; (None, None) when unknown (a GPU job planned on a machine without one)."""
    if device == "gpu" and "gpu_mem" in cluster:
        return parse_size(cluster["gpu_mem"], what="# cluster: gpu_mem"), "the config's '# cluster:' line"
    if device == "cpu":
        local = processes_per_node(cluster, world_size)
        total = host_memory_bytes()
        return total / local, f"this machine's {total / 2**30:.2f} GiB shared by {local} process(es)"
    gpu_memory = local_gpu_memory()
    return (gpu_memory, "this machine's GPU 0") if gpu_memory is not None else (None, None)
