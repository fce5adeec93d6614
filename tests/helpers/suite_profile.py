"""A pytest plugin that records where each test's time goes: processes it starts, CPU time (its
own and its finished children's, which grows less with the machine's load than wall time does),
time asleep, time blocked on a child process. Enabled with `-p helpers.suite_profile`; it writes one JSON line
per test to $LONGCTX_SUITE_PROFILE (default .pytest_cache/suite_profile.jsonl), which
scripts/tools/suite_table.py turns into a per-file table.

Counts only what the test process itself does: a child's own sleeps are in the child's time."""
from __future__ import annotations

import json
import multiprocessing.process
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

_counters = {"processes": 0, "sleep_s": 0.0, "wait_s": 0.0}
_real_sleep = time.sleep
_real_popen_init = subprocess.Popen.__init__
_real_popen_wait = subprocess.Popen.wait
_real_popen_communicate = subprocess.Popen.communicate
_real_mp_start = multiprocessing.process.BaseProcess.start


def _sleep(seconds):
    start = time.monotonic()
    try:
        return _real_sleep(seconds)
    finally:
        _counters["sleep_s"] += time.monotonic() - start


def _popen_init(self, *args, **kwargs):
    _counters["processes"] += 1
    return _real_popen_init(self, *args, **kwargs)


def _timed(real):
    def wrapper(self, *args, **kwargs):
        start = time.monotonic()
        try:
            return real(self, *args, **kwargs)
        finally:
            _counters["wait_s"] += time.monotonic() - start
    return wrapper


def _mp_start(self):
    _counters["processes"] += 1
    return _real_mp_start(self)


def pytest_configure(config):
    time.sleep = _sleep
    subprocess.Popen.__init__ = _popen_init
    # communicate() calls wait() inside; time only the outermost call
    subprocess.Popen.wait = _timed(_real_popen_wait)
    subprocess.Popen.communicate = _timed_outer(_real_popen_communicate)
    multiprocessing.process.BaseProcess.start = _mp_start
    path = Path(os.environ.get("LONGCTX_SUITE_PROFILE", ".pytest_cache/suite_profile.jsonl"))
    path.parent.mkdir(parents=True, exist_ok=True)
    config._suite_profile = path.open("a")


def _timed_outer(real):
    def wrapper(self, *args, **kwargs):
        start = time.monotonic()
        before = _counters["wait_s"]
        try:
            return real(self, *args, **kwargs)
        finally:
            _counters["wait_s"] = before + (time.monotonic() - start)
    return wrapper


def _cpu_s() -> float:
    """CPU seconds of this process and of every child (and their children) it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    for key in _counters:
        _counters[key] = 0 if key == "processes" else 0.0
    start, cpu = time.monotonic(), _cpu_s()
    outcome = yield
    record = {"nodeid": item.nodeid, "wall_s": round(time.monotonic() - start, 3),
              "cpu_s": round(_cpu_s() - cpu, 3), "processes": _counters["processes"],
              "sleep_s": round(_counters["sleep_s"], 3), "wait_s": round(_counters["wait_s"], 3)}
    item.config._suite_profile.write(json.dumps(record) + "\n")
    item.config._suite_profile.flush()
    return outcome


def pytest_unconfigure(config):
    handle = getattr(config, "_suite_profile", None)
    if handle is not None:
        handle.close()
