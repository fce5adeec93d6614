"""Fault cases of what commands write outside a run: exports (killed, raced, on a full disk) and
evaluations (killed while results.json is written, preempted and rerun, on a full disk)."""
from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

from fault_kit import (
    Row,
    case,
    digests,
    kill_group,
    last_line,
    longctx,
    run,
    shown,
    skipped,
    small_disk,
    start,
    temp_siblings,
    train_tiny,
    tree_size,
    wait_for,
)

KILLS = 6  # SIGKILLs per case


def kill_when(cmd: list[str], tmp: Path, moment, after_each) -> list:
    """Start `cmd` and SIGKILL it as soon as `moment()` holds (polled every millisecond: the
    moment a temporary exists), KILLS times; `after_each(hit)` judges what each kill left and
    sets the scene for the next (hit: the kill landed at the moment, not after the command ended)."""
    seen = []
    for _ in range(KILLS):
        proc = start(cmd, tmp, tmp / "killed.log")
        while proc.poll() is None and not moment():
            time.sleep(0.001)
        hit = proc.poll() is None
        kill_group(proc)
        seen.append(after_each(hit))
    return seen


def export_cmd(checkpoint: str, out: str, *extra: str) -> list[str]:
    return longctx("export", "--checkpoint", checkpoint, "--out", out, *extra)


def eval_cmd(model: str, out: str, samples: int = 2) -> list[str]:
    return longctx("eval", "--model", model, "--suite", "passkey", "--tasks", "niah_single_1,passkey",
                   "--lengths", "128,256", "--depths", "0,1", "--samples", str(samples), "--style", "compact",
                   "--max-new-tokens", "4", "--batch-size", "1", "--no-progress", "--out", out)


@case("SIGKILL during longctx export, then the same export")
def export_killed(tmp: Path) -> Row:
    train_tiny(tmp, "run", 2)
    cmd = export_cmd("run", "hf")

    def judge(hit: bool) -> tuple:
        complete = (tmp / "hf").exists()
        if complete:  # it finished before the kill: the next kill again meets a new --out
            shutil.rmtree(tmp / "hf")
        return hit, complete, len(temp_siblings(tmp / "hf"))

    seen = kill_when(cmd, tmp, lambda: bool(temp_siblings(tmp / "hf")), judge)
    res = run(cmd, tmp)
    hits = sum(h for h, _, _ in seen)
    complete = "complete" if (tmp / "hf" / "config.json").exists() else "MISSING"
    return Row("SIGKILL during longctx export, then the same export", shown(cmd, tmp), res.returncode,
               last_line(res, "note: removed"),
               f"{KILLS} kills while the export was half-written ({hits} landed): hf/ absent after "
               f"{sum(not c for _, c, _ in seen)}, {seen[-1][2]} temporaries left; after the rerun: "
               f"{len(temp_siblings(tmp / 'hf'))} temporaries, hf/ {complete}")


@case("SIGKILL during longctx export --overwrite")
def overwrite_killed(tmp: Path) -> Row:
    train_tiny(tmp, "run", 4)
    for name, step in (("old", 2), ("new", 4)):
        run(export_cmd(f"run/checkpoints/step_000000{step}", name), tmp)
    old, new = digests(tmp / "old"), digests(tmp / "new")
    run(export_cmd("run/checkpoints/step_0000002", "hf"), tmp)
    cmd = export_cmd("run/checkpoints/step_0000004", "hf", "--overwrite")

    def judge(hit: bool) -> str:
        now = digests(tmp / "hf")
        kind = "old" if now == old else "new" if now == new else "MIXED"
        if kind == "new":  # put the old one back, so that every kill replaces old by new
            run(export_cmd("run/checkpoints/step_0000002", "hf", "--overwrite"), tmp)
        return kind

    kinds = kill_when(cmd, tmp, lambda: bool(temp_siblings(tmp / "hf")), judge)
    res = run(cmd, tmp)
    return Row("SIGKILL during longctx export --overwrite", shown(cmd, tmp), res.returncode, last_line(res),
               f"{KILLS} kills while the new export was half-written: hf/ held the old export "
               f"{kinds.count('old')} times, the new one {kinds.count('new')}, a mix {kinds.count('MIXED')}; "
               f"the rerun: {len(temp_siblings(tmp / 'hf'))} temporaries, hf/ "
               f"{'the new export' if digests(tmp / 'hf') == new else 'NOT the new export'}")


