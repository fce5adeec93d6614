"""A contender in a process of its own (so the process's peak RSS is its own), stepped on request:
the parent holds one StepProcess per contender and steps them interleaved; the child runs
`serve_steps`, one line of JSON per answer on stdout."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from typing import Callable


class StepProcess:
    """The parent's side: starts `cmd` and waits until the child has built its contender."""

    def __init__(self, cmd: list[str], env: dict | None = None):
        self.stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty child never blocks
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=env)
        self.ready = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.stderr.seek(0)
            err = self.stderr.read().strip().splitlines()
            raise RuntimeError(err[-1] if err else f"worker exited with {self.proc.returncode}")
        return json.loads(line)

    def _ask(self, what: str) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def step(self) -> dict:
        """One step in the child; returns what the child's step function returned."""
        return self._ask("step")

    def finish(self) -> dict:
        """The child's summary (its final answer); the child then exits."""
        res = self._ask("done")
        self.proc.stdin.close()
        self.proc.wait()
        return res

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def serve_steps(step: Callable[[], dict], summary: Callable[[], dict], ready: dict | None = None) -> None:
    """The child's side (after building its contender): answer `step` with step()'s dict and
    `done` with summary()'s, on stdout, until `done` or the parent closes stdin."""
    out = sys.stdout
    sys.stdout = sys.stderr  # a library's prints must not mix into the answers
    out.write(json.dumps(ready or {"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = line.strip()
        res = summary() if cmd == "done" else step()
        out.write(json.dumps(res) + "\n")
        out.flush()
        if cmd == "done":
            return
