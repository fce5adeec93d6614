"""Adapters against full training on CPU: the real trainer at world 2, full training and an adapter
run (LoRA r 16 on q/k/v/o, embeddings and norms trained: LongLoRA's choice) in the same layout,
interleaved (full, adapter, full, adapter, ...), at one length; rank 0's measured peak RSS and
tokens/s next to the planner's predicted peak, and the planner's longest sequence within a
per-rank budget for both. `--adapter-longer` adds one adapter run at a longer length (the longer
sequence in the same memory: its peak against full training's).

The model is bench-44m (4 layers, d 512, GQA 8:4, vocab 32000, fp32) at cp 2 (Ulysses), ZeRO-0,
full checkpointing with the attention recomputed, MLP tiles of 2048 tokens and 1024-token loss
chunks; glibc's mmap threshold is fixed at 64 KiB so that RSS tracks live memory
(benchlib/trainer_runs.py).

    python benchmarks/bench_adapter.py --seq-len 16384 --adapter-longer 24576 --repeat 2 \\
        --out docs/results/bench_adapter.json
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchlib.report import write_json
from benchlib.trainer_runs import WORLD, measure, predict

SETTINGS = ["model.preset=bench-44m", "parallel.cp_size=2", "parallel.cp_impl=ulysses", "parallel.zero_stage=0",
            "parallel.activation_checkpointing=full", "parallel.recompute_attention=true",
            "parallel.mlp_tile_tokens=2048", "train.loss_chunk_size=1024"]
ADAPTER = ("train.adapter={r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj], "
           "trainable: [embed_tokens, norm]}")
RUNS = {"full": [], "adapter": [ADAPTER]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--adapter-longer", type=int, help="also an adapter run at this longer length")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for both")
    ap.add_argument("--repeat", type=int, default=2, help="runs per case, interleaved")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget-gib", type=float, default=1.5, help="per-rank budget of the predicted longest")
    ap.add_argument("--out", help="write the runs and predictions as JSON")
    args = ap.parse_args()
    cases = [("full", args.seq_len), ("adapter", args.seq_len)]
    if args.adapter_longer:
        cases.append(("adapter", args.adapter_longer))
    settings = [*SETTINGS, *args.set]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for kind, seq_len in cases if i == 0 else cases[:2]:  # the longer run is for its peak: once
                r = dict(kind=kind, **measure([*settings, *RUNS[kind]], seq_len, args.steps, Path(tmp) / "run"))
                runs.append(r)
                print(f"{kind} #{i} at {seq_len:,} tokens: peak {r['peak_gib']:.3f} GiB, "
                      f"{r['tokens_per_s']:.0f} tokens/s, wall {r['wall_s']:.0f} s", flush=True)
    summary = []
    for kind, seq_len in cases:
        mine = [r for r in runs if r["kind"] == kind and r["seq_len"] == seq_len]
        rates = sorted(r["tokens_per_s"] for r in mine)
        peak = max(r["peak_gib"] for r in mine)
        pred = predict([*settings, *RUNS[kind]], seq_len, args.budget_gib)
        row = {"kind": kind, "seq_len": seq_len, "peak_gib": peak, "tokens_per_s": rates,
               "tokens_per_s_median": rates[len(rates) // 2], **pred, "error": (pred["predicted_gib"] - peak) / peak}
        summary.append(row)
        print(f"{kind} at {seq_len:,} tokens: measured peak {peak:.3f} GiB, predicted {pred['predicted_gib']:.3f} "
              f"({row['error']:+.1%}); tokens/s {rates}; predicted longest within {args.budget_gib} GiB: "
              f"{pred['predicted_longest']:,}")
    at_length = [r for r in runs if r["seq_len"] == args.seq_len]
    ratios = [a["tokens_per_s"] / f["tokens_per_s"] for f, a in zip(at_length[0::2], at_length[1::2])]
    print(f"adapter / full tokens/s, paired by repeat: {[round(x, 3) for x in ratios]}")
    if args.out:
        command = "python benchmarks/bench_adapter.py " + " ".join(sys.argv[1:])
        write_json(args.out, {"command": command, "world": WORLD, "settings": settings, "adapter": ADAPTER,
                              "runs": runs, "summary": summary, "tokens_per_s_ratios": ratios}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
