"""`longctx demo`: the built-in default job, context extension end to end on a laptop CPU.

1. train a tiny byte-level LLaMA at 256 tokens on the built-in synthetic retrieval corpus;
2. evaluate RULER-style retrieval (niah single / multikey / multivalue, passkey) at 1x-8x;
3. extend: YaRN x4 + continued pretraining at 1024 tokens, 2 processes, cp=2, ZeRO-3;
4. re-evaluate; before/after table, heatmaps, curves and report.md in the run directory;
5. extend again, the same job training only an adapter (LoRA on the attention projections plus
   the embeddings and norms), and evaluate it: retrieval, memory and time beside the full run.

`--fast` runs the same pipeline with token budgets (the CI smoke test); `--ablation` adds
(b) scaling only and (d) the same continued pretraining with plain RoPE; `--no-adapter` leaves
out step 5. See docs/demo.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import signal
import sys
from pathlib import Path

from longctx.base.errors import UserError


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo",
                   help="run directory (default: runs/demo; a previous demo run there is replaced)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default: 0); the test set is fixed")
    p.add_argument("--fast", action="store_true", help="smoke run (~3 min): the same pipeline, token budgets")
    p.add_argument("--ablation", action="store_true",
                   help="also run (b) scaling only and (d) the same continued pretraining with plain RoPE")
    p.add_argument("--no-adapter", dest="adapter", action="store_false",
                   help="leave out (e), the extension that trains only an adapter (LoRA + embeddings and norms)")


def run(args: argparse.Namespace) -> int:
    from longctx.demo.config import demo_config  # torch and the pipeline: imported when the demo runs, not for --help
    from longctx.demo.jobs import check_out_dir
    from longctx.demo.pipeline import MARKER, run_demo

    if args.seed < 0:
        raise UserError(f"--seed: must be >= 0, got {args.seed}")
    check_out_dir(Path(args.out), MARKER)  # before anything is replaced, created or signalled
    if args.adapter and importlib.util.find_spec("peft") is None:
        raise UserError("the demo's adapter run (e) needs the peft package: pip install 'longctx[adapters]', "
                        "or leave the run out with --no-adapter")
    demo = demo_config("fast" if args.fast else "full")
    if demo.dtype == "auto":
        from longctx.train.cpu_dtype import auto_dtype

        dtype, why = auto_dtype()
        print(f"demo: dtype {dtype}: {why}", file=sys.stderr)
        demo = dataclasses.replace(demo, dtype=dtype)
    # SIGTERM (kill, a job scheduler) unwinds like Ctrl-C, so the running training job is
    # stopped too (jobs.stop_job) instead of being left behind
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run_demo(demo, Path(args.out), seed=args.seed, ablation=args.ablation, adapter=args.adapter,
                        argv=sys.argv[1:])
    except RuntimeError as e:  # a training job failed; its log is named in the message
        print(f"error: {e}", file=sys.stderr)
        return 1
