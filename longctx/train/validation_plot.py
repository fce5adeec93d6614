"""validation.png: the held-out loss by position, one line per validation coloured by its step
(written at the end of a run with validation, and by scripts/plot_metrics.py on any run directory)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from longctx.eval.plots import pyplot, save_png
from longctx.train.metrics import VALIDATION_FILE

PICTURE = "validation.png"


def read_rows(run_dir: Path) -> list[dict]:
    """The validation rows of a run directory (a torn last line of a killed run left out)."""
    path = Path(run_dir) / VALIDATION_FILE
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return [r for r in rows if isinstance(r.get("val_loss_by_position"), dict)]


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
