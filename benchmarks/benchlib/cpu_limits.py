"""A CPU's limit for a training step, for the peer benchmarks (bench_peers.py): the best time of
each of the step's own operations when it runs alone.

On a CPU there is no datasheet peak. The limit of a step is the time its own operations take
when each runs alone at its best: every distinct GEMM of the layers (a linear layer's forward
and backward through autograd at the rank's (B, T / cp, d_in) -> d_out), the vocabulary head's
chunked cross-entropy at its chunk shape, and the attention kernel's forward + backward at the
step's (1, Hq, Hkv, T, D) (the CPU kernel runs one call per row). Each is timed at exactly the
shape the step calls, in the same process and at the same time as the other ranks (which share
the cores). "CPU MFU" = that limit time / the step's time: a fraction of the work the step
itself does (recomputation, norms, RoPE and the optimizer are extra), so it is <= 1 up to the
machine being faster during the step than while measuring.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from longctx.attention import sdpa_attention
from longctx.model.config import ModelConfig
from longctx.model.loss import chunked_cross_entropy
from longctx.train.mfu import matmul_params


def step_flops(cfg: ModelConfig, seq_len: int, cp_size: int = 1) -> tuple[float, float]:
    """(GEMM, attention) model FLOPs of one rank's share of a training step on one sequence of
    seq_len tokens split over cp_size ranks (context parallelism balances both evenly)."""
    gemm = 6.0 * matmul_params(cfg) * seq_len
    attn = 6.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq_len**2  # causal
    return gemm / cp_size, attn / cp_size


@dataclass(frozen=True)
class LimitOp:
    """One operation of a micro-batch's forward + backward on this rank: `kind` linear (shape
    tokens, d_in, d_out), head (tokens, d, vocab, chunk) or attention (q heads, kv heads, T,
    D); `count` calls per micro-batch; `flops` model FLOPs of one call."""
    kind: str
    shape: tuple
    count: int
    flops: float


def limit_ops(cfg: ModelConfig, seq_len: int, cp_size: int = 1, micro_batch_size: int = 1,
              loss_chunk_size: int = 1024) -> list[LimitOp]:
    """The operations whose best times make a micro-batch's limit, with their model FLOPs
    (PaLM's convention): together they are step_flops x micro_batch_size exactly. Attention
    under cp runs at the full length with this rank's share of the heads (Ulysses' local shape;
    ring's blocks are smaller calls, no faster)."""
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    hq, hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    tokens = micro_batch_size * seq_len // cp_size  # rows of each linear layer on this rank
    linears = [(d, hq * D), (d, hkv * D), (d, hkv * D), (hq * D, d), (d, f), (d, f), (f, d)]
    ops: dict[tuple, int] = {}
    for d_in, d_out in linears:
        key = ("linear", (micro_batch_size, seq_len // cp_size, d_in, d_out))
        ops[key] = ops.get(key, 0) + L
    chunk = min(loss_chunk_size, tokens)
    full, rest = divmod(tokens, chunk)
    ops[("head", (chunk, d, cfg.vocab_size, chunk))] = full
    if rest:
        ops[("head", (rest, d, cfg.vocab_size, chunk))] = 1
    group = hq // hkv
    kv_local = -(-hkv // cp_size)  # this rank's kv heads, rounded up (uneven shards)
    ops[("attention", (kv_local * group, kv_local, seq_len, D))] = L * micro_batch_size
    out = []
    for (kind, shape), count in ops.items():
        if kind == "linear":
            b, t, d_in, d_out = shape
            flops = 6.0 * b * t * d_in * d_out
        elif kind == "head":
            flops = 6.0 * shape[0] * shape[1] * shape[2]
        else:  # the rank's share of the causal attention's 6 * H * D * T^2 per layer and row
            flops = 6.0 * hq * D * seq_len**2 / cp_size
        out.append(LimitOp(kind, shape, count, flops))
    return out


def _best_time(run, seconds: float, min_reps: int, clock) -> float:
    """Best time of run() over repeats (at least min_reps, then until `seconds` have passed)."""
    best, reps, deadline = math.inf, 0, clock() + seconds
    while reps < min_reps or clock() < deadline:
        start = clock()
        run()
        best = min(best, clock() - start)
        reps += 1
    return best


def _linear_run(shape: tuple, dtype: torch.dtype):
    """A linear layer's forward and backward (input and weight gradients) through autograd."""
    b, t, d_in, d_out = shape
    x = torch.randn(b, t, d_in, dtype=dtype, requires_grad=True)  # (B, T, d_in)
    w = torch.randn(d_out, d_in, dtype=dtype, requires_grad=True)  # (d_out, d_in)
    dy = torch.randn(b, t, d_out, dtype=dtype)  # (B, T, d_out)

    def run():
        x.grad = w.grad = None
        F.linear(x, w).backward(dy)
    return run


HEAD_WEIGHT_STD = 0.02  # a language model's head (the usual initializer_range): logits of a few units


def head_inputs(shape: tuple, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A head call's (hidden, weight, labels) at a model's scale: unit-RMS hidden states (the
    final norm's output) and a head of std HEAD_WEIGHT_STD. Unit-variance weights would give
    logits of std sqrt(d): most of the softmax's exp arguments then lie below float32's range,
    which the CPU's vectorized exp computes on a slow path, and the limit would be no limit."""
    tokens, d, vocab, _ = shape
    h = torch.randn(tokens, d, dtype=dtype, requires_grad=True)  # (N, d)
    w = (torch.randn(vocab, d, dtype=dtype) * HEAD_WEIGHT_STD).requires_grad_()  # (V, d)
    y = torch.randint(0, vocab, (tokens,))  # (N,)
    return h, w, y


def _head_run(shape: tuple, dtype: torch.dtype):
    """The chunked cross-entropy's forward and backward over `tokens` rows (one chunk)."""
    chunk = shape[3]
    h, w, y = head_inputs(shape, dtype)

    def run():
        h.grad = w.grad = None
        chunked_cross_entropy(h, w, y, chunk_size=chunk)[0].backward()
    return run


def _attention_run(shape: tuple, dtype: torch.dtype):
    """The model's CPU attention (one row, causal) forward and backward through autograd."""
    hq, hkv, T, D = shape
    q = torch.randn(1, hq, T, D, dtype=dtype, requires_grad=True)  # (1, Hq, T, D)
    k, v = (torch.randn(1, hkv, T, D, dtype=dtype, requires_grad=True) for _ in range(2))  # (1, Hkv, T, D)
    dout = torch.randn(1, hq, T, D, dtype=dtype)

    def run():
        q.grad = k.grad = v.grad = None
        sdpa_attention(q, k, v, causal=True).backward(dout)
    return run


_RUNS = {"linear": _linear_run, "head": _head_run, "attention": _attention_run}


def measure_cpu_limits(cfg: ModelConfig, seq_len: int, cp_size: int = 1, dtype: torch.dtype = torch.bfloat16,
                       seconds: float = 0.5, micro_batch_size: int = 1, loss_chunk_size: int = 1024,
                       clock=time.perf_counter) -> dict:
    """This rank's best time of every operation of limit_ops (call it on every rank at once so
    the ranks share the cores as in the step). Each runs once to warm up (weight packing,
    thread pool; the attention at a short length), then repeats for about `seconds` (at least
    once). Returns {"ops": [...],
    "threads", and the GEMM / attention rates these times imply}."""
    threads = torch.get_num_threads()
    measured, flops, times = [], {"gemm": 0.0, "attention": 0.0}, {"gemm": 0.0, "attention": 0.0}
    with torch.enable_grad():
        for op in limit_ops(cfg, seq_len, cp_size, micro_batch_size, loss_chunk_size):
            run = _RUNS[op.kind](op.shape, dtype)
            if op.kind == "attention":  # a short call warms the kernel up: a long one costs seconds
                _RUNS["attention"](op.shape[:2] + (min(op.shape[2], 256),) + op.shape[3:], dtype)()
            else:
                run()
            best = _best_time(run, seconds, 1, clock)
            measured.append({"kind": op.kind, "shape": list(op.shape), "count": op.count, "flops": op.flops,
                             "seconds": best})
            part = "attention" if op.kind == "attention" else "gemm"
            flops[part] += op.count * op.flops
            times[part] += op.count * best
    return {"ops": measured, "threads": threads, "micro_batch_size": micro_batch_size,
            "gemm_flops_per_s": flops["gemm"] / times["gemm"] if times["gemm"] else 0.0,
            "attention_flops_per_s": flops["attention"] / times["attention"] if times["attention"] else 0.0}


def best_limits(old: Optional[dict], new: dict) -> dict:
    """Two measurements of the same operations merged: each operation's best time."""
    if old is None:
        return new
    ops = [dict(a, seconds=min(a["seconds"], b["seconds"])) for a, b in zip(old["ops"], new["ops"])]
    merged = dict(new, ops=ops)
    for part, rate in (("gemm", "gemm_flops_per_s"), ("attention", "attention_flops_per_s")):
        mine = [o for o in ops if (o["kind"] == "attention") == (part == "attention")]
        t = sum(o["count"] * o["seconds"] for o in mine)
        merged[rate] = sum(o["count"] * o["flops"] for o in mine) / t if t else 0.0
    return merged


def attention_pair_fraction(segment_ids: Optional[torch.Tensor], columns: int, seq_len: int) -> float:
    """Share of a full row's causal (query, key) pairs the CPU kernel computes for a micro-batch
    of rows cut to `columns` (trimmed tails) with these document ids (B, columns) or none: the
    sum over documents of n^2 over B * seq_len^2."""
    if segment_ids is None:
        return (columns / seq_len) ** 2
    total = 0
    for row in segment_ids:
        _, counts = torch.unique_consecutive(row, return_counts=True)
        total += int((counts.long() ** 2).sum())
    return total / (segment_ids.shape[0] * seq_len**2)


def cpu_limit_fraction(limits: dict, step_s: float, micro_batches: float = 1.0, computed: float = 1.0,
                       attention_fraction: Optional[float] = None) -> dict:
    """The step's fraction of its limit ("cpu_mfu") and the time each part takes at its best:
    `micro_batches` micro-batches (of the measured micro_batch_size) ran, `computed` the
    share of their columns (trimmed tails), `attention_fraction` the share of the full causal
    pairs the kernel computed (attention_pair_fraction; default computed^2). The attention
    kernel's rate grows with the call's length, so shorter calls take at least their share."""
    attn_share = computed**2 if attention_fraction is None else attention_fraction
    gemm_s = attn_s = 0.0
    for op in limits["ops"]:
        if op["kind"] == "attention":
            attn_s += micro_batches * attn_share * op["count"] * op["seconds"]
        else:
            gemm_s += micro_batches * computed * op["count"] * op["seconds"]
    return {"cpu_mfu": (gemm_s + attn_s) / step_s, "gemm_limit_s": gemm_s, "attention_limit_s": attn_s}
