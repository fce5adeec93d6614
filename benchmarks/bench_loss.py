"""Vocabulary-head loss, forward + backward: chunked cross-entropy vs the plain one.

plain:   logits = hidden @ W.T (all tokens x vocab), F.cross_entropy on fp32 logits
chunked: longctx.model.loss.chunked_cross_entropy (logits never exist in full)
Each in a fresh subprocess; peak = the process's RSS high-water mark (VmHWM) growth over the
RSS before the loss, with glibc serving every block of 64 KiB or more by mmap
(MALLOC_MMAP_THRESHOLD_), so that freed tensors leave RSS at once and the peak is live memory.

    python benchmarks/bench_loss.py --tokens 32768 --vocab 32000 --hidden 512
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(impl: str, tokens: int, vocab: int, hidden: int, dtype: str, chunk: int) -> dict:
    import torch
    import torch.nn.functional as F

    from longctx.model.loss import chunked_cross_entropy
    from longctx.train.metrics import peak_rss_bytes

    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g).to(dt).requires_grad_()
    W = (0.02 * torch.randn(vocab, hidden, generator=g)).to(dt).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g)
    base = _rss()
    start = time.perf_counter()
    if impl == "plain":
        loss = F.cross_entropy((h @ W.t()).float(), y)
    else:
        s, n = chunked_cross_entropy(h, W, y, chunk_size=chunk)
        loss = s / n
    loss.backward()
    elapsed = time.perf_counter() - start
    peak = peak_rss_bytes()
    return {"impl": impl, "tokens": tokens, "vocab": vocab, "dtype": dtype, "loss": float(loss.detach()),
            "seconds": elapsed, "peak_growth_gb": (peak - base) / 2**30}


def measure(impl: str, tokens: int, vocab: int, hidden: int, dtype: str = "float32", chunk: int = 1024) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--tokens", str(tokens), "--vocab", str(vocab),
           "--hidden", str(hidden), "--dtype", dtype, "--chunk", str(chunk)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16)}
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--worker", default=None)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.tokens, a.vocab, a.hidden, a.dtype, a.chunk)))
        return
    plain = measure("plain", a.tokens, a.vocab, a.hidden, a.dtype, a.chunk)
    chunked = measure("chunked", a.tokens, a.vocab, a.hidden, a.dtype, a.chunk)
    print(json.dumps(plain))
    print(json.dumps(chunked))
    print(f"peak memory ratio chunked/plain: {chunked['peak_growth_gb'] / plain['peak_growth_gb']:.3f}; "
          f"time ratio: {chunked['seconds'] / plain['seconds']:.2f}; "
          f"loss diff {abs(chunked['loss'] - plain['loss']):.2e}")


if __name__ == "__main__":
    main()
