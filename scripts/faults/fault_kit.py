"""What the fault cases share: a tiny run's config, the registry of cases, running the CLI as a
user would (its own process group, no torchrun variables), and reading a run directory."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

TINY_YAML = """\
# a tiny CPU run: the debug model on the built-in synthetic corpus
data: {micro_batch_size: 2, shuffle: false, seq_len: 256}
log: {tensorboard: false, progress: false, every: 1}
checkpoint: {save_hf: false, export_hf: false, every: 2}
"""
TINY = ["--config", "tiny.yaml"]


@dataclass
class Row:
    case: str
    command: str
    rc: Optional[int]
    line: str
    on_disk: str


CASES: list[tuple[str, Callable[[Path], Row]]] = []


def case(title: str):
    def register(fn: Callable[[Path], Row]) -> Callable[[Path], Row]:
        CASES.append((title, fn))
        return fn
    return register


# ---------------------------------------------------------------------------- running
def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(key, None)
    return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def longctx(*args: str) -> list[str]:
    return [sys.executable, "-m", "longctx", *args]


def shown(cmd: list[str], cwd: Path) -> str:
    """The command as a user would type it (`longctx ...`, paths relative to the case's directory)."""
    words = ["longctx", *cmd[3:]] if cmd[:3] == longctx() else cmd
    return " ".join(shlex.quote(w.replace(f"{cwd}/", "")) for w in words)


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def start(cmd: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env(), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def last_line(res: subprocess.CompletedProcess, prefix: str = "") -> str:
    """The line that matters: the `error:` line if any, else the last line starting with `prefix`."""
    lines = [ln for ln in res.stderr.splitlines() + res.stdout.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    picked = errors or [ln for ln in lines if ln.startswith(prefix)] or lines[-1:]
    return picked[-1] if picked else ""


def wait_for(predicate: Callable[[], bool], proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the background job ended or stalled (rc {proc.poll()})")
        time.sleep(0.05)


def metric_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(ln)["step"] for ln in path.read_text().splitlines()] if path.exists() else []


def steps_text(steps: list[int]) -> str:
    if steps == list(range(1, len(steps) + 1)):
        return f"steps 1-{len(steps)} once each" if steps else "no steps"
    return "steps " + ",".join(map(str, steps))


def checkpoints(out: Path) -> list[str]:
    root = out / "checkpoints"
    return sorted(d.name for d in root.iterdir()) if root.is_dir() else []


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)




@contextmanager
def small_disk(tmp: Path, size_bytes: int) -> Iterator[Optional[Path]]:
    """A tmpfs of `size_bytes` mounted at tmp/disk, or None where it cannot be mounted (not root)."""
    disk = tmp / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={max(size_bytes, 4096)}", "tmpfs",
                                            str(disk)], capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def skipped(title: str) -> Row:
    return Row(title, "", None, "skipped: mounting a small tmpfs needs root", "")


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def temp_siblings(target: Path) -> list[str]:
    """Hidden temporaries beside `target` (`.NAME.tmp-*`) that a killed writer leaves."""
    return sorted(p.name for p in target.parent.glob(f".{target.name}.tmp-*"))


def digests(directory: Path) -> dict:
    """{relative path: sha256} of every file under `directory`."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def train_tiny(tmp: Path, out: str, steps: int, *extra: str) -> Path:
    """A finished tiny run in tmp/out (checkpoints every 2 steps)."""
    res = run(longctx("train", *TINY, f"out_dir={out}", f"train.steps={steps}", *extra), tmp)
    if res.returncode != 0:
        raise RuntimeError(f"the tiny run failed (rc {res.returncode}): {res.stderr[-2000:]}")
    return tmp / out
