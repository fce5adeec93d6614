"""What the chaos soak (scripts/chaos_soak.py) is made of: the configurations it runs, starting
a run under its launcher, the moments a fault lands at, the faults between starts, and the checks
of a finished run against an uninterrupted one."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import psutil

ROOT = Path(__file__).resolve().parents[1]
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
    launcher: str = "torchrun"  # torchrun | torchrun.sh

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


# a sitecustomize for one start: rank $CHAOS_HOLD_RANK's training loader stops for good before
# batch $CHAOS_HOLD_AT (0-based) of this start, as a read stuck on a file system (longctx reads
# nothing of this; the hook patches the loader's builder as its module is imported)
HELD_READ_HOOK = """
import importlib.abc, importlib.util, os, sys, time


class _Held:
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        for served, batch in enumerate(self.loader):
            if served == int(os.environ["CHAOS_HOLD_AT"]):
                while True:
                    time.sleep(1)
            yield batch


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "longctx.train.stages":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            build = module.build_stage_loader

            def held(*args, **kwargs):
                loader = build(*args, **kwargs)
                return _Held(loader) if os.environ.get("RANK") == os.environ["CHAOS_HOLD_RANK"] else loader
            module.build_stage_loader = held
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
"""


def held_read_env(work: Path, rank: int, at_batch: int) -> dict:
    """The environment additions of a start whose rank `rank` holds its data read before batch
    `at_batch` of the start."""
    hooks = work / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(HELD_READ_HOOK)
    return {"PYTHONPATH": f"{hooks}:{os.environ.get('PYTHONPATH', '')}", "CHAOS_HOLD_RANK": str(rank),
            "CHAOS_HOLD_AT": str(at_batch)}


def stall_problems(start: Start, out: Path, rc: Optional[int], launcher: str) -> list[str]:
    """What a start that a stall ended did wrong: it must end by itself (rc not None), say which
    rank in one line, leave STALLED, and exit 86 under launch/torchrun.sh (torchrun says 1)."""
    if rc is None:
        return [f"not ended by itself within {STALL_END_S} s"]
    lines = [ln for ln in start.log.read_text(errors="replace").splitlines() if "error: stalled: rank" in ln]
    problems = [] if lines else ["no 'error: stalled:' line naming a rank"]
    if not (out / "STALLED").exists():
        problems.append("no STALLED marker")
    if launcher == "torchrun.sh" and rc != 86:
        problems.append(f"torchrun.sh exited {rc}, not 86")
    return problems


# ------------------------------------------------------------------ faults between starts
def dead_holder_lock(path: Path) -> None:
    """A lock file whose holder (a real process, already exited) is gone, as a SIGKILL leaves it."""
    code = ("import sys; from pathlib import Path; from longctx.storage.locks import this_process, try_take; "
            "assert try_take(Path(sys.argv[1]), this_process())")
    subprocess.run([PY, "-c", code, str(path)], check=True, env=env())


def newest_file(out: Path) -> Optional[Path]:
    complete = sorted(d for d in (out / "checkpoints").glob("step_*") if (d / "COMPLETE").exists())
    if len(complete) < 2:  # one damaged checkpoint alone would leave nothing to resume from
        return None
    files = [p for p in complete[-1].rglob("*") if p.is_file() and p.name not in ("COMPLETE", "MANIFEST.json")
             and p.stat().st_size > 64]
    return max(files, key=lambda p: p.stat().st_size) if files else None


def truncate_newest(out: Path, rng: random.Random) -> Optional[str]:
    f = newest_file(out)
    if f is None:
        return None
    size = f.stat().st_size
    os.truncate(f, rng.randint(0, size - 1))
    return f"{f.relative_to(out)} truncated"


def bitflip_newest(out: Path, rng: random.Random) -> Optional[str]:
    f = newest_file(out)
    if f is None:
        return None
    with open(f, "r+b") as fh:
        at = rng.randrange(f.stat().st_size)
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return f"{f.relative_to(out)}: one bit flipped at byte {at}"


def half_written_temp(out: Path, rng: random.Random) -> Optional[str]:
    step = newest_step(out) + EVERY
    tmp = out / "checkpoints" / f".tmp-step_{step:07d}"
    (tmp / "ds").mkdir(parents=True, exist_ok=True)
    (tmp / "ds" / "mp_rank_00_model_states.pt").write_bytes(os.urandom(rng.randint(100, 5000)))
    return f"{tmp.relative_to(out)} with a partial file"


def stale_run_lock(out: Path, rng: random.Random) -> Optional[str]:  # noqa: ARG001
    if not out.is_dir():
        return None
    (out / ".longctx.lock").unlink(missing_ok=True)
    dead_holder_lock(out / ".longctx.lock")
    return ".longctx.lock of a dead pid"


def stale_cache_lock(out: Path, rng: random.Random) -> Optional[str]:  # noqa: ARG001
    """The packed cache lost and its build's lock (and temporary) left by a dead builder."""
    cache = out.parent / "cache"
    built = [d for d in cache.rglob("source*") if d.is_dir() and not d.name.startswith(".")] if cache.is_dir() else []
    if not built:
        return None
    entry = built[0]
    shutil.rmtree(entry)
    dead_holder_lock(Path(str(entry) + ".lock"))
    return f"cache {entry.name} removed, its .lock of a dead pid left"


