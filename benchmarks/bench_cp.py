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
their .grad buffers are allocated before the step). Time: `--warmup` untimed steps, then `--iters`
timed rounds of all variants interleaved (benchlib.timing); a step's time is its slowest rank's,
reported as median and min. Ring wait: seconds a step spent blocked on ring transfers (communication not
hidden behind compute), max over ranks. Ratios are against cp = 1 in the same run (no
absolute numbers are asserted).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from benchlib.memory import peak_rss_bytes, reset_peak, rss_bytes
from benchlib.procs import init_rank, spawn_group
from benchlib.report import markdown_table, timing_fields, write_json
from benchlib.timing import DEFAULT_STEPS, DEFAULT_WARMUP, interleaved, slowest_rank

from longctx.model import ModelConfig, build_model
from longctx.parallel import make_cp_attention, shard_batch, validate_layout
from longctx.parallel.comm import COMM_STATS, reset_comm_stats
from longctx.parallel.heads import HeadShards
from longctx.parallel.layout import resolve_layout

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


def _worker(rank, world, port, args, variants, threads):
    """Runs every variant (impl, ulysses, overlap) in this one process group, interleaved."""
    init_rank(rank, world, port, threads)
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

    base, waits, peaks = {}, {i: [] for i in range(len(attns))}, {i: [] for i in range(len(attns))}

    def before(i):  # outside the clock: all ranks start together, peak and ring counters reset
        dist.barrier()
        base[i] = rss_bytes()
        reset_peak()
        reset_comm_stats()

    def after(i):
        waits[i].append(COMM_STATS["wait_s"])
        peaks[i].append((peak_rss_bytes() - base[i]) / 2**20)

    # the warm-up also allocates the .grad buffers
    timings = interleaved({i: (lambda a=a: step(a)) for i, a in enumerate(attns)}, steps=args.iters,
                          warmup=args.warmup, before=before, after=after)
    return [{"times": timings[i].times, "waits": waits[i], "peak_mib": max(peaks[i])} for i in range(len(attns))]


def run_group(args, cp, variants):
    """One spawned gloo group of `cp` processes measuring all `variants`; one row per variant."""
    threads = max(1, (args.threads or os.cpu_count()) // cp)
    ranks, err = spawn_group(_worker, cp, args=(args, variants, threads))
    if ranks is None:
        sys.exit(f"cp={cp}: {err}")
    rows = []
    for i, (impl, u, overlap) in enumerate(variants):
        times = slowest_rank([r[i]["times"] for r in ranks])
        lay = resolve_layout(validate_layout(cp, impl, u), args.heads, args.kv_heads) if cp > 1 else None
        uneven = lay is not None and lay.ulysses_size > 1 and not HeadShards(args.heads, args.kv_heads,
                                                                              lay.ulysses_size).even
        rows.append({"cp": cp, "impl": impl if cp > 1 else "none", "overlap": overlap,
                     "layout": (f"{lay.ulysses_size} x {lay.ring_size}" + (" (uneven heads)" if uneven else "")
                                if lay else "-"),
                     **timing_fields(times, args.warmup), "time_s": statistics.median(times),
                     "ring_wait_s": statistics.median(slowest_rank([r[i]["waits"] for r in ranks])),
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
    p.add_argument("--iters", type=int, default=DEFAULT_STEPS, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps per variant first")
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
    table = []
    for r in rows:
        ratio = f"{r['peak_mib'] / base['peak_mib']:.2f}x" if base else "-"
        table.append([r["cp"], r["impl"], r["layout"], "yes" if r["overlap"] else "no", f"{r['time_s']:.2f}",
                      f"{r['min_s']:.2f}", f"{r['ring_wait_s']:.3f}", f"{r['peak_mib']:.0f}", ratio])
    print(markdown_table(["cp", "impl", "ulysses x ring", "overlap", "step time median (s)", "min (s)",
                          "ring wait (s)", "peak mem / rank (MiB)", "mem vs cp=1"], table, "rlllrrrrr"))
    print(f"\n{rows[0]['warmup']} warm-up + {rows[0]['steps']} timed steps per variant, interleaved")
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
