"""Step metrics to metrics.jsonl and TensorBoard (rank 0), with a documented MFU.

MFU = achieved model FLOP/s per device / peak FLOP/s per device, where the model FLOPs per
token are (PaLM's convention, recomputation not counted):

    6 * N_matmul  +  6 * L * H * D * T        (causal: half of the 12 * L * H * D * T of full attention)

N_matmul = parameters in matmuls (all but the embedding table; the LM head counts, tied or
not), L layers, H query heads of size D, T the training sequence length. Document masking
is not discounted: the attention term is an upper bound for packed short documents.
"""
from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from longctx import atomic
from longctx.model.config import ModelConfig

GPU_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}


def matmul_params(cfg: ModelConfig) -> int:
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    qo = 2 * d * cfg.num_attention_heads * cfg.head_dim
    kv = 2 * d * cfg.num_key_value_heads * cfg.head_dim
    return L * (qo + kv + 3 * d * f) + cfg.vocab_size * d


def flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = True) -> float:
    attn = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq_len
    return 6 * matmul_params(cfg) + (attn / 2 if causal else attn)


def peak_flops_per_device(configured_tflops: Optional[float], dtype: torch.dtype) -> tuple[float, str]:
    """(peak FLOP/s, where the number came from)."""
    if configured_tflops:
        return configured_tflops * 1e12, "config"
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, tflops in GPU_PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12 * (1.0 if dtype != torch.float32 else 0.5), f"table:{key}"
    return measure_matmul_flops(dtype), "measured"


def measure_matmul_flops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.3) -> float:
    """Best observed GEMM throughput on this device (used as the CPU's 'peak')."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


# --------------------------------------------------------------------- CPU machine limits
# On a CPU there is no datasheet peak: the limit is what this machine's bf16 GEMM and its fused
# flash-attention kernel achieve at the step's own shapes, measured in the same process (and at
# the same time as the other ranks, which share the cores). "CPU MFU" is the step's time at
# those rates (its GEMM FLOPs at the GEMM rate plus its attention FLOPs at the kernel's rate,
# PaLM's model-FLOP convention as above, recomputation not counted) over its measured time.

def _best_rate(run, flops: float, seconds: float, min_reps: int = 2) -> float:
    run()  # warm-up (packing, thread pool)
    best, reps, deadline = 0.0, 0, time.perf_counter() + seconds
    while reps < min_reps or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        best = max(best, flops / (time.perf_counter() - start))
        reps += 1
    return best


def measure_gemm_flops(tokens: int, d_in: int, d_out: int, dtype: torch.dtype = torch.bfloat16,
                       seconds: float = 0.5) -> float:
    """FLOP/s of a linear layer's three GEMMs at (tokens x d_in) -> d_out: forward, input
    gradient and weight gradient (the last reduces over the tokens), best of repeats."""
    x = torch.randn(tokens, d_in, dtype=dtype)  # (N, d_in)
    w = torch.randn(d_out, d_in, dtype=dtype)  # (d_out, d_in)
    dy = torch.randn(tokens, d_out, dtype=dtype)  # (N, d_out)

    def run():
        x @ w.t()
        dy @ w
        dy.t() @ x

    return _best_rate(run, 3 * 2.0 * tokens * d_in * d_out, seconds)


def measure_attention_flops(seq_len: int, head_dim: int, heads: int = 1, dtype: torch.dtype = torch.bfloat16,
                            seconds: float = 0.5) -> float:
    """Model FLOP/s (causal forward counted 2*T^2*D per head, backward twice that) of the CPU
    flash kernel's forward + backward at (1, heads, seq_len, head_dim)."""
    aten = torch.ops.aten
    q, k, v, dout = (torch.randn(1, heads, seq_len, head_dim, dtype=dtype) for _ in range(4))  # (B, H, T, D)

    def run():
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[:2]
        aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, True)

    return _best_rate(run, 6.0 * heads * head_dim * seq_len**2, seconds, min_reps=1)


def step_flops(cfg: ModelConfig, seq_len: int, cp_size: int = 1) -> tuple[float, float]:
    """(GEMM, attention) model FLOPs of one rank's share of a training step on one sequence of
    seq_len tokens split over cp_size ranks (context parallelism balances both evenly)."""
    gemm = 6.0 * matmul_params(cfg) * seq_len
    attn = 6.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq_len**2  # causal
    return gemm / cp_size, attn / cp_size


