"""shutdown_distributed: a completed job's ranks leave the process group together."""
import time
from pathlib import Path

import torch.distributed as dist

from helpers.cp import run_distributed
from longctx.parallel.mesh import shutdown_distributed

WAIT_S = 60.0  # against a hang only; the order is shown by marker files, not by clocks


def _wait_for(path: Path) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _worker(rank, world_size, completed, marks):
    """Rank 0 is the slow one (still writing its reports). Returns what each rank saw."""
    reached, left = Path(marks) / "rank0-reached-teardown", Path(marks) / "rank1-left"
    if rank == 0:
        saw_rank1_leave = None
        if completed:
            time.sleep(1.0)  # late: rank 1 reaches the teardown first
        else:
            saw_rank1_leave = _wait_for(left)  # goes on only once rank 1 has left without it
        reached.touch()
        shutdown_distributed(completed)
        return saw_rank1_leave, dist.is_initialized()
    shutdown_distributed(completed)
    rank0_was_there = reached.exists()
    left.touch()
    return rank0_was_there, dist.is_initialized()


def test_completed_job_waits_for_every_rank_then_destroys_the_group(tmp_path):
    (_, init0), (rank0_was_there, init1) = run_distributed(_worker, 2, True, str(tmp_path))
    assert not init0 and not init1
    assert rank0_was_there  # rank 1 left only after rank 0 reached the teardown


def test_failed_job_does_not_wait(tmp_path):
    (saw_rank1_leave, init0), (rank0_was_there, init1) = run_distributed(_worker, 2, False, str(tmp_path))
    assert not init0 and not init1
    assert saw_rank1_leave and not rank0_was_there  # rank 1 left while rank 0 was still busy


def test_no_group_is_a_no_op():
    assert not dist.is_initialized()
    shutdown_distributed(True)
