"""Fault cases of training runs: a second job, a killed job resubmitted, a resume that finds
nothing, a resume into another model shape or layout, a full disk at a save."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from fault_kit import (
    TINY,
    Row,
    case,
    checkpoints,
    digests,
    free_port,
    kill_group,
    last_line,
    longctx,
    metric_steps,
    run,
    shown,
    skipped,
    small_disk,
    start,
    steps_text,
    train_tiny,
    tree_size,
    wait_for,
)


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




@case("resume after changing the model's shape (hidden_size 64 -> 128)")
def shape_changed(tmp: Path) -> Row:
    out = train_tiny(tmp, "run", 2)
    before = digests(out / "checkpoints")
    cmd = longctx("train", *TINY, "out_dir=run", "train.steps=4", "checkpoint.resume=auto",
                  "model.overrides={hidden_size: 128}")
    res = run(cmd, tmp)
    same = digests(out / "checkpoints") == before
    return Row("resume after changing hidden_size (64 -> 128)", shown(cmd, tmp), res.returncode, last_line(res),
               f"checkpoints {'unchanged' if same else 'CHANGED'}; {steps_text(metric_steps(out))}")


@case("resume after changing the ZeRO stage (0 -> 2)")
def zero_stage_changed(tmp: Path) -> Row:
    out = train_tiny(tmp, "run", 2)
    cmd = longctx("train", *TINY, "out_dir=run", "train.steps=4", "checkpoint.resume=auto", "parallel.zero_stage=2")
    res = run(cmd, tmp)
    return Row("resume after changing zero_stage 0 -> 2", shown(cmd, tmp), res.returncode,
               last_line(res, "checkpoint.resume: run/checkpoints/step_0000002 was written"),
               f"metrics.jsonl: {steps_text(metric_steps(out))}")


@case("resume on another world size (1 -> 2 processes)")
def world_size_changed(tmp: Path) -> Row:
    out = train_tiny(tmp, "run", 2, "data.micro_batch_size=2")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port()), "-m", "longctx"]
    cmd = [*torchrun, "train", *TINY, "out_dir=run", "train.steps=4", "checkpoint.resume=auto",
           "data.micro_batch_size=1"]
    res = run(cmd, tmp)
    shown_cmd = "torchrun --nproc_per_node 2 -m longctx " + " ".join(cmd[len(torchrun):])
    return Row("resume on another world size (1 -> 2 processes, the global batch kept)", shown_cmd, res.returncode,
               last_line(res, "checkpoint.resume: run/checkpoints/step_0000002 was written"),
               f"metrics.jsonl: {steps_text(metric_steps(out))}")


@case("a full disk at a save")
def disk_full_at_save(tmp: Path) -> Row:
    title = "a full disk at a save"
    checkpoint = tree_size(train_tiny(tmp, "reference", 2) / "checkpoints" / "step_0000002")
    with small_disk(tmp, checkpoint // 2) as disk:
        if disk is None:
            return skipped(title)
        cmd = longctx("train", *TINY, f"out_dir={disk}/run", "train.steps=2")
        res = run(cmd, tmp)
        saved = checkpoints(disk / "run")
        left = [p.name for p in (disk / "run" / "checkpoints").glob(".*")] if saved or (disk / "run").exists() else []
        return Row(title, shown(cmd, tmp).replace(f"{disk}/", "disk/"), res.returncode, last_line(res),
                   f"checkpoints: {', '.join(saved) or 'none'}; temporaries left: {len(left)}")