def measure_cpu_limits(cfg: ModelConfig, seq_len: int, cp_size: int = 1, dtype: torch.dtype = torch.bfloat16,
                       seconds: float = 0.5, max_attention_len: int = 8192) -> dict:
    """This rank's GEMM and flash-attention FLOP/s at the step's shapes (call it on every rank
    at once so the ranks share the cores as in the step). The GEMM is the MLP's up projection
    over the rank's tokens; the kernel runs as many heads as there are threads (it spreads
    its backward over batch x heads: one head would leave all threads but one idle) over the
    whole sequence, capped at max_attention_len to bound the measuring time (its rate is flat
    in T beyond a few k)."""
    tokens = max(1, seq_len // cp_size)
    threads = torch.get_num_threads()
    heads = min(cfg.num_attention_heads, threads)
    return {"gemm_flops_per_s": measure_gemm_flops(min(tokens, 8192), cfg.hidden_size, cfg.intermediate_size,
                                                   dtype, seconds),
            "attention_flops_per_s": measure_attention_flops(min(seq_len, max_attention_len), cfg.head_dim, heads,
                                                             dtype, seconds),
            "threads": threads}


def cpu_limit_fraction(cfg: ModelConfig, seq_len: int, cp_size: int, step_s: float, limits: dict,
                       sequences: int = 1) -> dict:
    """The step's achieved fraction of the measured limit ("cpu_mfu") and the time each part
    would take at its limit rate; `sequences`: sequences of seq_len this rank's cp group
    trains per step (micro-batch size x gradient accumulation)."""
    gemm, attn = step_flops(cfg, seq_len, cp_size)
    gemm_s = sequences * gemm / limits["gemm_flops_per_s"]
    attn_s = sequences * attn / limits["attention_flops_per_s"]
    return {"cpu_mfu": (gemm_s + attn_s) / step_s, "gemm_limit_s": gemm_s, "attention_limit_s": attn_s}


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process image's peak RSS. Linux: VmHWM, not ru_maxrss, which also keeps the image
    before exec, i.e. the forked parent's RSS (a small worker of a large parent reads as large)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return int(kb * (1 if sys.platform == "darwin" else 1024))


def progress_fields(record: dict, stage: Optional[int] = None) -> dict[str, str]:
    """A step's record as the progress display's fields: loss, lr, global tokens/s, peak
    memory (CUDA max allocated; CPU: peak RSS) and, in a staged run, the stage."""
    fields = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}",
              "tok/s": f"{record['tokens_per_s']:,.0f}", "mem": f"{record['peak_memory_gb']:.2f} GiB"}
    if stage is not None:
        fields["stage"] = str(stage)
    return fields


def strict_json_record(record: dict) -> dict:
    """Non-finite floats -> null, their keys listed under "nonfinite" (strict JSON readers
    reject the bare NaN / Infinity tokens Python's json writes by default)."""
    bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return record
    out = {k: (None if k in bad else v) for k, v in record.items()}
    out["nonfinite"] = bad
    return out


ABANDONED_METRICS = "metrics.abandoned.jsonl"


def _step_of(line: str) -> Optional[int]:
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None  # a torn last line of a killed run: not a step that counts
    return step if isinstance(step, int) else None


def trim_metrics(out_dir: Path, start_step: int) -> int:
    """Keep the records of metrics.jsonl up to `start_step` (atomic rewrite); the others are
    appended to metrics.abandoned.jsonl. Returns how many records moved."""
    path = out_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    kept, dropped = [], []
    for line in lines:
        step = _step_of(line)
        (kept if step is not None and step <= start_step else dropped).append(line)
    dropped = [line for line in dropped if line.strip()]
    if not dropped and len(kept) == len(lines):
        return 0
    if dropped:
        with open(out_dir / ABANDONED_METRICS, "a") as f:
            f.write("".join(line + "\n" for line in dropped))
    atomic.write_text(path, "".join(line + "\n" for line in kept))
    return len(dropped)


class MetricsWriter:
    """metrics.jsonl + TensorBoard on rank 0; no-op elsewhere.

    A run that starts at `start_step` (a resume, perhaps from an older checkpoint than the last
    step logged) first drops the records after that step from metrics.jsonl, so the file ends
    with the steps that count; the dropped ones move to metrics.abandoned.jsonl, and TensorBoard
    is told to purge them (its `purge_step`)."""

    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool, *, start_step: int = 0,
                 notify=None):
        self.enabled = enabled
        self._file = self._tb = None
        if not enabled:
            return
        dropped = trim_metrics(out_dir, start_step)
        if dropped and notify is not None:
            notify(f"metrics: {dropped} records after step {start_step} (a run abandoned at resume) moved from "
                   f"metrics.jsonl to {ABANDONED_METRICS}")
        self._file = open(out_dir / "metrics.jsonl", "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # lazy: optional (log.tensorboard), heavy

            self._tb = SummaryWriter(str(out_dir / "tb"), purge_step=start_step + 1 if dropped else None)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(strict_json_record(record), allow_nan=False) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(f"train/{key}", value, record["step"])

    def close(self) -> None:
        if self._file:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
