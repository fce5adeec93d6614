"""What a benchmark's numbers depend on besides the code: the CPU, the kernels torch dispatches
to on it, and the GEMM rate of each dtype at one thread. A bf16 GEMM on a CPU without bf16
instructions (AVX2 only) runs at a small fraction of fp32's rate, so a bf16 table from one
machine does not transfer to another: every report records these facts."""
from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version

import torch

from longctx.train.mfu import measure_matmul_flops


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags(wanted=("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")) -> list[str]:
    """Which of the vector / matrix instruction sets that decide bf16 speed the CPU has."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [w for w in wanted if w in flags]


def package_versions(names=("torch", "deepspeed", "transformers", "accelerate")) -> dict:
    """Installed versions of the libraries the contenders run on (None: not installed): a
    peer's behaviour, its gradients included, changes between their releases."""
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def machine_facts(dtypes=(torch.float32, torch.bfloat16), n: int = 1024, seconds: float = 0.3) -> dict:
    """The CPU, torch's kernel level, each dtype's best GEMM rate (GFLOP/s) at one intra-op
    thread (the thread count is restored), and the libraries' versions."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rates = {str(dt).removeprefix("torch."): round(measure_matmul_flops(dt, n=n, seconds=seconds) / 1e9, 2)
                 for dt in dtypes}
    finally:
        torch.set_num_threads(threads)
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "cpu_flags": cpu_flags(),
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gemm_gflops_1_thread": rates, "versions": package_versions()}
