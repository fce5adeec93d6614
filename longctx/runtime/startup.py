"""What a `longctx train|eval` process does before anything slow loads (its first statements).

- Preemption signals (SIGTERM, SIGUSR1) are recorded from the start: a signal during the imports,
  the rendezvous or the checkpoint load would otherwise take its default action (the process
  dies, torchrun reports a failure, nothing is requeued). The trainer and the evaluation pick the
  recorded signal up (train/signals.py) and stop with the preemption exit code at their next safe
  point.
- A worker started by torch's elastic agent (torchrun, `accelerate launch`) dies with that agent
  (longctx/runtime/launcher_tie.py).

Stdlib only, so it costs nothing before the imports it guards.
"""
from __future__ import annotations

import signal
from typing import Optional

from longctx.runtime.launcher_tie import tie_to_launcher

HANDLED = (signal.SIGUSR1, signal.SIGTERM)
PREEMPTIBLE = ("train", "eval")  # the commands that stop for a preemption at a safe point
INSPECT_ONLY = ("--print-config", "--dry-run", "--help", "-h", "--write-data")  # short: signals keep their default

_received: Optional[int] = None
_begun = False


def _record(signum, frame) -> None:  # noqa: ARG001
    global _received
    _received = signum


def begin(argv: list[str]) -> None:
    """Once per process, before the command's imports: tie a launched worker to its launcher;
    for a training or evaluation, record preemption signals until the command installs its own
    handler."""
    global _begun
    if _begun:
        return
    _begun = True
    tie_to_launcher()
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in PREEMPTIBLE and not any(a in INSPECT_ONLY for a in argv):
        for sig in HANDLED:
            signal.signal(sig, _record)


def end() -> None:
    """As the command returns its exit code: preemption signals are ignored from here, because the
    interpreter's shutdown resets Python handlers to the default, fatal action, and a signal in
    that window would turn a finished (or cleanly preempted) run into a failure. Nothing is
    started after this, so no child inherits the ignored signals."""
    if _begun:
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_IGN)


def received() -> Optional[int]:
    """The preemption signal that arrived before the command's own handler, or None."""
    return _received
