"""`python tests/helpers/eval_faults.py FAULT N [RANK] -- eval ...`: the real `longctx eval` CLI
with one fault at a deterministic point (the test chooses it; longctx reads nothing for it).

FAULT:
  none         no fault
  term-batch   SIGTERM to this process as its N-th decoding batch starts (the batch finishes)
  kill-batch   SIGKILL as the N-th decoding batch starts (that batch is lost)
  kill-cell    SIGKILL right after the N-th cell file is written
  kill-final   SIGKILL half-way through writing results.json's temporary sibling
RANK: only on this rank (default: every rank).
"""
from __future__ import annotations

import os
import pathlib
import signal
import sys

from longctx.commands import cli
from longctx.eval import cells, runner


def _install(fault: str, n: int) -> None:
    calls = {"batch": 0, "cell": 0}
    complete, write, write_bytes = runner.Engine.complete_with_ids, cells.CellStore.write, pathlib.Path.write_bytes

    def batch(self, samples):
        calls["batch"] += 1
        if calls["batch"] == n:
            os.kill(os.getpid(), signal.SIGTERM if fault == "term-batch" else signal.SIGKILL)
        return complete(self, samples)

    def cell(self, *args, **kwargs):
        path = write(self, *args, **kwargs)
        calls["cell"] += 1
        if calls["cell"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    def half_then_kill(self, data):
        if not self.name.startswith(".results.json.tmp-"):
            return write_bytes(self, data)
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    if fault in ("term-batch", "kill-batch"):
        runner.Engine.complete_with_ids = batch
    elif fault == "kill-cell":
        cells.CellStore.write = cell
    elif fault == "kill-final":
        pathlib.Path.write_bytes = half_then_kill
    elif fault != "none":
        raise SystemExit(f"unknown fault {fault!r}")


if __name__ == "__main__":
    split = sys.argv.index("--")
    fault, n, *rank = sys.argv[1:split]
    if not rank or int(rank[0]) == int(os.environ.get("RANK", "0")):
        _install(fault, int(n))
    sys.exit(cli.main(sys.argv[split + 1:]))
