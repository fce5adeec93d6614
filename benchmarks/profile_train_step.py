"""torch.profiler on one training step of longctx and of transformers (bench_train.py's step, same
model and batch): each side's top kernels by self device time, and the two sides' time per kind
of work (attention, loss, GEMM, RoPE, copies, reductions, elementwise, communication, other) side
by side, so the gap between them is named by kernel.

    python benchmarks/profile_train_step.py --device cuda --preset llama2-7b --layers 4 --seq-len 8192 \\
        --out docs/results/profile_step_h100.json

One warm-up step, then one step under the profiler (a profile, not a timing: bench_train.py
times). On CPU the same with self CPU time (tiny shapes, for checking the script).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from bench_train import TrainStep

from longctx.storage import atomic

# a kernel's kind from its name (CUDA kernel names, or aten op names on CPU); first match wins
KINDS = [
    ("communication", ("nccl", "gloo", "allreduce", "all_reduce", "allgather", "reducescatter", "sendrecv")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("loss", ("softmax", "cross_entropy", "nll_loss")),  # the vocabulary head's (attention's is fused)
    ("gemm", ("gemm", "xmma", "cutlass", "sm90", "sm80", "aten::mm", "aten::addmm", "aten::bmm", "matmul")),
    ("rope", ("rotary", "rope", "aten::cos", "aten::sin")),
    ("copies", ("copy", "memcpy", "memset", "cat", "index", "gather", "scatter", "fill")),
    ("reductions", ("reduce", "sum", "norm", "mean", "max")),
    ("elementwise", ("elementwise", "vectorized", "pointwise", "triton", "mul", "add", "silu", "exp", "rsqrt")),
]


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile_step(step, device: str) -> list[dict]:
    """[{name, kind, calls, self_ms}] of one step() under torch.profiler, device kernels on CUDA."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
    rows = []
    for e in prof.key_averages():
        if device == "cuda":
            self_us = getattr(e, "self_device_time_total", None)
            if self_us is None:
                self_us = getattr(e, "self_cuda_time_total", 0)
        else:
            self_us = e.self_cpu_time_total
        if self_us > 0:
            rows.append({"name": e.key, "kind": kind_of(e.key), "calls": e.count, "self_ms": self_us / 1e3})
    return sorted(rows, key=lambda r: -r["self_ms"])


def by_kind(rows: list[dict]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        out[r["kind"]] += r["self_ms"]
    return dict(out)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--preset", default="bench-44m")
    p.add_argument("--layers", type=int, default=0, help="override the preset's layer count (0: keep)")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--impls", default="ours,hf")
    p.add_argument("--rows", type=int, default=15, help="top kernels listed per side")
    p.add_argument("--out", help="write every kernel row and the per-kind totals as JSON")
    args = p.parse_args(argv)
    impls = args.impls.split(",")
    if args.seq_len < 2 or args.layers < 0 or args.rows < 1 or not set(impls) <= {"ours", "hf"}:
        p.exit(2, "error: --seq-len >= 2, --layers >= 0, --rows >= 1, --impls from ours,hf\n")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.exit(2, "error: --device cuda, but this process sees no CUDA device; valid here: cpu\n")
    args.impls = impls
    return args


def save(args, profiles: dict) -> None:
    kinds = {impl: by_kind(rows) for impl, rows in profiles.items()}
    atomic.write_text(args.out, json.dumps({"command": " ".join(sys.argv), "device": args.device, "preset": args.preset,
                                            "layers": args.layers, "seq_len": args.seq_len, "by_kind": kinds,
                                            "kernels": profiles}, indent=1))


def main(argv=None) -> int:
    args = parse(argv)
    profiles = {}
    for impl in args.impls:
        contender = TrainStep(impl, args.seq_len, args.device, args.preset, args.layers)
        contender.step()  # warm-up: optimizer state, kernels chosen and compiled
        profiles[impl] = profile_step(contender.step, args.device)
        del contender
        if args.device == "cuda":
            import torch

            torch.cuda.empty_cache()
        if args.out:  # each side on disk as it finishes: a run stopped at a time limit keeps it
            save(args, profiles)
    unit = "self device ms" if args.device == "cuda" else "self CPU ms"
    for impl, rows in profiles.items():
        print(f"\n## {impl}: top {args.rows} by {unit}\n\n| {unit} | calls | kind | kernel |\n|---:|---:|---|---|")
        for r in rows[:args.rows]:
            print(f"| {r['self_ms']:.2f} | {r['calls']} | {r['kind']} | `{r['name'][:90]}` |")
    kinds = {impl: by_kind(rows) for impl, rows in profiles.items()}
    names = sorted({k for v in kinds.values() for k in v}, key=lambda k: -max(v.get(k, 0.0) for v in kinds.values()))
    head = " | ".join(f"{impl} ms" for impl in profiles)
    print(f"\n## {unit} by kind of work, one step, T={args.seq_len}\n\n| kind | {head} |\n|---|"
          + "---:|" * len(profiles))
    for k in names + ["total"]:
        vals = [sum(v.values()) if k == "total" else v.get(k, 0.0) for v in kinds.values()]
        print(f"| {k} | " + " | ".join(f"{x:.1f}" for x in vals) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
