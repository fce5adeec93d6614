"""A training job on two "nodes" (network namespaces, netns.py), one launch/torchrun.sh on each
with c10d rendezvous on node 0, and the two node faults the chaos soak and
tests/integration/test_node_partition.py inflict on it:

- "partitioned node": node 1's link is cut mid-run (packets vanish, no reset);
- "lost node": the link is cut and every process of node 1 is SIGKILLed at once (a machine
  that dies says nothing to its peers).

Either way every surviving launcher must end by itself within ENDS_WITHIN x parallel.timeout_s
with exit 86, an `error: stalled:` line and STALLED, and leave no process behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import netns
import psutil

ROOT = Path(__file__).resolve().parents[2]
PARTITIONED, LOST = "partitioned node", "lost node"
NODE_FAULTS = (PARTITIONED, LOST)
ENDS_WITHIN = 3  # x parallel.timeout_s, from the fault to the last launcher's end


def logged_step(out: Path, since: float = 0.0) -> int:
    """The last step metrics.jsonl logged since `since` (wall clock; 0 before: an earlier start's)."""
    try:
        if (out / "metrics.jsonl").stat().st_mtime < since:
            return 0
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


class TwoNodeJob:
    """One start of `train_args` (a longctx train command line after `train`) on both nodes."""

    def __init__(self, nodes: netns.TwoNodes, train_args: list[str], logs: Path, env: dict, port: int):
        self.nodes, self.logs = nodes, logs
        self.began = time.time()
        self.procs = []
        for node in (0, 1):
            cmd = nodes.wrap(node, [str(ROOT / "launch" / "torchrun.sh"), "--nnodes", "2", "--nproc-per-node", "1",
                                    "--rdzv-endpoint", f"{nodes.names[0]}:{port}", "--rdzv-id", "two-nodes", "--",
                                    "train", *train_args])
            log = open(logs / f"node{node}.log", "w")
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               env=dict(env, **nodes.env(node)), start_new_session=True))
            log.close()

    def tree(self) -> list[psutil.Process]:
        return [p for proc in self.procs for p in _with_children(proc.pid)]

    def wait_for_step(self, out: Path, step: int, deadline_s: float = 900) -> bool:
        """Until this start logged `step` (False: a launcher ended first, or the deadline passed)."""
        end = time.monotonic() + deadline_s
        while logged_step(out, self.began) < step:
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > end:
                return False
            time.sleep(0.1)
        return True

    def wait(self, timeout_s: float) -> list[Optional[int]]:
        """Each launcher's exit code (None: still running after `timeout_s`)."""
        end = time.monotonic() + timeout_s
        while any(p.poll() is None for p in self.procs) and time.monotonic() < end:
            time.sleep(0.1)
        return [p.poll() for p in self.procs]

    def kill_all(self) -> None:
        for p in self.tree():
            try:
                p.kill()
            except psutil.Error:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def said(self, node: int) -> str:
        return (self.logs / f"node{node}.log").read_text(errors="replace")

    def fault(self, kind: str, timeout_s: float) -> dict:
        """Inflict `kind` now; wait for the launchers' ends (at most ENDS_WITHIN x timeout_s + 30 s
        of slack for a loaded machine, reported); kill what is left. Returns what happened:
        `exits` (per node; None for a lost node's), `ended_after_s`, `left` (processes that
        outlived their launcher's end), `lines` (each node's stall line or None)."""
        tree = self.tree()
        node1 = _with_children(self.procs[1].pid)
        self.nodes.cut()
        at = time.monotonic()
        lost = []
        if kind == LOST:
            lost = node1
            for p in lost:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
        exits = self.wait(ENDS_WITHIN * timeout_s + 30)
        ended_after = time.monotonic() - at
        time.sleep(1)  # a launcher's end reaps its processes
        left = [" ".join(p.cmdline())[:120] for p in _alive(tree) if p not in lost]
        self.kill_all()
        lines = [next((ln for ln in self.said(n).splitlines() if ln.startswith("error: stalled:")), None)
                 for n in (0, 1)]
        if kind == LOST:
            exits[1] = None
        return {"exits": exits, "ended_after_s": round(ended_after, 1), "left": left, "lines": lines}


def problems(kind: str, result: dict, out: Path, timeout_s: float) -> list[str]:
    """What a node fault's end did wrong (the launchers that survive: 86, a stall line each, STALLED,
    no process left, within ENDS_WITHIN x timeout_s)."""
    found = []
    survivors = (0, 1) if kind == PARTITIONED else (0,)
    for node in survivors:
        if result["exits"][node] != 86:
            found.append(f"node {node}'s launcher exited {result['exits'][node]}, not 86")
        if result["lines"][node] is None:
            found.append(f"node {node} printed no 'error: stalled:' line")
    if result["lines"][0] is not None and "rank 1" not in result["lines"][0]:
        found.append(f"node 0's stall line does not name rank 1: {result['lines'][0][:200]}")
    if result["ended_after_s"] > ENDS_WITHIN * timeout_s:
        found.append(f"ended {result['ended_after_s']} s after the fault, past {ENDS_WITHIN} x {timeout_s} s")
    if result["left"]:
        found.append(f"processes left: {result['left']}")
    if not (out / "STALLED").exists():
        found.append("no STALLED")
    return found


def _with_children(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    found = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def launcher_env(python: str, extensions: Path) -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", LONGCTX_PYTHON=python,
             TORCH_EXTENSIONS_DIR=str(extensions))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        e.pop(key, None)
    return e
