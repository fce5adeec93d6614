"""What the chaos soak's runs are made of (scripts/faults/chaos_soak.py): the configurations it
runs, starting a run under its launcher and finding its processes, and the moments a fault lands
at. The faults are chaos_faults.py's; the checks of a finished run, chaos_checks.py's."""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
STEPS, EVERY = 10, 2
STALL_TIMEOUT_S = 15  # parallel.timeout_s of every run: a stalled rank ends its start in seconds
STALL_END_S = 150  # bound on a stalled start's end: the timeout + torchrun's 30 s grace, with room
TINY_YAML = """\
# the chaos soak's tiny run: debug model, fp32, constant LR, a checkpoint every 2 steps
data: {micro_batch_size: 2, shuffle: false, seq_len: 256}
log: {tensorboard: false, progress: false, every: 1}
checkpoint: {save_hf: false, export_hf: false, every: %d, keep_last: 3}
optim: {schedule: constant, warmup_steps: 0}
train: {dtype: float32}
""" % EVERY
# what a start prints that says how it dealt with the last fault
TELLING = re.compile(r"^(error:|note:|warning:|preempted|checkpoint\.resume|metrics: |resuming:|.*WARNING.*resum)")


@dataclass(frozen=True)
class TrainConfig:
    name: str
    nproc: int
    overrides: tuple
    data_file: bool = False  # its own jsonl (the edited-data fault needs one)
    cache: bool = False  # data.cache_dir (the stale cache lock fault needs one)
    launcher: str = "torchrun"  # torchrun | torchrun.sh | two nodes (torchrun.sh on each, chaos_nodes.py)

    def args(self, out: Path, work: Path) -> list[str]:
        extra = [f"out_dir={out}", f"train.steps={STEPS}", "checkpoint.resume=auto",
                 f"parallel.timeout_s={STALL_TIMEOUT_S}", *self.overrides]
        if self.data_file:
            extra.append(f"data.sources=[{{path: {work / 'data.jsonl'}}}]")
        if self.cache:
            extra.append(f"data.cache_dir={out.parent / 'cache'}")
        return ["train", "--config", str(work / "tiny.yaml"), *extra]


TRAIN_CONFIGS = [
    TrainConfig("1 proc, ZeRO-0", 1, ("parallel.zero_stage=0",)),
    TrainConfig("2 procs dp 2, ZeRO-1, cache", 2, ("parallel.zero_stage=1",), data_file=True, cache=True),
    TrainConfig("2 procs cp 2 ring, ZeRO-2", 2, ("parallel.zero_stage=2", "parallel.cp_size=2",
                                                "parallel.cp_impl=ring"), data_file=True, launcher="torchrun.sh"),
    TrainConfig("2 procs dp 2, ZeRO-3, cache", 2, ("parallel.zero_stage=3",), data_file=True, cache=True,
                launcher="torchrun.sh"),
    TrainConfig("2 procs cp 2 allgather, ZeRO-0", 2, ("parallel.zero_stage=0", "parallel.cp_size=2",
                                                      "parallel.cp_impl=allgather"), data_file=True),
    TrainConfig("2 procs cp 2 ulysses, ZeRO-2, cache", 2, ("parallel.zero_stage=2", "parallel.cp_size=2",
                                                           "parallel.cp_impl=ulysses"), data_file=True, cache=True),
    # one process on each of two network namespaces (root): a partitioned node, a lost node
    TrainConfig("2 nodes x 1 proc cp 2 ring, ZeRO-2", 2, ("parallel.zero_stage=2", "parallel.cp_size=2",
                                                         "parallel.cp_impl=ring"), data_file=True,
                launcher="two nodes"),
]
EVAL_ARGS = ["--lengths", "128,256,512", "--cp", "1", "--tasks", "passkey,niah_single_1", "--depths", "0,1",
             "--samples", "6", "--style", "compact", "--tokenizer", "byte", "--max-new-tokens", "4",
             "--batch-size", "1", "--no-progress"]


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", LONGCTX_PYTHON=PY)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        e.pop(key, None)
    return e


