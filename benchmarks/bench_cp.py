"""Context-parallel benchmark on CPU: per-rank peak memory and step time of a full-model
forward + backward at a fixed total sequence length, for cp = 1, 2, 4 and each CP impl,
plus ring attention with vs without communication overlap.

    .venv/bin/python benchmarks/bench_cp.py --seq-len 4096 --iters 2

Each cp size runs in one group of spawned gloo processes (world size = cp) that measures
all impls round-robin, so drifts in machine load hit every variant alike.
Memory: glibc is told to serve allocations >= 64 KiB with mmap (mallopt), so freed tensors
leave the resident set at once; the peak-RSS counter is reset (/proc/self/clear_refs) at the
start of a measured step and the reported figure is peak RSS minus RSS at step start, i.e.
activations, transient communication buffers and autograd temporaries (parameters and
their .grad buffers are allocated before the step). Time: median over iterations of the step wall
time (max over ranks). Ring wait: seconds a step spent blocked on ring transfers (communication not
hidden behind compute), max over ranks. Ratios are against cp = 1 in the same run (no
absolute numbers are asserted).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from longctx.model import ModelConfig, build_model  # noqa: E402
from longctx.parallel import make_cp_attention, shard_batch, validate_layout  # noqa: E402
from longctx.parallel.comm import COMM_STATS, reset_comm_stats  # noqa: E402
from longctx.parallel.heads import HeadShards  # noqa: E402
from longctx.parallel.layout import resolve_layout  # noqa: E402
from longctx.parallel.mesh import import_before_process_groups, shutdown_distributed  # noqa: E402

VARIANTS = {"ring": ("ring", None, True), "ring-no-overlap": ("ring", None, False),
            "allgather": ("allgather", None, True), "ulysses": ("ulysses", None, True),
            "hybrid": ("hybrid", 2, True), "hybrid-auto": ("hybrid", 0, True)}


def bench_model_config(args) -> ModelConfig:
    return ModelConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.seq_len, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _rss_mib():
    s = open("/proc/self/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", s).group(1))
    hwm = int(re.search(r"VmHWM:\s+(\d+)", s).group(1))
    return rss / 1024, hwm / 1024


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _worker(rank, world, port, out_path, args, variants, threads):
    """Runs every variant (impl, ulysses, overlap) in this one process group, round-robin over
    iterations, so slow drifts in machine load hit all variants alike."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD: big blocks are mmapped, returned on free
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import_before_process_groups()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = bench_model_config(args)
    model = build_model(cfg, seed=0)
    attns = [make_cp_attention(None, impl=impl, ulysses_size=u, overlap=ov) if world > 1 else None
             for impl, u, ov in variants]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len), generator=g)
    labels = torch.cat([ids[:, 1:], torch.full((args.batch, 1), -100)], dim=1)
    local = shard_batch({"input_ids": ids, "labels": labels}, rank, world)
    n_tokens = int((labels != -100).sum())

    def step(attn):
        if attn is not None:
            model.set_attention(attn)
        logits = model(local["input_ids"], position_ids=local["position_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), local["labels"].flatten(), ignore_index=-100,
                               reduction="sum") / n_tokens
        del logits
        loss.backward()

    for attn in attns:
        step(attn)  # warm-up; also allocates the .grad buffers
    times = [[] for _ in variants]
    peaks = [[] for _ in variants]
    waits = [[] for _ in variants]
    for it in range(args.iters):
        order = list(range(len(attns)))
        for i in (order if it % 2 == 0 else order[::-1]):  # alternate the order: no position bias
            attn = attns[i]
            dist.barrier()
            base, _ = _rss_mib()
            _reset_peak()
            reset_comm_stats()
            t0 = time.perf_counter()
            step(attn)
            t = torch.tensor([time.perf_counter() - t0, COMM_STATS["wait_s"]])
            _, peak = _rss_mib()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[i].append(t[0].item())
            waits[i].append(t[1].item())
            peaks[i].append(peak - base)
    res = [{"time": statistics.median(t), "wait": statistics.median(w), "peak_mib": max(m)}
           for t, w, m in zip(times, waits, peaks)]
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(res, f)
    shutdown_distributed(completed=True)


def run_group(args, cp, variants):
    """One spawned gloo group of `cp` processes measuring all `variants`; one row per variant."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads = max(1, (args.threads or os.cpu_count()) // cp)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "res")
        mp.start_processes(_worker, args=(cp, port, out, args, variants, threads), nprocs=cp, start_method="spawn")
        ranks = [json.load(open(f"{out}.{r}")) for r in range(cp)]
    rows = []
    for i, (impl, u, overlap) in enumerate(variants):
        lay = resolve_layout(validate_layout(cp, impl, u), args.heads, args.kv_heads) if cp > 1 else None
        uneven = lay is not None and lay.ulysses_size > 1 and not HeadShards(args.heads, args.kv_heads,
                                                                              lay.ulysses_size).even
        rows.append({"cp": cp, "impl": impl if cp > 1 else "none", "overlap": overlap,
                     "layout": (f"{lay.ulysses_size} x {lay.ring_size}" + (" (uneven heads)" if uneven else "")
                                if lay else "-"),
                     "time_s": max(r[i]["time"] for r in ranks), "ring_wait_s": max(r[i]["wait"] for r in ranks),
                     "peak_mib": max(r[i]["peak_mib"] for r in ranks)})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=None, help="default: hidden / heads")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="total intra-op threads, split across ranks (0: all cores)")
    p.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--impls", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    rows = []
    for cp in args.cp:
        if cp == 1:
            variants = [("ring", None, True)]
        else:
            variants = [VARIANTS[name] for name in args.impls.split(",")
                        if name != "hybrid" or (cp >= 4 and cp % 2 == 0)]
        for row in run_group(args, cp, variants):
            rows.append(row)
            print(f"# cp={cp} impl={row['impl']} overlap={row['overlap']}: {row['time_s']:.2f}s "
                  f"{row['peak_mib']:.0f} MiB", file=sys.stderr, flush=True)
    base = next((r for r in rows if r["cp"] == 1), None)
    print(f"\nseq_len={args.seq_len} batch={args.batch} hidden={args.hidden} layers={args.layers} "
          f"heads={args.heads}/{args.kv_heads} head_dim={bench_model_config(args).head_dim} vocab={args.vocab} "
          f"cores={os.cpu_count()}\n")
    print("| cp | impl | ulysses x ring | overlap | step time (s) | ring wait (s) | "
          "peak mem / rank (MiB) | mem vs cp=1 |")
    print("|---:|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['peak_mib'] / base['peak_mib']:.2f}x" if base else "-"
        print(f"| {r['cp']} | {r['impl']} | {r['layout']} | {'yes' if r['overlap'] else 'no'} | {r['time_s']:.2f} | "
              f"{r['ring_wait_s']:.3f} | {r['peak_mib']:.0f} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
