"""Document-masked attention through torch SDPA, forward + backward: a dense (B, 1, T, T) keep-mask
(what F.scaled_dot_product_attention needs for packed documents) against
longctx.attention.sdpa.document_runs_attention, the sdpa backend's path on a GPU (a causal call
per long document, a masked call per group of short ones), and against the same with one call
per document (no groups). Plain causal attention over the whole row is the floor. Each row of
the table first states how far the outputs and gradients are from the dense mask's, then the
times.

    python benchmarks/bench_doc_attention.py --device cuda --dtype bfloat16 --lengths 32768 \\
        --docs 1,4,16,64 --heads 9,3 --head-dim 64 --out doc_attention.json

--docs N cuts each row into N documents at seeded random positions. Times are the median of
--repeats calls after one untimed call; peak is the device's max allocated memory during a call
(CUDA only).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from benchlib.machine import machine_facts

from longctx import atomic
from longctx.attention.core import build_mask
from longctx.attention.sdpa import document_runs_attention


def document_ids(B: int, T: int, docs: int, seed: int) -> torch.Tensor:
    """(B, T) ids of `docs` contiguous documents per row, cut at seeded random positions."""
    rng = random.Random(seed)
    rows = []
    for _ in range(B):
        cuts = sorted(rng.sample(range(1, T), docs - 1))
        ids = torch.zeros(T, dtype=torch.long)
        for c in cuts:
            ids[c:] += 1
        rows.append(ids)
    return torch.stack(rows)


def contenders(ids: torch.Tensor) -> dict:
    """name -> attention(q, k, v) -> out, all causal over the packed documents of `ids` (the floor: none)."""
    def dense(q, k, v):
        mask = build_mask(q.shape[2], k.shape[2], causal=True, segment_ids=ids, kv_segment_ids=None,
                          device=q.device)  # (B, 1, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])

    def runs(q, k, v):
        return document_runs_attention(q, k, v, ids)

    def per_document(q, k, v):
        return document_runs_attention(q, k, v, ids, group_tokens=1)

    def causal_floor(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])

    return {"dense mask": dense, "document runs": runs, "one call per document": per_document,
            "causal, no documents (floor)": causal_floor}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, q, k, v, dout, repeats: int) -> tuple[float, float | None, tuple]:
    """Median seconds of forward + backward, peak GiB (CUDA), and (out, dq, dk, dv) of the last call."""
    device = q.device
    times, peak = [], None
    for i in range(repeats + 1):
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        out = fn(qq, kk, vv)
        out.backward(dout)
        sync(device)
        if i:
            times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    return statistics.median(times), peak, (out.detach(), qq.grad, kk.grad, vv.grad)


def parse_ints(name: str, text: str, minimum: int = 1) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or any(x < minimum for x in values):
        raise ValueError(f"--{name}: {text!r}; use comma-separated integers >= {minimum}")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--lengths", default="32768", help="comma-separated tokens per row")
    p.add_argument("--docs", default="1,4,16,64", help="comma-separated documents per row")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", default="9,3", help="query heads,kv heads")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, help="write the rows and the machine facts as JSON")
    args = p.parse_args(argv)
    try:
        lengths, docs = parse_ints("lengths", args.lengths, 2), parse_ints("docs", args.docs)
        heads = parse_ints("heads", args.heads)
        if len(heads) != 2 or heads[0] % heads[1]:
            raise ValueError(f"--heads: {args.heads!r}; use QUERY,KV with KV dividing QUERY, e.g. 9,3")
        if args.batch < 1 or args.head_dim < 1 or args.repeats < 1:
            raise ValueError("--batch, --head-dim, --repeats: must be >= 1")
        if max(docs) > min(lengths):
            raise ValueError(f"--docs: {max(docs)} documents do not fit in {min(lengths)} tokens")
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device: cuda, but this process sees no CUDA device; valid here: cpu")
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = measure(lengths, docs, args.batch, heads, args.head_dim, getattr(torch, args.dtype), device, args.repeats)
    if args.out:
        report = {"command": " ".join(sys.argv), "dtype": args.dtype, "device": str(device),
                  "repeats": args.repeats, "rows": rows, "machine": machine_facts()}
        atomic.write_text(args.out, json.dumps(report, indent=1))
    return 0


def measure(lengths, docs, B, heads, D, dtype, device, repeats) -> list[dict]:
    """Every (length, docs) row, printed as a markdown table while it runs."""
    Hq, Hkv = heads
    rows = []
    print("| tokens | docs | max abs diff (out, grads) | dense mask ms | document runs ms | one call per document ms "
          "| floor ms | speedup | peak GiB dense / runs |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        q, k, v, dout = (torch.randn(B, h, T, D, generator=g).to(device, dtype) for h in (Hq, Hkv, Hkv, Hq))
        for n in docs:
            ids = document_ids(B, T, n, seed=n).to(device)
            results = {name: timed(fn, q, k, v, dout, repeats) for name, fn in contenders(ids).items()}
            dense, runs = results["dense mask"], results["document runs"]
            diff = max((a.float() - b.float()).abs().max().item()
                       for other in (runs, results["one call per document"]) for a, b in zip(dense[2], other[2]))
            row = {"tokens": T, "docs": n, "batch": B, "heads": heads, "head_dim": D, "max_abs_diff": diff,
                   **{f"{name} s": r[0] for name, r in results.items()},
                   **{f"{name} peak_gib": r[1] for name, r in results.items()},
                   "speedup": dense[0] / runs[0]}
            rows.append(row)
            peaks = "-" if dense[1] is None else f"{dense[1]:.2f} / {runs[1]:.2f}"
            print(f"| {T} | {n} | {diff:.1e} | {dense[0] * 1e3:.1f} | {runs[0] * 1e3:.1f} | "
                  f"{results['one call per document'][0] * 1e3:.1f} | "
                  f"{results['causal, no documents (floor)'][0] * 1e3:.1f} | {row['speedup']:.2f}x | {peaks} |",
                  flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
