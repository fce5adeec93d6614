"""Vocabulary-head loss, forward + backward: chunked cross-entropy vs the plain one.

plain:   logits = hidden @ W.T (all tokens x vocab), F.cross_entropy on fp32 logits
chunked: longctx.model.loss.chunked_cross_entropy (logits never exist in full)
Each in a subprocess of its own, stepped interleaved by the parent (benchlib.timing: `--warmup`
untimed steps, then `--repeats` timed rounds; median and min seconds). Peak = the process's RSS
high-water mark (VmHWM) growth over the RSS before the first loss, with glibc serving every block
of 64 KiB or more by mmap (MALLOC_MMAP_THRESHOLD_), so that freed tensors leave RSS at once and
the peak is live memory.

    python benchmarks/bench_loss.py --tokens 32768 --vocab 32000 --hidden 512
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from benchlib.memory import mmap_env, peak_rss_bytes, rss_bytes
from benchlib.report import timing_fields
from benchlib.timing import DEFAULT_STEPS, DEFAULT_WARMUP, interleaved
from benchlib.worker import StepProcess, serve_steps


class LossStep:
    """One implementation's forward + backward on fixed inputs (seed 0)."""

    def __init__(self, impl: str, tokens: int, vocab: int, hidden: int, dtype: str, chunk: int):
        import torch

        dt = getattr(torch, dtype)
        g = torch.Generator().manual_seed(0)
        self.h = torch.randn(tokens, hidden, generator=g).to(dt).requires_grad_()
        self.W = (0.02 * torch.randn(vocab, hidden, generator=g)).to(dt).requires_grad_()
        self.y = torch.randint(0, vocab, (tokens,), generator=g)
        self.impl, self.chunk, self.loss = impl, chunk, None
        self.info = {"impl": impl, "tokens": tokens, "vocab": vocab, "dtype": dtype}
        self.base = rss_bytes()

    def step(self) -> dict:
        import torch.nn.functional as F

        from longctx.model.loss import chunked_cross_entropy

        self.h.grad = self.W.grad = None
        if self.impl == "plain":
            loss = F.cross_entropy((self.h @ self.W.t()).float(), self.y)
        else:
            s, n = chunked_cross_entropy(self.h, self.W, self.y, chunk_size=self.chunk)
            loss = s / n
        loss.backward()
        self.loss = float(loss.detach())
        return {"loss": self.loss}

    def summary(self) -> dict:
        return {**self.info, "loss": self.loss, "peak_growth_gb": (peak_rss_bytes() - self.base) / 2**30}


def _worker_cmd(impl: str, tokens: int, vocab: int, hidden: int, dtype: str, chunk: int) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", impl, "--tokens", str(tokens), "--vocab",
            str(vocab), "--hidden", str(hidden), "--dtype", dtype, "--chunk", str(chunk)]


def measure_all(tokens: int, vocab: int, hidden: int, dtype: str = "float32", chunk: int = 1024,
                impls: tuple[str, ...] = ("plain", "chunked"), steps: int = DEFAULT_STEPS,
                warmup: int = DEFAULT_WARMUP) -> dict[str, dict]:
    """{impl: row}; each row: loss, peak_growth_gb, seconds (the median) and the timing fields."""
    procs = {impl: StepProcess(_worker_cmd(impl, tokens, vocab, hidden, dtype, chunk), env=mmap_env())
             for impl in impls}
    try:
        timings = interleaved({impl: p.step for impl, p in procs.items()}, steps=steps, warmup=warmup)
        return {impl: {**p.finish(), "seconds": timings[impl].median_s, **timing_fields(timings[impl])}
                for impl, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()


def measure(impl: str, tokens: int, vocab: int, hidden: int, dtype: str = "float32", chunk: int = 1024,
            steps: int = 1, warmup: int = 0) -> dict:
    """One implementation alone (its peak memory; one cold step unless asked for more)."""
    return measure_all(tokens, vocab, hidden, dtype, chunk, (impl,), steps, warmup)[impl]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=DEFAULT_STEPS, help="timed steps per implementation")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps per implementation first")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a child's implementation
    a = ap.parse_args()
    if a.worker:
        contender = LossStep(a.worker, a.tokens, a.vocab, a.hidden, a.dtype, a.chunk)
        serve_steps(contender.step, contender.summary)
        return
    rows = measure_all(a.tokens, a.vocab, a.hidden, a.dtype, a.chunk, steps=a.repeats, warmup=a.warmup)
    plain, chunked = rows["plain"], rows["chunked"]
    print(json.dumps(plain))
    print(json.dumps(chunked))
    print(f"peak memory ratio chunked/plain: {chunked['peak_growth_gb'] / plain['peak_growth_gb']:.3f}; "
          f"time ratio (median): {chunked['seconds'] / plain['seconds']:.2f}; "
          f"loss diff {abs(chunked['loss'] - plain['loss']):.2e}; "
          f"{plain['warmup']} warm-up + {plain['steps']} timed steps each, interleaved")


if __name__ == "__main__":
    main()
