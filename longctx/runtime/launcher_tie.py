"""A worker dies with the launcher that started it.

torchrun's agent (also what `accelerate launch` runs in its own process) starts every worker in a
session of its own, so a SIGKILL to the agent -- a user's `kill -9` of a stuck job, a node agent --
reaches no worker: re-parented to init, they train on without it or hang in the rendezvous, and
keep the GPU memory the next job needs. Two ties, both for workers of torch's elastic agent only
(it sets TORCHELASTIC_RUN_ID for them; a `longctx train` a user started from a shell, or under
`nohup`, is left alone):

- Linux: PR_SET_PDEATHSIG, so the kernel sends SIGKILL the moment the agent is gone;
- everywhere: a daemon thread that sees the parent change (re-parenting) within a second, in case
  the kernel's tie does not apply (another OS, or the agent's forking thread ended early).

launch/torchrun.sh runs torchrun through launch/die_with_parent.py, which ties the agent to the
script in the same way, so a SIGKILL to the script ends agent and workers too.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_POLL_S = 1.0


def kill_with_parent() -> bool:
    """PR_SET_PDEATHSIG = SIGKILL for this process (Linux); False where it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while True:
        time.sleep(WATCH_POLL_S)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)


def tie_to_launcher() -> None:
    """For a worker of torch's elastic agent: die (SIGKILL) when the agent does."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    parent = os.getppid()
    kill_with_parent()
    if parent == 1 or os.getppid() != parent:  # the agent died before the tie took hold
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch, args=(parent,), name="longctx-launcher-watch", daemon=True).start()
