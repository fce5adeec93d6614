"""Activation offload on CPU: the real trainer at world 2 with `parallel.offload_activations=disk`
against none, interleaved (none, disk, none, disk, ...), at one length; the measured peak RSS and
tokens/s of rank 0 next to the planner's predicted peak, and the planner's longest sequence within
a per-rank budget for both.

The model and settings are bench_peers.py's longctx contender (bench-44m, cp 2 Ulysses, full
checkpointing with the attention recomputed, MLP tiles of 2048 tokens, 1024-token loss chunks),
with glibc's mmap threshold fixed at 64 KiB so that RSS tracks live memory (bench_plan.py's note).
The prediction uses the planner's CPU runtime constant (0.36 GiB, docs/plan.md). `--set` changes
the model (a deeper one, where the block inputs that offload moves are most of the peak);
`--disk-longer` adds a disk run at a longer length (the longer sequence in the same memory).

    python benchmarks/bench_offload.py --seq-len 16384 --disk-longer 20480 --repeat 2 --steps 2 \
        --set model.overrides.num_hidden_layers=16 model.overrides.hidden_size=256 \
        model.overrides.intermediate_size=688 model.overrides.num_attention_heads=4 \
        model.overrides.num_key_value_heads=2 --out docs/results/bench_offload.json
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchlib.report import write_json
from benchlib.trainer_runs import WORLD, measure, predict

SETTINGS = ["model.preset=bench-44m", "parallel.cp_size=2", "parallel.cp_impl=ulysses",
            "parallel.activation_checkpointing=full", "parallel.recompute_attention=true",
            "parallel.mlp_tile_tokens=2048", "train.loss_chunk_size=1024"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--disk-longer", type=int, help="also a disk run at this longer length")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides (the model's shape)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per case, interleaved")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget-gib", type=float, default=1.5, help="per-rank budget of the predicted longest")
    ap.add_argument("--out", help="write the runs and predictions as JSON")
    args = ap.parse_args()
    cases = [("none", args.seq_len), ("disk", args.seq_len)]
    if args.disk_longer:
        cases.append(("disk", args.disk_longer))
    settings = [*SETTINGS, *args.set]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for mode, seq_len in cases:
                r = dict(mode=mode, **measure([*settings, f"parallel.offload_activations={mode}"], seq_len, args.steps,
                                              Path(tmp) / "run"))
                runs.append(r)
                print(f"{mode} #{i} at {seq_len:,} tokens: peak {r['peak_gib']:.3f} GiB, "
                      f"{r['tokens_per_s']:.0f} tokens/s, wall {r['wall_s']:.0f} s", flush=True)
    summary = []
    for mode, seq_len in cases:
        mine = [r for r in runs if r["mode"] == mode and r["seq_len"] == seq_len]
        rates = sorted(r["tokens_per_s"] for r in mine)
        peak = max(r["peak_gib"] for r in mine)
        pred = predict([*settings, f"parallel.offload_activations={mode}"], seq_len, args.budget_gib)
        row = {"mode": mode, "seq_len": seq_len, "peak_gib": peak, "tokens_per_s_min": rates[0],
               "tokens_per_s_median": rates[len(rates) // 2], **pred, "error": (pred["predicted_gib"] - peak) / peak}
        summary.append(row)
        print(f"{mode} at {seq_len:,} tokens: measured peak {peak:.3f} GiB, predicted {pred['predicted_gib']:.3f} "
              f"({row['error']:+.1%}); tokens/s median {row['tokens_per_s_median']:.0f}; "
              f"predicted longest within {args.budget_gib} GiB: {pred['predicted_longest']:,}")
    same = all(r["losses"] == next(x for x in runs if x["seq_len"] == r["seq_len"])["losses"] for r in runs)
    print(f"losses identical across the runs of one length (offload or not): {same}")
    if args.out:
        command = "python benchmarks/bench_offload.py " + " ".join(sys.argv[1:])
        write_json(args.out, {"command": command, "world": WORLD, "settings": settings, "runs": runs,
                              "summary": summary, "losses_identical": same}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
