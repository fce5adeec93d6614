"""Whether a 16-bit dtype is slow on this CPU. A CPU without bf16 instructions (AVX2 only: no
AVX512-BF16, no AMX) multiplies bf16 matrices through a slow path, many times slower than
float32, so a bf16 run there is slower than the same run in float32. Measured, not guessed from
CPU flags, once per environment (train/mfu.py caches the GEMM rates; `longctx setup` measures
them): the trainer says so in one line at start-up, and the demo's `dtype: auto` picks float32
there."""
from __future__ import annotations

from typing import Optional

import torch

from longctx.train.mfu import cpu_gemm_rate

SLOWER_THAN_FP32 = 2.0  # a dtype whose GEMMs run at less than 1/this of float32's counts as slow


def gemm_rates(dtype: torch.dtype) -> tuple[float, float]:
    """(float32's, `dtype`'s) best GEMM FLOP/s on this CPU (cached per environment)."""
    return cpu_gemm_rate(torch.float32), cpu_gemm_rate(dtype)


def _slowdown(dtype: torch.dtype) -> tuple[Optional[str], float, float]:
    """(a description of the slowdown or None, float32 FLOP/s, dtype FLOP/s)."""
    fp32, half = gemm_rates(dtype)
    if fp32 < SLOWER_THAN_FP32 * half:
        return None, fp32, half
    name = str(dtype).removeprefix("torch.")
    return (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) multiplies {name} matrices at "
            f"{half / 1e9:.1f} GFLOP/s against {fp32 / 1e9:.1f} in float32 ({fp32 / half:.0f}x slower)"), fp32, half


def slow_dtype_note(dtype: torch.dtype, device: torch.device) -> Optional[str]:
    """A line naming train.dtype, both GEMM rates and float32 as the faster choice, when `dtype`'s
    matrix products on this CPU run SLOWER_THAN_FP32 times slower than float32's; else None."""
    if device.type != "cpu" or dtype == torch.float32:
        return None
    why, _, _ = _slowdown(dtype)
    if why is None:
        return None
    return f"train.dtype {str(dtype).removeprefix('torch.')}: {why}; train.dtype=float32 runs faster here"


def auto_dtype() -> tuple[str, str]:
    """("bfloat16" or "float32", why): bfloat16 on a GPU or on a CPU whose bf16 GEMMs keep up with
    float32's, float32 on a CPU where they run SLOWER_THAN_FP32 times slower."""
    if torch.cuda.is_available():
        return "bfloat16", "a GPU"
    why, fp32, half = _slowdown(torch.bfloat16)
    if why is None:
        return "bfloat16", f"this CPU multiplies bfloat16 matrices at {fp32 / half:.1f}x float32's time or less"
    return "float32", why
