"""What is alive at the peak of one training step: live tensor bytes, grouped by the op that made
each tensor, for a bench_peers contender (world 2 for the multi-rank ones), rank 0.

    .venv/bin/python benchmarks/peak_tensors.py --impl ulysses --seq-len 32768 --recompute-attention \
        --mlp-tile-tokens 2048 --loss-chunk 1024

A dispatch mode sees every op of the second step (the first warms up): a storage made by a
non-view, non-mutating op is live while any tensor on it is. Storages made before the step
(weights, optimizer state, DeepSpeed's flat buffers) and DeepSpeed's mostly-untouched reduce
bucket are not counted, so the peak is the step's activations and transients, not RSS.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import weakref

import torch
from benchlib.model import add_model_args, base_config, check_model_args, write_checkpoint
from benchlib.peer_contenders import (
    ALL_IMPLS,
    SINGLE,
    add_contender_args,
    build_contender,
    contender_options,
    make_batch,
)
from benchlib.procs import init_rank, spawn_group
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MiB = 2**20
UNTOUCHED = 900 * MiB  # allocations this large are DeepSpeed's reduce bucket, mostly never written


class LiveTensors(TorchDispatchMode):
    """Live bytes of the storages created inside the mode, and what was live at their peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list] = {}  # storage pointer -> [bytes, tensors seen on it, label]
        self.now = self.peak = 0
        self.at_peak: list[tuple[int, str]] = []
        self.peak_op = ""

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                del self.live[ptr]
                self.now -= entry[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        makes_storage = not func.is_view and not func._schema.is_mutable
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.is_meta:
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if ptr == 0 or nbytes > UNTOUCHED:
                continue
            if ptr not in self.live:
                if not makes_storage:
                    continue
                label = f"{func.__name__} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
                self.live[ptr] = [nbytes, 0, label]
                self.now += nbytes
            self.live[ptr][1] += 1
            weakref.finalize(t, self._release, ptr)
        if self.now > self.peak:
            self.peak, self.peak_op = self.now, func.__name__
            self.at_peak = [(e[0], e[2]) for e in self.live.values()]
        return out


def _worker(rank, world, port, args, ckpt):
    init_rank(rank, world, port, max(1, (os.cpu_count() or 1) // world), deepspeed=True)
    c = build_contender(args.impl, ckpt, torch.bfloat16, world, **contender_options(args))
    inputs = c.prepare(make_batch(args.vocab, args.seq_len))
    c.forward_backward(inputs)
    c.optimizer_step()
    mode = LiveTensors()
    with mode:
        c.forward_backward(inputs)
    if rank == 0:
        tokens = args.seq_len // world
        print(f"{args.impl} T={args.seq_len}: peak of live step tensors {mode.peak / MiB:.1f} MiB "
              f"({mode.peak / tokens / 1024:.2f} KiB per token of the rank's {tokens}), at op {mode.peak_op}")
        groups = collections.Counter()
        for nbytes, label in mode.at_peak:
            groups[label] += nbytes
        for label, nbytes in groups.most_common(args.top):
            print(f"  {nbytes / MiB:9.1f} MiB  {nbytes / tokens / 1024:6.2f} KiB/token  {label}")
    return []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="ulysses", choices=ALL_IMPLS)
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--world", type=int, default=2, help="processes of a multi-rank contender")
    p.add_argument("--top", type=int, default=25, help="groups listed")
    add_model_args(p)
    add_contender_args(p)
    args = p.parse_args()
    check_model_args(args)
    args.vocab = base_config(args).vocab_size
    world = 1 if args.impl in SINGLE else args.world
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "hf")
        write_checkpoint(args, ckpt, args.seq_len)
        _, err = spawn_group(_worker, world, args=(args, ckpt))
    if err:
        sys.exit(f"peak_tensors: {err}")


if __name__ == "__main__":
    main()
