"""The summary table a GPU script prints last, from the files it wrote in OUT_DIR.

    python scripts/gpu/gpu_summary.py check OUT_DIR     # scripts/gpu/gpu_check.sh
    python scripts/gpu/gpu_summary.py recipe OUT_DIR    # scripts/gpu/gpu_recipe_speed.sh
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def metrics(path: Path, skip: int = 2) -> dict:
    """Median tokens/s and MFU over the steps after `skip` warm-up steps of a metrics.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    rows = [r for r in rows if "tokens_per_s" in r]
    if not rows:
        return {}
    timed = rows[skip:] or rows[-1:]
    return {"steps": len(rows), "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "mfu": statistics.median(r.get("mfu") or 0.0 for r in timed),
            "peak_gb": max(r.get("peak_memory_gb") or 0.0 for r in rows),
            "loss": (rows[0].get("loss"), rows[-1].get("loss"))}


def check(out: Path) -> None:
    tests = (out / "tests.txt").read_text().strip().splitlines() if (out / "tests.txt").is_file() else []
    print("\n| check | result |\n|---|---|")
    print(f"| test_device.py | {tests[-1] if tests else 'no output'} |")
    for stage in (0, 2):
        m = metrics(out / f"train_z{stage}.jsonl")
        text = (f"{m['steps']} steps, {m['tokens_per_s']:,.0f} tok/s, MFU {m['mfu']:.3f}, peak {m['peak_gb']:.1f} GB"
                if m else "no metrics (see train_z%d.log)" % stage)
        print(f"| longctx train ZeRO-{stage} | {text} |")
    rows = []
    for f in sorted(out.glob("bench_train_*.json")):
        rows += json.loads(f.read_text())
    by = {(r["impl"], r["seq_len"]): r for r in rows}
    print("\n| T | longctx tok/s | transformers tok/s | ratio | longctx MFU | transformers MFU | peak GB ours / HF |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for T in sorted({r["seq_len"] for r in rows}):
        o, h = by.get(("ours", T), {}), by.get(("hf", T), {})
        cell = lambda r, k, f: f % r[k] if r.get(k) is not None else why(r)  # noqa: E731
        ratio = f"{o['tokens_per_s'] / h['tokens_per_s']:.2f}x" if "tokens_per_s" in o and "tokens_per_s" in h else "—"
        print(f"| {T} | {cell(o, 'tokens_per_s', '%.0f')} | {cell(h, 'tokens_per_s', '%.0f')} | {ratio} | "
              f"{cell(o, 'mfu', '%.3f')} | {cell(h, 'mfu', '%.3f')} | "
              f"{o.get('peak_rss_gb', 0):.1f} / {h.get('peak_rss_gb', 0):.1f} |")


def why(r: dict) -> str:
    if not r:
        return "not run"
    if "skipped" in r:
        return "skipped"
    return "failed: " + " ".join(r.get("failed", ["?"]))[:80].replace("|", "/")


def recipe(out: Path) -> None:
    t = metrics(out / "train_metrics.jsonl", skip=2)
    s = json.loads((out / "model_step.json").read_text()) if (out / "model_step.json").is_file() else {}
    print("\n| what | tokens/s | MFU | peak GB |\n|---|---:|---:|---:|")
    if t:
        print(f"| longctx train ({t['steps']} steps, median after warm-up) | {t['tokens_per_s']:,.0f} | "
              f"{t['mfu']:.3f} | {t['peak_gb']:.1f} |")
    else:
        print("| longctx train | no metrics (see train.log) | | |")
    if s:
        print(f"| model step alone (gpu_model_step.py, {s['steps']} steps) | {s['tokens_per_s']:,.0f} | "
              f"{(s['mfu'] or 0):.3f} | {(s['peak_memory_gb'] or 0):.1f} |")
    else:
        print("| model step alone | no result (see model_step.log) | | |")
    if t and s:
        print(f"\ntrainer / model step: {t['tokens_per_s'] / s['tokens_per_s']:.3f} (1.000 = no trainer overhead; "
              "the goal is >= 0.97)")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "recipe"):
        print("error: usage: gpu_summary.py check|recipe OUT_DIR", file=sys.stderr)
        sys.exit(2)
    {"check": check, "recipe": recipe}[sys.argv[1]](Path(sys.argv[2]))