EDITS = {"truncated newest checkpoint": truncate_newest, "bit-flipped newest checkpoint": bitflip_newest,
         "half-written temporary checkpoint": half_written_temp, "stale run lock": stale_run_lock,
         "stale cache lock": stale_cache_lock}


# --------------------------------------------------------------------------- the checks
@dataclass
class Verdict:
    problems: list = field(default_factory=list)
    max_loss_diff: float = 0.0
    max_weight_diff: float = 0.0


def leftovers(out: Path) -> list[str]:
    """Temporaries, locks and markers a finished run must not leave."""
    bad = [p for p in out.parent.rglob("*") if (p.name.startswith(".") and (".tmp" in p.name or
           p.name.endswith(".lock"))) or p.name.endswith(".lock") or p.name in ("PREEMPTED", "NONFINITE", "STALLED")]
    return sorted(str(p.relative_to(out.parent)) for p in bad)


def strict_metrics(out: Path) -> list[dict]:
    def reject(token):
        raise ValueError(f"non-strict JSON token {token}")
    return [json.loads(ln, parse_constant=reject) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out: Path) -> dict:
    import longctx  # torch: only for the checks
    model = longctx.load_pretrained(str(out / "checkpoints" / f"step_{STEPS:07d}"))
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def check_train(out: Path, ref: dict, last_rc: Optional[int]) -> Verdict:
    v = Verdict()
    if last_rc != 0:
        v.problems.append(f"last start exited {last_rc}")
        return v
    try:
        records = strict_metrics(out)
    except (OSError, ValueError) as e:
        v.problems.append(f"metrics.jsonl: {e}")
        return v
    steps = [r["step"] for r in records]
    if steps != list(range(1, STEPS + 1)):
        v.problems.append(f"metrics.jsonl steps {steps}, expected 1-{STEPS} once each")
    losses = {r["step"]: r["loss"] for r in records}
    diffs = [abs(losses[s] - ref["losses"][s - 1]) for s in losses if 1 <= s <= STEPS]
    v.max_loss_diff = max(diffs, default=float("inf"))
    if v.max_loss_diff > 1e-6:
        v.problems.append(f"loss differs from the uninterrupted run by {v.max_loss_diff:.2e}")
    got = final_weights(out)
    v.max_weight_diff = max(float((got[k] - ref["weights"][k]).abs().max()) for k in ref["weights"])
    if v.max_weight_diff > 1e-6:
        v.problems.append(f"final weights differ by {v.max_weight_diff:.2e}")
    left = leftovers(out)
    if left:
        v.problems.append(f"left behind: {', '.join(left[:5])}")
    return v


def digests(directory: Path) -> dict:
    import hashlib
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _cell(path: Path) -> Optional[str]:
    if not path.exists():
        return None
    cell = json.loads(path.read_text())
    cell.pop("seconds", None)
    return json.dumps(cell, sort_keys=True)


def check_eval(out: Path, ref_out: Path, last_rc: Optional[int]) -> Verdict:
    v = Verdict()
    if last_rc != 0:
        v.problems.append(f"last start exited {last_rc}")
        return v
    if not (out / "results.json").exists() or \
            (out / "results.json").read_bytes() != (ref_out / "results.json").read_bytes():
        v.problems.append("results.json differs from the uninterrupted evaluation's")
    got, want = digests(out), digests(ref_out)
    for name in [k for k in set(got) | set(want) if k.startswith("cells/")]:  # a cell records its own seconds
        got[name], want[name] = (_cell(out / name), _cell(ref_out / name))
    got.pop("timing.json", None)
    want.pop("timing.json", None)
    differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k) and not k.startswith("."))
    if differ:
        v.problems.append(f"files differ from the uninterrupted evaluation's: {', '.join(differ[:5])}")
    left = [k for k in got if k.split("/")[-1].startswith(".") or k.endswith(".lock") or k.endswith("PREEMPTED")]
    if left:
        v.problems.append(f"left behind: {', '.join(left[:5])}")
    return v


def atomic_size(n: int) -> str:
    from longctx.storage.atomic import human_size
    return human_size(n)
