"""Where a running job reports: the lines confirming what it does (every rank's log, rank 0's
console above the progress bar), the metrics writer and the progress display while the steps
run, the validation pictures and the end summary."""
from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import Optional

from longctx.config import TrainConfig
from longctx.reporting.progress import Progress
from longctx.reporting.wandb_log import open_run
from longctx.train.cpu_dtype import slow_dtype_note
from longctx.train.metrics import MetricsWriter
from longctx.train.summary import RunTotals, end_summary
from longctx.train.validation_plot import plot_probe, plot_validation

log = logging.getLogger("longctx.train")


@dataclasses.dataclass(frozen=True)
class Outputs:
    """Where a running job reports: the metrics writer and the progress display."""
    writer: MetricsWriter
    progress: Progress


class Reporter:
    """The run's reporting on this rank (rank 0 writes; every rank logs). `outputs` exists from
    open() to close(): while the steps run."""

    def __init__(self, out: Path, rank: int, cfg: TrainConfig):
        self.out, self.rank, self.cfg = out, rank, cfg
        self.outputs: Optional[Outputs] = None

    def announce(self, line: str) -> None:
        """A line confirming what the run does: in every rank's log, and on rank 0's console
        (above the progress bar when one is shown)."""
        log.info("%s", line)
        if self.rank == 0:
            if self.outputs is not None:
                self.outputs.progress.write(line)
            else:
                print(line, file=sys.stderr)

    def open(self, start_step: int, total_steps: int, dtype, device) -> None:
        """Metrics writer and the progress display (a bar on a terminal, a plain line every 30 s
        or 10% of the steps elsewhere)."""
        cfg = self.cfg
        writer = MetricsWriter(self.out, self.rank == 0, cfg.log.tensorboard, start_step=start_step,
                               notify=self.announce, wandb_run=self._wandb_run())
        if self.rank == 0 and (note := slow_dtype_note(dtype, device)):
            self.announce(note)
        self.outputs = Outputs(writer, Progress(total_steps, "train", "step", initial=start_step,
                                                enabled=self.rank == 0 and cfg.log.progress))

    def _wandb_run(self):
        """Rank 0's W&B run (log.wandb), with the resolved config; a resumed run keeps its id."""
        w = self.cfg.log.wandb
        if w is None or self.rank != 0:
            return None
        return open_run(self.out, w.project, w.entity, w.name, w.mode, dataclasses.asdict(self.cfg), keep_id=True)

    def close(self) -> None:
        outputs, self.outputs = self.outputs, None
        outputs.progress.close()
        outputs.writer.close()

    def plot_validation(self) -> None:
        """Rank 0: validation.png (and probe.png) beside the metrics; a failed picture is a
        warning, not a failed run."""
        if self.rank != 0 or not self.cfg.validation.enabled:
            return
        try:
            if (path := plot_validation(self.out)) is not None:
                self.announce(f"validation: loss by position in {path}")
            if (path := plot_probe(self.out)) is not None:
                self.announce(f"validation: probe scores in {path}")
        except Exception as e:  # noqa: BLE001 - the run's results are written already
            log.warning("validation: no picture (%s)", e)

    def print_summary(self, totals: RunTotals, stages: int, preempted: bool) -> None:
        """The run's last lines on rank 0: steps, final loss, times, throughput, where its
        checkpoint and export are (also in every rank's log)."""
        text = end_summary(totals, self.out, stages=stages, preempted=preempted)
        log.info("%s", text)
        if self.rank == 0:
            print(text, file=sys.stderr, flush=True)
