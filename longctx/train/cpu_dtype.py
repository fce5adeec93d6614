"""Whether the run's 16-bit dtype is slow on this CPU. A CPU without bf16 instructions (AVX2
only: no AVX512-BF16, no AMX) multiplies bf16 matrices through a slow path, many times slower
than float32, so a bf16 run there is slower than the same run in float32. The trainer says so
in one line at start-up, measured rather than guessed from CPU flags."""
from __future__ import annotations

from typing import Optional

import torch

from longctx.train.metrics import measure_matmul_flops

SLOWER_THAN_FP32 = 2.0  # a dtype whose GEMMs run at less than 1/this of float32's is reported


def slow_dtype_note(dtype: torch.dtype, device: torch.device, n: int = 512, seconds: float = 0.1) -> Optional[str]:
    """A line naming train.dtype, both GEMM rates and float32 as the faster choice, when `dtype`'s
    matrix products on this CPU run SLOWER_THAN_FP32 times slower than float32's; else None."""
    if device.type != "cpu" or dtype == torch.float32:
        return None
    fp32 = measure_matmul_flops(torch.float32, n=n, seconds=seconds)
    half = measure_matmul_flops(dtype, n=n, seconds=seconds)
    if fp32 < SLOWER_THAN_FP32 * half:
        return None
    name = str(dtype).removeprefix("torch.")
    return (f"train.dtype {name}: this CPU ({torch.backends.cpu.get_cpu_capability()}) multiplies {name} matrices "
            f"at {half / 1e9:.1f} GFLOP/s against {fp32 / 1e9:.1f} in float32 ({fp32 / half:.0f}x slower); "
            "train.dtype=float32 runs faster here")
