"""validation.png: the held-out loss by position, one line per validation coloured by its step;
probe.png: the retrieval probe's scores against step, one line per (task, length). Both are
written at the end of a run with validation (probe.png with validation.probe), and by
scripts/tools/plot_metrics.py on any run directory."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from longctx.eval.plots import pyplot, save_png
from longctx.train.metrics import VALIDATION_FILE

PICTURE = "validation.png"
PROBE_PICTURE = "probe.png"


def _rows(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / VALIDATION_FILE
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def read_rows(run_dir: Path) -> list[dict]:
    """The validation rows of a run directory (a torn last line of a killed run left out)."""
    return [r for r in _rows(run_dir) if isinstance(r.get("val_loss_by_position"), dict)]


def plot_validation(run_dir: Path, out: Optional[Path] = None) -> Optional[Path]:
    """RUN_DIR/validation.png (or `out`) from validation.jsonl; None when it has no row. x: each
    bucket's end position (log scale), y: the bucket's mean held-out loss; empty buckets skipped."""
    rows = read_rows(run_dir)
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    steps = [r["step"] for r in rows]
    cmap = plt.get_cmap("viridis")
    span = max(max(steps) - min(steps), 1)
    for r in rows:
        points = [(int(label.split("-")[1]), v) for label, v in r["val_loss_by_position"].items() if v is not None]
        ax.plot([p for p, _ in points], [v for _, v in points], marker="o", markersize=3,
                color=cmap((r["step"] - min(steps)) / span), label=f"step {r['step']}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position (end of bucket)")
    ax.set_ylabel("held-out loss (nats/token)")
    norm = plt.Normalize(min(steps), max(steps))
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="step")
    ax.set_title(f"{Path(run_dir).name}: loss by position, {len(rows)} validations", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_png(fig, Path(out) if out is not None else Path(run_dir) / PICTURE)


def plot_probe(run_dir: Path, out: Optional[Path] = None) -> Optional[Path]:
    """RUN_DIR/probe.png (or `out`) from the `probe` of validation.jsonl's rows; None when no row
    has one. x: step, y: score (0..100, teacher-forced), a line per (task, length), solid for
    the exact-match score and dotted for the share of answer tokens that are the argmax."""
    rows = [r for r in _rows(run_dir) if isinstance(r.get("probe"), dict)]
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cells = list(dict.fromkeys((task, length) for r in rows for task, by in r["probe"].items() for length in by))
    colors = plt.get_cmap("tab10")
    for i, (task, length) in enumerate(cells):
        have = [r for r in rows if length in r["probe"].get(task, {})]
        steps = [r["step"] for r in have]
        ax.plot(steps, [r["probe"][task][length] for r in have], marker="o", markersize=3, color=colors(i % 10),
                label=f"{task} @ {length}")
        tokens = [r.get("probe_token_accuracy", {}).get(task, {}).get(length) for r in have]
        if all(t is not None for t in tokens):
            ax.plot(steps, tokens, linestyle=":", color=colors(i % 10))
    ax.set_ylim(-3, 103)
    ax.set_xlabel("step")
    ax.set_ylabel("probe score (teacher-forced, 0-100)")
    ax.set_title(f"{Path(run_dir).name}: retrieval probe, {rows[-1].get('probe_samples', '?')} samples per cell "
                 "(dotted: answer tokens right)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_png(fig, Path(out) if out is not None else Path(run_dir) / PROBE_PICTURE)
