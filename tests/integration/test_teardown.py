"""shutdown_distributed: a completed job's ranks leave the process group together."""
import time

import torch.distributed as dist

from helpers.cp import run_distributed
from longctx.parallel.mesh import shutdown_distributed


def _worker(rank, world_size, completed):
    if rank == 0:
        time.sleep(2.0)  # rank 0 still writing its reports
    before = time.time()
    shutdown_distributed(completed)
    return before, time.time(), dist.is_initialized()


def test_completed_job_waits_for_every_rank_then_destroys_the_group():
    (b0, a0, init0), (b1, a1, init1) = run_distributed(_worker, 2, True)
    assert not init0 and not init1
    assert a1 >= b0 - 0.05  # rank 1 left only after rank 0 reached the teardown


def test_failed_job_does_not_wait():
    (b0, a0, init0), (b1, a1, init1) = run_distributed(_worker, 2, False)
    assert not init0 and not init1
    assert a1 < b0  # no barrier: rank 1 is gone while rank 0 is still busy


def test_no_group_is_a_no_op():
    assert not dist.is_initialized()
    shutdown_distributed(True)
