"""Fixtures for both tiers: tests/unit runs in this process, tests/integration starts processes
(the trainer, torchrun, spawned process groups). Shared helpers are plain functions in the
helpers package (tests/ is on sys.path)."""
import json
import os
from pathlib import Path

import pytest

from helpers.train import LAUNCHER_VARS

DURATIONS = Path(__file__).with_name("durations.json")
# a file not in durations.json yet: about what a new file of its tier takes
DEFAULT_S = {"integration": 30.0, "unit": 2.0}


def load_durations() -> dict[str, float]:
    """{test file: seconds} of a recorded run (scripts/tools/suite_table.py --durations writes it)."""
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture(autouse=True, scope="session")
def outside_any_launcher():
    """The suite runs as if started outside torchrun or SLURM: run inside such a job, its RANK and
    WORLD_SIZE would reach in-process code that reads them (launch_env.read_env)."""
    saved = {k: os.environ.pop(k) for k in LAUNCHER_VARS if k in os.environ}
    yield
    os.environ.update(saved)


def pytest_collection_modifyitems(session, config, items):
    """The longest files first (tests/durations.json, from a recorded run): the parallel workers
    (pytest-xdist, whole files per worker: tests/README.md) then finish together instead of one
    long file starting last. Within a file the order is the file's own."""
    seconds = load_durations()
    order = {}
    for index, item in enumerate(items):
        order.setdefault(item.nodeid.split("::")[0], index)

    def key(item):
        path = item.nodeid.split("::")[0]
        default = DEFAULT_S["integration"] if "/integration/" in f"/{path}" else DEFAULT_S["unit"]
        return (-seconds.get(path, default), order[path])

    items.sort(key=key)
