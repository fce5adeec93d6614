"""Step metrics to metrics.jsonl, TensorBoard and W&B (rank 0): the writer, the metrics file's
trimming on resume, peak memory, and the progress line's fields. The MFU's FLOPs and peak are
in train/mfu.py.
"""
from __future__ import annotations

import json
import math
import resource
import sys
from pathlib import Path
from typing import Optional

import torch

from longctx.reporting.wandb_log import log_scalars
from longctx.storage import atomic


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process image's peak RSS. Linux: VmHWM, not ru_maxrss, which also keeps the image
    before exec, i.e. the forked parent's RSS (a small worker of a large parent reads as large)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return int(kb * (1 if sys.platform == "darwin" else 1024))


def progress_fields(record: dict, stage: Optional[int] = None) -> dict[str, str]:
    """A step's record as the progress display's fields: loss, lr, global tokens/s, peak
    memory (CUDA max allocated; CPU: peak RSS) and, in a staged run, the stage."""
    fields = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}",
              "tok/s": f"{record['tokens_per_s']:,.0f}", "mem": f"{record['peak_memory_gb']:.2f} GiB"}
    if stage is not None:
        fields["stage"] = str(stage)
    return fields


def flat_scalars(record: dict, prefix: str) -> dict[str, float]:
    """The record's numbers as `prefix/key` tags, a mapping of numbers as `prefix/key/label`
    (loss_by_position -> train/loss_by_position/0-1024); nulls and the step are left out."""
    out = {}
    for key, value in record.items():
        if key == "step":
            continue
        if isinstance(value, dict):
            out.update(flat_scalars(value, f"{prefix}/{key}"))
        elif isinstance(value, (int, float)):
            out[f"{prefix}/{key}"] = value
    return out


def strict_json_record(record: dict) -> dict:
    """Non-finite floats -> null, their keys listed under "nonfinite" (strict JSON readers
    reject the bare NaN / Infinity tokens Python's json writes by default)."""
    bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return record
    out = {k: (None if k in bad else v) for k, v in record.items()}
    out["nonfinite"] = bad
    return out


ABANDONED_METRICS = "metrics.abandoned.jsonl"
VALIDATION_FILE = "validation.jsonl"  # validation rows (train/validation.py), apart: one metrics row per step


def _step_of(line: str) -> Optional[int]:
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None  # a torn last line of a killed run: not a step that counts
    return step if isinstance(step, int) else None


def trim_metrics(out_dir: Path, start_step: int, name: str = "metrics") -> int:
    """Keep the records of <name>.jsonl up to `start_step` (atomic rewrite); the others are
    appended to <name>.abandoned.jsonl. Returns how many records moved."""
    path = out_dir / f"{name}.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    kept, dropped = [], []
    for line in lines:
        step = _step_of(line)
        (kept if step is not None and step <= start_step else dropped).append(line)
    dropped = [line for line in dropped if line.strip()]
    if not dropped and len(kept) == len(lines):
        return 0
    if dropped:
        with open(out_dir / f"{name}.abandoned.jsonl", "a") as f:
            f.write("".join(line + "\n" for line in dropped))
    atomic.write_text(path, "".join(line + "\n" for line in kept))
    return len(dropped)


class MetricsWriter:
    """metrics.jsonl, validation.jsonl + TensorBoard (train/... and val/... tags) on rank 0;
    no-op elsewhere.

    A run that starts at `start_step` (a resume, perhaps from an older checkpoint than the last
    step logged) first drops the records after that step from both files, so they end with the
    steps that count; the dropped ones move to <file>.abandoned.jsonl, and TensorBoard is told to
    purge them (its `purge_step`)."""

    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool, *, start_step: int = 0,
                 notify=None, wandb_run=None):
        self.enabled = enabled
        self._file = self._val = self._tb = None
        self._wandb = wandb_run  # a W&B run (longctx/reporting/wandb_log.py) given the same scalars, or None
        if not enabled:
            return
        dropped = trim_metrics(out_dir, start_step)
        if dropped and notify is not None:
            notify(f"metrics: {dropped} records after step {start_step} (a run abandoned at resume) moved from "
                   f"metrics.jsonl to {ABANDONED_METRICS}")
        val_dropped = trim_metrics(out_dir, start_step, "validation")
        dropped += val_dropped
        if val_dropped and notify is not None:
            notify(f"validation: {val_dropped} rows after step {start_step} moved from {VALIDATION_FILE} to "
                   "validation.abandoned.jsonl")
        self._out_dir = out_dir
        self._file = open(out_dir / "metrics.jsonl", "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # lazy: optional (log.tensorboard), heavy

            self._tb = SummaryWriter(str(out_dir / "tb"), purge_step=start_step + 1 if dropped else None)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(strict_json_record(record), allow_nan=False) + "\n")
        self._file.flush()
        self._scalars(flat_scalars(record, "train"), record["step"])

    def write_validation(self, record: dict) -> None:
        """One validation row: validation.jsonl, and val/... tags at its step."""
        if not self.enabled:
            return
        if self._val is None:
            self._val = open(self._out_dir / VALIDATION_FILE, "a")
        self._val.write(json.dumps(strict_json_record(record), allow_nan=False) + "\n")
        self._val.flush()
        self._scalars(flat_scalars(record, "val"), record["step"])

    def _scalars(self, scalars: dict, step: int) -> None:
        if self._tb is not None:
            for tag, value in scalars.items():
                self._tb.add_scalar(tag, value, step)
        if self._wandb is not None:
            log_scalars(self._wandb, scalars, step)

    def close(self) -> None:
        for f in (self._file, self._val):
            if f:
                f.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
