"""Model FLOPs and the peak they are measured against: MFU = achieved / peak, per device.

Model FLOPs per token (PaLM's convention, recomputation not counted):

    6 * N_matmul  +  6 * L * H * D * T        (causal: half of the 12 * L * H * D * T of full attention)

N_matmul = parameters in matmuls (all but the embedding table; the LM head counts, tied or
not), L layers, H query heads of size D, T the training sequence length. Document masking
is not discounted: the attention term is an upper bound for packed short documents.

The peak: `log.peak_tflops` when set; a GPU's datasheet dense bf16 figure by name (half of it
for fp32); on a CPU, the best GEMM rate of this environment at the run's dtype and thread count,
measured once (by `longctx setup`, or the first run that needs it) and cached in the
environment's prefix, so no run measures its machine again.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from longctx.model.config import ModelConfig
from longctx.storage import atomic

GPU_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}
CPU_RATES_FILE = "longctx-cpu-gemm.json"  # in sys.prefix: one file per Python environment


def matmul_params(cfg: ModelConfig) -> int:
    """Weights each token multiplies by: for a mixture of experts (the transformers path's
    AutoModelSpec) the router and the experts a token is routed to, not every expert."""
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    qo = 2 * d * cfg.num_attention_heads * cfg.head_dim
    kv = 2 * d * cfg.num_key_value_heads * cfg.head_dim
    mlp = 3 * d * f
    experts = getattr(cfg, "num_experts", 0)
    if experts:
        mlp = d * experts + cfg.experts_per_token * 3 * d * cfg.moe_intermediate_size
    return L * (qo + kv + mlp) + cfg.vocab_size * d


def flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = True) -> float:
    attn = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq_len
    return 6 * matmul_params(cfg) + (attn / 2 if causal else attn)


def peak_flops_per_device(configured_tflops: Optional[float], dtype: torch.dtype,
                          rates_file: Optional[Path] = None) -> tuple[float, str]:
    """(peak FLOP/s, where the number came from: config, table:<GPU>, cpu-gemm)."""
    if configured_tflops:
        return configured_tflops * 1e12, "config"
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, tflops in GPU_PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12 * (1.0 if dtype != torch.float32 else 0.5), f"table:{key}"
    return cpu_gemm_rate(dtype, rates_file=rates_file), "cpu-gemm"


def measure_matmul_flops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.3) -> float:
    """Best observed n x n GEMM throughput on this device."""
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


def _machine_key() -> str:
    """What a cached rate belongs to: the processor, torch and the thread count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def default_rates_file() -> Path:
    return Path(sys.prefix) / CPU_RATES_FILE


def cpu_gemm_rate(dtype: torch.dtype, rates_file: Optional[Path] = None) -> float:
    """This environment's best CPU GEMM FLOP/s at `dtype` and the current thread count: read from
    the cache, else measured once and cached (an unwritable cache only costs the next run a
    measurement)."""
    path = rates_file or default_rates_file()
    key, name = _machine_key(), str(dtype).removeprefix("torch.")
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    rate = cached.get(key, {}).get(name)
    if isinstance(rate, (int, float)) and rate > 0:
        return float(rate)
    rate = measure_matmul_flops(dtype)
    cached.setdefault(key, {})[name] = rate
    try:
        atomic.write_text(path, json.dumps(cached, indent=1, sort_keys=True))
    except OSError:
        pass
    return rate


def measure_environment(dtypes=(torch.float32, torch.bfloat16), thread_counts=None,
                        rates_file: Optional[Path] = None) -> dict[str, float]:
    """Cache the GEMM rates runs read (`longctx setup`): each dtype at each thread count (default:
    all cores, and one thread per rank of a 2-rank run on them). Returns {"dtype @ threads": FLOP/s}."""
    if thread_counts is None:
        cores = os.cpu_count() or 1
        thread_counts = sorted({cores, max(1, cores // 2)})
    before = torch.get_num_threads()
    out = {}
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for dtype in dtypes:
                out[f"{str(dtype).removeprefix('torch.')} @ {threads}"] = cpu_gemm_rate(dtype, rates_file)
    finally:
        torch.set_num_threads(before)
    return out
