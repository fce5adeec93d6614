"""Run the faults a team's hundredth job meets, on tiny CPU runs, and print the table of what
happens: each case, its command, the exit code, the line it prints, what is on disk after.

    python scripts/fault_table.py                 # every case (a few minutes on 2 cores)
    python scripts/fault_table.py -k export       # the cases whose title contains "export"
    python scripts/fault_table.py --out docs/faults.md

Each case works in its own temporary directory and cleans up after itself. Cases that fill a
disk mount a small tmpfs and need root; without it they are listed as skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

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


# ------------------------------------------------------------------------------ cases
@case("the same job submitted twice into one out_dir")
def double_submit(tmp: Path) -> Row:
    first = start(longctx("train", *TINY, "out_dir=run", "train.steps=400"), tmp, tmp / "first.log")
    try:
        wait_for(lambda: len(metric_steps(tmp / "run")) >= 2, first)
        cmd = longctx("train", *TINY, "out_dir=run", "train.steps=400", "train.seed=7")
        second = run(cmd, tmp)
        first.send_signal(signal.SIGUSR1)
        first.wait(timeout=300)
    finally:
        kill_group(first)
    return Row("the same job submitted twice into one out_dir", shown(cmd, tmp), second.returncode,
               last_line(second), f"the first job's {steps_text(metric_steps(tmp / 'run'))}; its files untouched")


@case("a job SIGKILLed, then resubmitted with resume=auto")
def killed_then_resubmitted(tmp: Path) -> Row:
    first = start(longctx("train", *TINY, "out_dir=run", "train.steps=400"), tmp, tmp / "first.log")
    try:
        wait_for(lambda: len(metric_steps(tmp / "run")) >= 5, first)
    finally:
        kill_group(first)
    saved = max(int(n.split("_")[1]) for n in checkpoints(tmp / "run") if n.startswith("step_"))
    cmd = longctx("train", *TINY, "out_dir=run", f"train.steps={saved + 2}", "checkpoint.resume=auto")
    res = run(cmd, tmp)
    abandoned = tmp / "run" / "metrics.abandoned.jsonl"
    moved = len(abandoned.read_text().splitlines()) if abandoned.exists() else 0
    return Row("a job SIGKILLed, then resubmitted (resume=auto)", shown(cmd, tmp), res.returncode,
               last_line(res, "note: taking over"),
               f"metrics.jsonl: {steps_text(metric_steps(tmp / 'run'))}; {moved} abandoned records in "
               "metrics.abandoned.jsonl")


@case("resume=auto when no checkpoint verifies")
def nothing_verifies(tmp: Path) -> Row:
    run(longctx("train", *TINY, "out_dir=run", "train.steps=2"), tmp)
    out = tmp / "run"
    before = (out / "resolved_config.yaml").read_bytes()
    for ckpt in (out / "checkpoints").glob("step_*"):
        (ckpt / "trainer_state.json").write_text("{}")  # damaged: the manifest no longer verifies
    cmd = longctx("train", *TINY, "out_dir=run", "train.steps=4", "train.seed=3", "checkpoint.resume=auto")
    res = run(cmd, tmp)
    same = (out / "resolved_config.yaml").read_bytes() == before
    return Row("resume=auto when no checkpoint verifies", shown(cmd, tmp), res.returncode, last_line(res),
               f"resolved_config.yaml {'unchanged' if same else 'REWRITTEN'}; {steps_text(metric_steps(out))}")


# ------------------------------------------------------------------------------- table
def markdown(rows: list[Row]) -> str:
    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| case | command | exit | what it prints | on disk after |", "|---|---|---|---|---|"]
    lines += [f"| {cell(r.case)} | `{cell(r.command)}` | {cell(r.rc)} | {cell(r.line)} | {cell(r.on_disk)} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", default="", help="only the cases whose title contains this")
    p.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    args = p.parse_args(argv)
    chosen = [(t, fn) for t, fn in CASES if args.k.lower() in t.lower()]
    if not chosen:
        print(f"error: -k: no case matches {args.k!r}; cases: {'; '.join(t for t, _ in CASES)}", file=sys.stderr)
        return 2
    rows = []
    for i, (title, fn) in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {title}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="longctx-fault-") as tmp:
            (Path(tmp) / "tiny.yaml").write_text(TINY_YAML)
            rows.append(fn(Path(tmp)))
    table = markdown(rows)
    print(table, end="")
    if args.out is not None:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
