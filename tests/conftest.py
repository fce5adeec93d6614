"""Fixtures for both tiers: tests/unit runs in this process, tests/integration starts processes
(the trainer, torchrun, spawned process groups). Shared helpers are plain functions in the
helpers package (tests/ is on sys.path)."""
import os

import pytest

from helpers.train import LAUNCHER_VARS


@pytest.fixture(autouse=True, scope="session")
def outside_any_launcher():
    """The suite runs as if started outside torchrun or SLURM: run inside such a job, its RANK and
    WORLD_SIZE would reach in-process code that reads them (launch_env.read_env)."""
    saved = {k: os.environ.pop(k) for k in LAUNCHER_VARS if k in os.environ}
    yield
    os.environ.update(saved)
