"""Resume on another layout, measured: for each case train K steps at layout L1, resume to N
steps at L2, and print the per-step losses beside an uninterrupted N-step run at L2.

    python scripts/faults/resume_layout_table.py                    # fp32 cases (a few minutes on 2 cores)
    python scripts/faults/resume_layout_table.py --bf16             # the same in bfloat16
    python scripts/faults/resume_layout_table.py -k "2 -> 1" --out table.md

Every layout trains 4 rows per step (micro-batch 2 x grad_accum x dp ranks) of the built-in
synthetic corpus on the debug model, on CPU (gloo). The last row of the table is the control:
the 2 -> 1 resume with the Adam moments zeroed in the converted checkpoint. "L1 vs L2 before the
resume" is how far the two layouts' own uninterrupted runs are apart in steps 1..K: the floor
a resume can be judged against (in bfloat16 a ZeRO-0 run is not a ZeRO 1-3 run).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers.layout import LAYOUTS, stopped_at, train_without_moments  # noqa: E402
from helpers.train import TINY, losses, run_train  # noqa: E402

CASES = [
    ("2 -> 1 processes", "2 ranks, ZeRO-1", "1 rank, ZeRO-1"),
    ("1 -> 2 processes", "1 rank, ZeRO-2", "2 ranks, ZeRO-2"),
    ("cp 2 -> dp 2", "2 ranks cp 2, ZeRO-1", "2 ranks, ZeRO-1"),
    ("ZeRO 1 -> 2", "1 rank, ZeRO-1", "1 rank, ZeRO-2"),
    ("ZeRO 2 -> 1", "1 rank, ZeRO-2", "1 rank, ZeRO-1"),
    ("2 ranks ZeRO-3 -> 1 rank ZeRO-0", "2 ranks, ZeRO-3", "1 rank, ZeRO-0"),
    ("1 rank ZeRO-0 -> 2 ranks ZeRO-2", "1 rank, ZeRO-0", "2 ranks, ZeRO-2"),
]
CONTROL = "2 -> 1 without Adam moments (control)"


def _ok(res: subprocess.CompletedProcess) -> None:
    if res.returncode != 0:
        sys.exit(res.stdout[-2000:] + res.stderr[-3000:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="N, steps in all")
    ap.add_argument("--at", type=int, default=3, help="K, steps at L1")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("-k", default="", help="only the cases whose title contains this")
    ap.add_argument("--out", help="also write the table here (markdown)")
    args = ap.parse_args()
    base = [*TINY, "optim.schedule=constant", f"train.steps={args.steps}", f"checkpoint.every={args.at}",
            "checkpoint.keep_last=3"] + (["train.dtype=bfloat16"] if args.bf16 else [])
    work = Path(tempfile.mkdtemp(prefix="resume-layout-"))
    runs: dict[str, Path] = {}

    def uninterrupted(name: str) -> Path:
        if name not in runs:
            nproc, extra = LAYOUTS[name]
            runs[name] = work / f"run{len(runs)}"
            _ok(run_train(nproc, [*base, *extra, f"out_dir={runs[name]}"]))
        return runs[name]

    cases = [c for c in CASES if args.k in c[0]] + ([(CONTROL, *CASES[0][1:])] if args.k in CONTROL else [])
    lines = ["| case | step | uninterrupted at L2 | resumed (L1 until step %d) | abs diff |" % args.at,
             "|---|---|---|---|---|"]
    summary = []
    for i, (title, old, new) in enumerate(cases):
        out = stopped_at(uninterrupted(old), work / f"case{i}", args.at)
        nproc, extra = LAYOUTS[new]
        overrides = [*base, *extra, f"out_dir={out}", "checkpoint.resume=auto"]
        if title == CONTROL:
            res = train_without_moments(overrides)
        else:
            res = run_train(nproc, overrides)
        _ok(res)
        reference, resumed = losses(uninterrupted(new)), losses(out)
        worst = max(abs(a - b) for a, b in zip(reference[args.at:], resumed[args.at:]))
        apart = max(abs(a - b) for a, b in zip(reference[:args.at], resumed[:args.at]))  # L1 vs L2, no resume yet
        for step, (a, b) in enumerate(zip(reference, resumed), 1):
            lines.append(f"| {title}: {old} -> {new} | {step} | {a:.7f} | {b:.7f} | {abs(a - b):.1e} |")
        summary.append(f"| {title} | {old} | {new} | {apart:.1e} | {worst:.1e} |")
        print(f"{title}: max abs diff after the resume {worst:.1e}", file=sys.stderr, flush=True)
    table = "\n".join(lines + ["", "| case | L1 | L2 | L1 vs L2 before the resume | max abs diff after the resume |",
                                "|---|---|---|---|---|", *summary])
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
