"""NCCL ends a stall as gloo does (issue 68): the error settings longctx picks and their order
against the watch's own limits (parallel/timeouts.py, runtime/watchdog.py). A real NCCL
collective that a rank holds, on two GPUs, is tests/integration/test_nccl_held_collective.py's."""
import logging

import pytest

from longctx.parallel.timeouts import NCCL_CLEAN_UP_ONLY, enable_nccl_async_errors, nccl_environment
from longctx.runtime.watchdog import REPORT_DEADLINE_S, WARM_STEPS, Watchdog


@pytest.mark.parametrize("startup_s", [60.0, 1800.0, 7200.0])
def test_nccl_settings_leave_the_end_to_longctx(startup_s):
    env = nccl_environment(startup_s)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == NCCL_CLEAN_UP_ONLY == "2"  # abort comms, raise; no SIGABRT
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"  # its path ends the process after the dump
    # NCCL's heartbeat monitor (the only killer left) comes after every Python limit and the report
    assert int(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) > startup_s + REPORT_DEADLINE_S


def test_the_watch_limits_come_after_the_collective_timeout():
    """In every phase the rank's own limit is at least the collective timeout then in force, so
    the collective's error (NCCL's, raised in the rank with clean-up-only) is what reports a
    peer's stall; the own limit catches a main thread that never sees it."""
    w = Watchdog(rank=0, world=1, timeout_s=30.0, startup_timeout_s=600.0, log_path=None, marker_dir=None)
    w.new_shape("stage 0")
    seen = []
    for step in range(1, WARM_STEPS + 3):
        for phase in ("data", "compute"):
            w.beat(phase, step=step)
            seen.append((w.limit_s(), w.collective_s))
        w.step_done(0.5)
        with w.slow_phase("checkpoint"):
            seen.append((w.limit_s(), w.collective_s))
    assert all(limit >= collective for limit, collective in seen), seen
    assert (30.0 + 4 * 0.5, 30.0) in seen  # the short limits were reached


def test_a_users_nccl_setting_wins_and_a_killing_one_is_named(caplog):
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    with caplog.at_level(logging.WARNING, logger="longctx.parallel"):
        enable_nccl_async_errors(1800.0, env=env)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert "ends a process whose collective timed out with SIGABRT" in caplog.text
    env = {}
    enable_nccl_async_errors(1800.0, env=env)
    assert env == nccl_environment(1800.0)
