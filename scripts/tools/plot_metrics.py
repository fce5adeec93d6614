"""Loss curve of a training run: RUN_DIR/metrics.jsonl -> RUN_DIR/loss.png (or --out); with
validation rows, also RUN_DIR/validation.jsonl -> RUN_DIR/validation.png (and, with probe scores,
RUN_DIR/probe.png).

    python scripts/tools/plot_metrics.py runs/smollm2-16k-cpu

Each record's loss against its step, with the tokens trained on (tokens_seen) on a second axis
label; skipped (non-finite) steps are left out. validation.png: the held-out loss by position,
one line per validation coloured by its step. probe.png: the retrieval probe's scores against
step, one line per task and length.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from longctx.train.validation_plot import plot_probe, plot_validation  # noqa: E402


def read_metrics(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "loss" in r and not r.get("skipped")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, help="PNG path (default: RUN_DIR/loss.png)")
    args = p.parse_args(argv)
    metrics = args.run_dir / "metrics.jsonl"
    if not metrics.is_file():
        print(f"error: run_dir: {metrics} does not exist (a longctx train out_dir)", file=sys.stderr)
        return 2
    rows = read_metrics(metrics)
    if not rows:
        print(f"error: run_dir: {metrics} holds no step with a loss", file=sys.stderr)
        return 2
    out = args.out or args.run_dir / "loss.png"
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker="o")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    last = rows[-1]
    ax.set_title(f"{args.run_dir.name}: {last['step']} steps, {last.get('tokens_seen', 0):,} tokens", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    for plot in (plot_validation, plot_probe):
        if (picture := plot(args.run_dir)) is not None:
            print(f"wrote {picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
