"""The summary tables a GPU script prints last (gpu_env.sh's exit), from the files already in
OUT_DIR: they print whatever finished, also after a step ran out of time.

    python scripts/gpu/gpu_summary.py steps OUT_DIR     # every script: each step's limit, time, result
    python scripts/gpu/gpu_summary.py check OUT_DIR     # scripts/gpu/gpu_check.sh
    python scripts/gpu/gpu_summary.py bench OUT_DIR     # scripts/gpu/gpu_bench_train.sh
    python scripts/gpu/gpu_summary.py recipe OUT_DIR    # scripts/gpu/gpu_recipe_speed.sh
    python scripts/gpu/gpu_summary.py doc OUT_DIR       # scripts/gpu/gpu_doc_attention.sh
    python scripts/gpu/gpu_summary.py profile OUT_DIR   # scripts/gpu/gpu_profile_step.sh
    python scripts/gpu/gpu_summary.py smollm2 OUT_DIR   # scripts/gpu/gpu_smollm2_32k.sh
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def read_json(path: Path):
    """A JSON file's content, or None when it is missing or cut short."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(out: Path) -> None:
    rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()] \
        if (out / "steps.tsv").is_file() else []
    print("\n| step | limit s | took s | result |\n|---|---:|---:|---|")
    for name, limit, took, result in (r for r in rows if len(r) == 4):
        print(f"| {name} | {limit} | {took} | {result} |")
    if not rows:
        print("| (no step ran) | | | |")


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
    tests = [line for line in (out / "tests.log").read_text().strip().splitlines() if line.strip()] \
        if (out / "tests.log").is_file() else []
    print("\n| check | result |\n|---|---|")
    print(f"| test_device.py | {tests[-1] if tests else 'no output'} |")
    for stage in (0, 2):
        m = metrics(out / f"train_z{stage}.jsonl")
        text = (f"{m['steps']} steps, {m['tokens_per_s']:,.0f} tok/s, MFU {m['mfu']:.3f}, peak {m['peak_gb']:.1f} GB"
                if m else "no metrics (see train_z%d.log)" % stage)
        print(f"| longctx train ZeRO-{stage} | {text} |")


def bench(out: Path) -> None:
    rows = []
    for f in sorted(out.glob("bench_train_*.json")):
        rows += read_json(f) or []
    if not rows:
        print("\nbench_train: no rows (see the bench_train_*.log files)")
        return
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
    s = read_json(out / "model_step.json") or {}
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


def doc(out: Path) -> None:
    report = read_json(out / "doc_attention.json")
    if not report or not report.get("rows"):
        print("\ndocument attention: no rows (see bench.log)")
        return
    sys.path.insert(0, str(BENCHMARKS))
    from bench_doc_attention import print_table

    print_table(report["rows"])


def profile(out: Path) -> None:
    found = False
    for f in sorted(out.glob("profile_*.json")):
        r = read_json(f)
        if not r:
            continue
        found = True
        kinds = r["by_kind"]
        names = sorted({k for v in kinds.values() for k in v},
                       key=lambda k: -max(v.get(k, 0.0) for v in kinds.values()))
        print(f"\n## ms by kind of work, one step, T={r['seq_len']} ({r['device']})\n\n| kind | "
              + " | ".join(f"{impl} ms" for impl in kinds) + " |\n|---|" + "---:|" * len(kinds))
        for k in names + ["total"]:
            vals = [sum(v.values()) if k == "total" else v.get(k, 0.0) for v in kinds.values()]
            print(f"| {k} | " + " | ".join(f"{x:.1f}" for x in vals) + " |")
    if not found:
        print("\nprofile: no results (see the profile_*.log files)")


def smollm2(out: Path) -> None:
    print("\n| model | phase | result |\n|---|---|---|")
    for name in ("zero-shot", "trained"):
        for phase in ("ppl", "ruler"):
            r = read_json(out / f"{name}-{phase}.json")
            if not r:
                print(f"| {name} | {phase} | no results |")
            elif phase == "ppl":
                print(f"| {name} | ppl | " + ", ".join(f"{row['length']}: {row['ppl']:.3f}" for row in r["ppl"]["rows"])
                      + " |")
            else:
                scores: dict = {}
                for sample in r["samples"]:
                    scores.setdefault(sample["task"], []).append(sample["score"])
                print(f"| {name} | ruler | " + ", ".join(f"{t}: {sum(v) / len(v):.1f}" for t, v in scores.items())
                      + " |")
    m = metrics(out / "train_metrics.jsonl", skip=0)
    if m:
        print(f"\ntraining: {m['steps']} steps, loss {m['loss'][0]:.3f} -> {m['loss'][1]:.3f}, "
              f"{m['tokens_per_s']:,.0f} tok/s, MFU {m['mfu']:.3f}, peak {m['peak_gb']:.1f} GB")


TABLES = {"steps": steps, "check": check, "bench": bench, "recipe": recipe, "doc": doc, "profile": profile,
          "smollm2": smollm2}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in TABLES:
        print(f"error: usage: gpu_summary.py {'|'.join(TABLES)} OUT_DIR", file=sys.stderr)
        sys.exit(2)
    TABLES[sys.argv[1]](Path(sys.argv[2]))
