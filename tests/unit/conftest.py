"""The unit tier runs in this process: a test here that starts a process (subprocess, torchrun,
multiprocessing) fails with the line that says where it belongs (tests/README.md)."""
import multiprocessing.process
import os
import subprocess

import pytest

WHERE = ("the unit tier starts no process: a test that needs one belongs in tests/integration "
         "(tests/README.md)")


def _refuse(*args, **kwargs):
    raise AssertionError(WHERE)


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
    for name in ("fork", "system", "posix_spawn", "posix_spawnp"):
        monkeypatch.setattr(os, name, _refuse)


@pytest.fixture
def lm_eval_without_git(monkeypatch):
    """lm-eval's simple_evaluate records `git describe` of the working directory, a process: the
    unit tests of longctx's lm-eval model record no hash instead."""
    import lm_eval.evaluator
    import lm_eval.loggers.utils

    for module in (lm_eval.evaluator, lm_eval.loggers.utils):
        monkeypatch.setattr(module, "get_git_commit_hash", lambda: None)
