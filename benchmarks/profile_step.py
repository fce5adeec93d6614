"""torch.profiler on one longctx training step (the step bench_peers.py times): the ops by self
CPU time on rank 0, and every copy in the step (layout copies, dtype casts, gathers) by the
op and input shapes that caused it.

    .venv/bin/python benchmarks/profile_step.py --impl ring --seq-len 8192 --world 2

The step is bf16 (or `--dtype float32`, for CPUs without fast bf16), full activation
checkpointing, the bench-44m shape (or `--preset`, `--init-from`), after one warm-up step. A
profile, not a timing: one step, under the profiler.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from benchlib.model import add_model_args, base_config, check_model_args, write_checkpoint
from benchlib.peer_contenders import build_contender, make_batch
from benchlib.procs import init_rank, spawn_group

COPY_OPS = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::cat", "aten::stack",
            "aten::index_select", "aten::index", "aten::repeat_interleave", "aten::fill_", "aten::zero_")


def _worker(rank, world, port, args, ckpt):
    init_rank(rank, world, port, max(1, (os.cpu_count() or 2) // world), deepspeed=True)
    c = build_contender(args.impl, ckpt, getattr(torch, args.dtype), world, loss_chunk=args.loss_chunk)
    inputs = c.prepare(make_batch(args.vocab, args.seq_len))

    def step():
        c.forward_backward(inputs)
        c.optimizer_step()

    step()  # warm-up: gradients and optimizer state exist afterwards
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    if rank == 0:
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        print(f"\n# {args.impl} T={args.seq_len} world={world}: profiled self CPU total {total / 1e6:.2f} s\n")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
        copies = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in COPY_OPS]
        copy_total = sum(e.self_cpu_time_total for e in copies)
        print(f"\n# copies: {copy_total / 1e6:.3f} s = {copy_total / total:.1%} of self CPU time\n")
        for e in sorted(copies, key=lambda e: -e.self_cpu_time_total)[:args.rows]:
            print(f"{e.self_cpu_time_total / 1e3:10.1f} ms  {e.count:5d}x  {e.key:24s} {str(e.input_shapes)[:110]}")
        print("\n# every op by input shapes\n")
        for e in sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total)[:args.rows]:
            print(f"{e.self_cpu_time_total / 1e3:10.1f} ms  {e.count:5d}x  {e.key[:40]:40s} "
                  f"{str(e.input_shapes)[:100]}")
    return []


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="ring",
                   help="ours (one process), ring, ulysses, allgather; alst, alst-tiled (the peer)")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--loss-chunk", type=int, default=2048)
    p.add_argument("--rows", type=int, default=30)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    add_model_args(p)
    args = p.parse_args(argv)
    check_model_args(args)
    args.vocab = base_config(args).vocab_size
    world = 1 if args.impl == "ours" else args.world
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "hf")
        write_checkpoint(args, ckpt, args.seq_len)
        _, err = spawn_group(_worker, world, args=(args, ckpt))
    if err:
        sys.exit(f"profile_step: {err}")


if __name__ == "__main__":
    main()
