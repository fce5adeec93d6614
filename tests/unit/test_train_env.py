"""Launcher environments and the LR schedule (ZeRO-3 with CPU offload is in
tests/integration/test_zero3_offload.py)."""
import pytest

from longctx.runtime.launch_env import read_env
from longctx.train.schedule import lr_at

LAUNCHERS = {
    "torchrun": ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8, 1, "torchrun")),
    "deepspeed/accelerate": ({"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "MASTER_ADDR": "n1"},
                             (5, 16, 5, "torchrun")),
    "srun": ({"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2"}, (6, 8, 2, "slurm")),
    "srun one task per node + torchrun": ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "RANK": "9", "WORLD_SIZE": "16",
                                          "LOCAL_RANK": "1"}, (9, 16, 1, "torchrun")),
    "mpirun": ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
               (2, 4, 0, "mpi")),
    "single": ({}, (0, 1, 0, "single")),
}


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_read_env(monkeypatch, name):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    env, expected = LAUNCHERS[name]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    e = read_env()
    assert (e.rank, e.world_size, e.local_rank, e.launcher) == expected


def test_lr_schedules():
    kw = dict(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, 100, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(9, 100, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(99, 100, schedule="cosine", **kw) == pytest.approx(0.1, abs=1e-3)
    assert lr_at(55, 100, schedule="linear", **kw) == pytest.approx(0.55)
    assert lr_at(70, 100, schedule="constant", **kw) == 1.0
    values = [lr_at(s, 100, schedule="cosine", **kw) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))
