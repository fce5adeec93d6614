"""The vocabulary head's limit operation (one chunk of chunked cross-entropy, forward +
backward) timed on three kinds of inputs of the same shape: unit-variance weights (logits of
std sqrt(d)), the model-scale inputs the CPU limit measures on (benchlib.cpu_limits.head_inputs),
and, with --init-from, a pretrained model's own head. Its share of exp arguments below float32's
normal range says why the times differ: the CPU's vectorized exp takes a slow path there.

    python benchmarks/bench_head_limit.py --shapes 2048x512x32000 --threads 1
    python benchmarks/bench_head_limit.py --shapes 2048x576x49152 --threads 1,2 \\
        --init-from models/smollm2-135m-instruct --out head_limit.json

Each row: the best of --repeats timed calls after one untimed call, one process, the given
intra-op threads. A shape is TOKENSxHIDDENxVOCAB, one chunk of TOKENS rows.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from benchlib.cpu_limits import head_inputs
from benchlib.machine import machine_facts
from safetensors import safe_open

from longctx.model.loss import chunked_cross_entropy
from longctx.storage import atomic

HEAD_KEYS = ("lm_head.weight", "model.embed_tokens.weight")  # untied head first, else the tied embedding


def pretrained_head(model_dir: Path) -> torch.Tensor:
    """(V, d) float32 head weight of an HF model directory's model.safetensors."""
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        key = next(k for k in HEAD_KEYS if k in f.keys())
        return f.get_tensor(key).float()


def below_normal_share(h: torch.Tensor, w: torch.Tensor) -> float:
    """Share of the softmax's exp arguments (logit - row max) below float32's smallest normal's log."""
    logits = h.detach().float() @ w.detach().float().T  # (N, V)
    shifted = logits - logits.max(dim=1, keepdim=True).values
    return float((shifted < math.log(torch.finfo(torch.float32).tiny)).float().mean())


def best_seconds(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, repeats: int) -> float:
    """Best time of the chunk's forward + backward over `repeats` calls after one untimed call."""
    times = []
    for i in range(repeats + 1):
        h.grad = w.grad = None
        start = time.perf_counter()
        chunked_cross_entropy(h, w, y, chunk_size=h.shape[0])[0].backward()
        if i:
            times.append(time.perf_counter() - start)
    return min(times)


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(text)
    tokens, hidden, vocab = map(int, parts)
    return tokens, hidden, vocab


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="2048x512x32000", help="comma-separated TOKENSxHIDDENxVOCAB")
    p.add_argument("--threads", default="1", help="comma-separated intra-op thread counts")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--init-from", type=Path, help="an HF model directory whose head is timed too")
    p.add_argument("--out", type=Path, help="write the rows and the machine facts as JSON")
    args = p.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",")]
    except ValueError as e:
        print(f"error: --shapes: cannot read {e}; use e.g. 2048x512x32000", file=sys.stderr)
        return 2
    try:
        threads = [int(t) for t in args.threads.split(",")]
        assert all(t >= 1 for t in threads)
    except (ValueError, AssertionError):
        print(f"error: --threads: {args.threads!r}; use counts >= 1, e.g. 1,2", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print(f"error: --repeats: must be >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    if args.init_from and not (args.init_from / "model.safetensors").is_file():
        print(f"error: --init-from: {args.init_from}/model.safetensors does not exist", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    real = pretrained_head(args.init_from) if args.init_from else None
    caller_threads = torch.get_num_threads()
    try:
        rows = measure(shapes, threads, dtype, real, args.repeats)
    finally:
        torch.set_num_threads(caller_threads)
    if args.out:
        report = {"command": " ".join(sys.argv), "dtype": args.dtype, "repeats": args.repeats, "rows": rows,
                  "machine": machine_facts()}
        atomic.write_text(args.out, json.dumps(report, indent=1))
    return 0


def measure(shapes: list, threads: list, dtype: torch.dtype, real, repeats: int) -> list[dict]:
    """Every (shape, threads, inputs) row, printed as a markdown table while it runs."""
    rows = []
    print("| tokens x hidden x vocab | threads | inputs | exp args below fp32 normal | best s | vs model-scale |")
    print("|---|---:|---|---:|---:|---:|")
    for tokens, hidden, vocab in shapes:
        torch.manual_seed(0)
        h, w, y = head_inputs((tokens, hidden, vocab, tokens), dtype)
        kinds = {"unit-variance weights": torch.randn_like(w).requires_grad_(), "model scale (the limit's)": w}
        if real is not None and tuple(real.shape) == (vocab, hidden):
            kinds["pretrained head"] = real.to(dtype).requires_grad_()
        for n in threads:
            torch.set_num_threads(n)
            times = {name: best_seconds(h, weight, y, repeats) for name, weight in kinds.items()}
            for name, weight in kinds.items():
                row = {"tokens": tokens, "hidden": hidden, "vocab": vocab, "threads": n, "inputs": name,
                       "below_normal_share": below_normal_share(h, weight), "best_s": times[name],
                       "vs_model_scale": times[name] / times["model scale (the limit's)"]}
                rows.append(row)
                print(f"| {tokens}x{hidden}x{vocab} | {n} | {name} | {row['below_normal_share']:.3f} | "
                      f"{row['best_s']:.3f} | {row['vs_model_scale']:.2f}x |", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