@case("two exports into the same new --out at once")
def exports_raced(tmp: Path) -> Row:
    train_tiny(tmp, "run", 2)
    cmd = export_cmd("run", "hf")
    procs = [start(cmd, tmp, tmp / f"export{i}.log") for i in range(2)]
    for p in procs:
        p.wait(timeout=600)
    codes = [p.returncode for p in procs]
    lines = [ln for i in range(2) for ln in (tmp / f"export{i}.log").read_text().splitlines()
             if ln.startswith("error:")]
    return Row("two exports into the same new --out at once", shown(cmd, tmp) + "  (twice, together)",
               "/".join(map(str, sorted(codes))), lines[0] if lines else "(no error line)",
               f"hf/ written once ({len(digests(tmp / 'hf'))} files); {len(temp_siblings(tmp / 'hf'))} temporaries")


@case("SIGKILL while an evaluation writes results.json")
def results_killed(tmp: Path) -> Row:
    train_tiny(tmp, "run", 2)
    cmd = eval_cmd("run", "out")
    run(cmd, tmp)
    reference = (tmp / "out" / "results.json").read_bytes()

    def judge(hit: bool) -> str:
        path = tmp / "out" / "results.json"
        try:
            json.loads(path.read_bytes())
        except (OSError, ValueError):
            return "BROKEN"
        return "same" if path.read_bytes() == reference else "DIFFERENT"

    seen = kill_when(cmd, tmp, lambda: bool(temp_siblings(tmp / "out" / "results.json")), judge)
    res = run(cmd, tmp)
    same = (tmp / "out" / "results.json").read_bytes() == reference
    return Row("SIGKILL while an evaluation writes results.json (the same eval rerun)", shown(cmd, tmp),
               res.returncode, last_line(res, "note: removed"),
               f"{KILLS} kills while results.json's temporary existed: the complete earlier file "
               f"{seen.count('same')} times, broken {seen.count('BROKEN')}; after the rerun "
               f"{'identical' if same else 'DIFFERENT'} bytes, {len(temp_siblings(tmp / 'out' / 'results.json'))} "
               "temporaries")


@case("SIGTERM during longctx eval, then the same command")
def eval_preempted(tmp: Path) -> Row:
    train_tiny(tmp, "run", 2)
    run(eval_cmd("run", "reference", samples=4), tmp)
    cmd = eval_cmd("run", "out", samples=4)
    proc = start(cmd, tmp, tmp / "eval.log")
    wait_for(lambda: any((tmp / "out" / "cells").glob("*/*.json")), proc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=600)
    stopped = [ln for ln in (tmp / "eval.log").read_text().splitlines() if ln.strip()][-1:]
    cells = len(list((tmp / "out" / "cells").glob("*/*.json")))
    res = run(cmd, tmp)
    same = (tmp / "out" / "results.json").read_bytes() == (tmp / "reference" / "results.json").read_bytes()
    return Row("SIGTERM during longctx eval, then the same command", shown(cmd, tmp),
               f"{proc.returncode}, then {res.returncode}", f"{stopped[0] if stopped else ''} / "
               f"{last_line(res, 'resuming:')}",
               f"{cells} cell files kept at the stop; results.json after the rerun "
               f"{'identical to' if same else 'DIFFERENT from'} an uninterrupted eval's")


@case("longctx export --out on a full disk")
def export_disk_full(tmp: Path) -> Row:
    title = "longctx export --out on a full disk"
    train_tiny(tmp, "run", 2)
    run(export_cmd("run", "reference"), tmp)
    with small_disk(tmp, tree_size(tmp / "reference") // 2) as disk:
        if disk is None:
            return skipped(title)
        cmd = export_cmd("run", f"{disk}/hf")
        res = run(cmd, tmp)
        return Row(title, shown(cmd, tmp).replace(f"{disk}/", "disk/"), res.returncode, last_line(res),
                   f"disk/: {sorted(p.name for p in disk.iterdir()) or 'empty'}")


@case("longctx eval --out on a full disk")
def eval_disk_full(tmp: Path) -> Row:
    title = "longctx eval --out on a full disk"
    train_tiny(tmp, "run", 2)
    run(eval_cmd("run", "reference"), tmp)
    with small_disk(tmp, tree_size(tmp / "reference" / "cells") + 8192) as disk:
        if disk is None:
            return skipped(title)
        cmd = eval_cmd("run", f"{disk}/out")
        res = run(cmd, tmp)
        cells = len(list((disk / "out" / "cells").glob("*/*.json")))
        temps = [p.name for p in disk.rglob(".*tmp-*")]
        return Row(title, shown(cmd, tmp).replace(f"{disk}/", "disk/"), res.returncode, last_line(res),
                   f"{cells} finished cells kept; {len(temps)} temporaries")
