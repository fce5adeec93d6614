"""What the stall tests (tests/integration/test_*stalls.py) look at in a launched job's process tree."""
import subprocess

import psutil


def worker(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    """The longctx worker process of `rank` below `launcher`."""
    for p in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if p.environ().get("RANK") == str(rank) and "longctx" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no worker of rank {rank}")


def alive(procs) -> list:
    """The processes of `procs` still running (zombies count as gone)."""
    found = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def left_running(procs) -> list:
    """The command lines of the processes of `procs` still running, each killed so that nothing
    outlives the test (empty: the job left nothing behind)."""
    survivors = alive(procs)
    for p in survivors:
        p.kill()
    return [p.cmdline() for p in survivors]
