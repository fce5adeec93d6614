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


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process image's peak RSS. Linux: VmHWM, not ru_maxrss, which also keeps the image
    before exec, i.e. the forked parent's RSS (a small worker of a 2.4 GB parent read 2.56 GB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return int(kb * (1 if sys.platform == "darwin" else 1024))


def strict_json_record(record: dict) -> dict:
    """Non-finite floats -> null, their keys listed under "nonfinite" (strict JSON readers
    reject the bare NaN / Infinity tokens Python's json writes by default)."""
    bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return record
    out = {k: (None if k in bad else v) for k, v in record.items()}
    out["nonfinite"] = bad
    return out


class MetricsWriter:
    """metrics.jsonl + TensorBoard on rank 0; no-op elsewhere."""

    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self._file = open(out_dir / "metrics.jsonl", "a") if enabled else None
        self._tb = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(out_dir / "tb"))

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