def write_inputs(work: Path, seed: int) -> None:
    """tiny.yaml and a jsonl of seeded word soup (enough rows for STEPS steps of 2 x 2 rows)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "tiny.yaml").write_text(TINY_YAML)
    rng = random.Random(seed)
    words = ["alpha", "river", "stone", "seven", "quiet", "north", "lamp", "orbit", "maple", "cinder", "harbor"]
    rows = [json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(40, 160)))})
            for _ in range(600)]
    (work / "data.jsonl").write_text("\n".join(rows) + "\n")


# --------------------------------------------------------------------------- processes
class Start:
    """One start of a run under its launcher, in a session of its own (as a user's shell would)."""

    def __init__(self, cmd: list[str], log: Path, cwd: Path, extra_env: Optional[dict] = None):
        self.cmd, self.log, self.began = cmd, log, time.time()
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=dict(env(), **(extra_env or {})), stdout=open(log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def workers(self) -> list[psutil.Process]:
        """The processes running longctx itself (not the launcher, its wrapper or the preflight)."""
        found = []
        for p in self.tree():
            try:
                line = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "longctx" in line and "torch.distributed.run" not in line and "accelerate" not in line \
                    and "preflight" not in line and "die_with_parent" not in line:
                found.append(p)
        return found

    def wait(self, timeout: float = 900) -> Optional[int]:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_everything(self)
            return None

    def said(self) -> str:
        """The lines of this start that tell how it dealt with what it found."""
        lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()]
        picked = [ln for ln in lines if TELLING.match(ln) and "UserWarning" not in ln]
        return " / ".join(dict.fromkeys(picked))[:400]


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def kill_everything(start: Start) -> None:
    for p in [*start.tree(), psutil.Process(start.proc.pid)] if start.proc.poll() is None else start.tree():
        try:
            p.kill()
        except psutil.Error:
            pass
    start.proc.wait(timeout=60)


def leftover_processes(marker: str) -> list[str]:
    """Processes (other than this one) whose command line names `marker` (a run's directory)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] != os.getpid() and marker in " ".join(p.info["cmdline"] or []):
            found.append(f"{p.info['pid']}")
    return found


# ----------------------------------------------------------------------------- moments
def newest_step(out: Path) -> int:
    steps = [int(d.name.split("_")[1]) for d in (out / "checkpoints").glob("step_*") if (d / "COMPLETE").exists()]
    return max(steps, default=0)


def logged_step(out: Path, since: float) -> int:
    """The last step metrics.jsonl logged in this start (0 before its first)."""
    path = out / "metrics.jsonl"
    try:
        if path.stat().st_mtime < since:
            return 0
        lines = path.read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def saving(out: Path, since: float = 0.0) -> bool:
    """A checkpoint's temporary directory made since `since` exists (not one a killed start left)."""
    for tmp in (out / "checkpoints").glob(".tmp-step_*"):
        try:
            if tmp.stat().st_mtime >= since:
                return True
        except OSError:
            pass
    return False


def wait_moment(start: Start, out: Path, when: str, rng: random.Random, startup_s: float) -> str:
    """Wait for the moment `when` (start-up | mid-run | mid-save) of this start; returns what it
    was when it came ('' when the start ended first)."""
    deadline = time.time() + 600
    first = newest_step(out) + 1  # the first step this start trains
    if when == "start-up" or first > STEPS - 1:
        time.sleep(rng.uniform(0.2, startup_s))
    elif when == "mid-run":
        target = rng.randint(first, STEPS - 1)
        while logged_step(out, start.began) < target and start.proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
    else:  # mid-save: a checkpoint's temporary directory exists
        while not saving(out, start.began) and start.proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)
    if start.proc.poll() is not None:
        return ""
    step = logged_step(out, start.began)
    return "mid-save" + (f" (after step {step})" if step else "") if saving(out, start.began) else \
        (f"after step {step}" if step else f"start-up ({time.time() - start.began:.1f} s in)")
