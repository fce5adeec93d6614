"""The chaos soak's faults: those that land while a start runs (a kill, a signal, a stall) or
that a start meets (an edited data file, a full disk), and those made between starts (a damaged
checkpoint, a half-written temporary one, a stale lock). Each fault during a start returns
(exit code, when it landed, what it did); `when` is "missed" when the start ended first."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import chaos_kit as kit
import psutil

DURING = ["SIGKILL a worker", "SIGKILL the whole job", "SIGKILL the launcher alone", "SIGTERM", "SIGUSR1"]
MOMENTS = ["start-up", "mid-run", "mid-save"]
EDITED_DATA, FULL_DISK = "edited data file", "full disk during a save"
STOPPED, HELD_READ = "SIGSTOP a worker", "held data read"  # stalls: a start of several processes, after a step
STALLS = (STOPPED, HELD_READ)
EVAL_FAULTS = ["SIGKILL", "SIGTERM", "SIGUSR1"]
WORKERS_GONE_S = 30.0
TMPFS_SIZE = "512m"


# -------------------------------------------------------------------- faults during a start
def during(start: kit.Start, out: Path, kind: str, cfg: kit.TrainConfig, rng: random.Random, startup_s: float,
           problems: list) -> tuple:
    """A kill or a signal (one of DURING) at a moment drawn from MOMENTS."""
    when = kit.wait_moment(start, out, rng.choice(MOMENTS), rng, startup_s)
    if not when:
        return start.wait(), "missed", "the start ended first (not counted)"
    detail = ""
    workers = start.workers()
    if kind == "SIGKILL a worker":
        deadline = time.time() + 60
        while not workers and start.proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
            workers = start.workers()
        if workers:
            victim = rng.choice(workers)
            victim.kill()
            detail = f"worker pid {victim.pid} of {len(workers)}"
    elif kind == "SIGKILL the whole job":
        kit.kill_everything(start)
    elif kind == "SIGKILL the launcher alone":
        tree = start.tree()
        start.proc.kill()
        t0 = time.time()
        while kit.alive(tree) and time.time() - t0 < WORKERS_GONE_S + 10:
            time.sleep(0.1)
        still = kit.alive(tree)
        detail = f"{len(tree)} processes under it, all gone in {time.time() - t0:.1f} s" if not still else \
            f"{len(still)} of {len(tree)} still running after {time.time() - t0:.0f} s"
        if still or time.time() - t0 > WORKERS_GONE_S:
            problems.append(f"launcher killed ({when}): {detail}")
            for p in still:
                p.kill()
    else:
        sig = signal.SIGTERM if kind == "SIGTERM" else signal.SIGUSR1
        if sig == signal.SIGUSR1 and cfg.launcher == "torchrun":
            for w in workers or [psutil.Process(start.proc.pid)]:  # as srun delivers it to every task
                try:
                    w.send_signal(sig)
                except Exception:  # noqa: BLE001  (already gone)
                    pass
            detail = f"to {len(workers)} workers"
        else:
            start.proc.send_signal(sig)
            detail = f"to {cfg.launcher}"
    rc = start.wait()
    marker = out / "PREEMPTED"
    if marker.exists():
        detail += f"; PREEMPTED {marker.read_text().strip()}"
    return rc, when, detail.strip("; ")


def stall(start: kit.Start, out: Path, kind: str, hold: Optional[tuple], launcher: str, rng: random.Random,
          problems: list) -> tuple:
    """A worker SIGSTOPped after a step of this start, or a rank's data read held (from the
    start's env, held_read_env): the start must end by itself, within kit.STALL_END_S."""
    if kind == STOPPED:
        target = rng.randint(kit.newest_step(out) + 1, kit.STEPS - 1)
        deadline = time.time() + 600
        while kit.logged_step(out, start.began) < target and start.proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        workers = start.workers()
        if start.proc.poll() is not None or not workers:
            return start.wait(), "missed", "the start ended first (not counted)"
        victim = rng.choice(workers)
        victim.send_signal(signal.SIGSTOP)
        when, detail = f"after step {kit.logged_step(out, start.began)}", f"worker pid {victim.pid}"
    else:
        when, detail = f"before batch {hold[1] + 1} of the start", f"rank {hold[0]}"
    stalled_at = time.time()
    rc = start.wait(timeout=kit.STALL_END_S)
    said = stall_problems(start, out, rc, launcher)
    problems += [f"{kind} ({when}): {p}" for p in said]
    detail += f"; ended {time.time() - stalled_at:.0f} s later"
    return rc, when, detail


def edited_data(start: kit.Start, work: Path, problems: list) -> tuple:
    """The start restarted on its data file edited (same size and time): it must stop with one line."""
    data = work / "data.jsonl"
    original, stat = data.read_bytes(), data.stat()
    start.proc.kill()  # started before the edit: restart after it
    start.proc.wait()
    data.write_bytes(original.replace(b"river", b"rover", 1))  # same size, one word changed
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as cp -p leaves it
    try:
        start.__init__(start.cmd, start.log, work)
        rc = start.wait()
    finally:
        data.write_bytes(original)
        os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    errors = [ln for ln in start.log.read_text().splitlines() if ln.startswith("error:")]
    if rc == 0 or not errors or "changed since the checkpoint" not in errors[0]:
        problems.append(f"edited data: exit {rc}, {errors[:1]}")
    return rc, "between starts", errors[0][:160] if errors else ""


def full_disk(start: kit.Start, run_dir: Path, out: Path, work: Path, problems: list) -> tuple:
    """The start restarted on a tmpfs with half its newest checkpoint's size free (root only)."""
    start.proc.kill()
    start.proc.wait()
    newest = max(d for d in (out / "checkpoints").glob("step_*") if (d / "COMPLETE").exists())
    size = sum(p.stat().st_size for p in newest.rglob("*") if p.is_file())
    used = shutil.disk_usage(run_dir).used
    subprocess.run(["mount", "-o", f"remount,size={used + size // 2}", str(run_dir)], check=True)
    try:
        start.__init__(start.cmd, start.log, work)
        rc = start.wait()
    finally:
        subprocess.run(["mount", "-o", f"remount,size={TMPFS_SIZE}", str(run_dir)], check=True)
    errors = [ln for ln in start.log.read_text().splitlines() if ln.startswith("error:")]
    if rc == 0 and kit.logged_step(out, 0) == kit.STEPS:
        detail = "the run ended before it needed the space"
    elif not errors:
        problems.append(f"full disk: exit {rc} without an error line")
        detail = ""
    else:
        detail = errors[0][:200]
    return rc, f"a save ({human_size(size // 2)} free)", detail


def human_size(n: int) -> str:
    from longctx.storage.atomic import human_size  # longctx's own wording of a size
    return human_size(n)


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


def stall_problems(start: kit.Start, out: Path, rc: Optional[int], launcher: str) -> list[str]:
    """What a start that a stall ended did wrong: it must end by itself (rc not None), say which
    rank in one line, leave STALLED, and exit 86 under launch/torchrun.sh (torchrun says 1)."""
    if rc is None:
        return [f"not ended by itself within {kit.STALL_END_S} s"]
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
    subprocess.run([kit.PY, "-c", code, str(path)], check=True, env=kit.env())


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
    step = kit.newest_step(out) + kit.EVERY
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


TRAIN_KINDS = DURING + list(EDITS) + [EDITED_DATA, FULL_DISK, STOPPED, HELD_READ]
