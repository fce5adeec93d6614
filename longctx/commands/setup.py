"""`longctx setup [--check]`: prepare this environment once, after installing longctx.

Builds the DeepSpeed op a run may JIT-build (cpu_adam, for `parallel.offload_optimizer`) into
torch's extensions cache, so no job pays for it, measures this CPU's GEMM rates once (the MFU's
CPU peak and the slow-bf16 check read them; train/mfu.py), and reports what is installed. DeepSpeed's
shared-memory comm op is not needed (it serves DeepSpeed's inference only; see
longctx/parallel/ds_ops.py). scripts/bootstrap.sh (`./run.sh`) runs it.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import time


def add_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument("--check", action="store_true", help="report only: build nothing")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace) -> int:
    import torch  # heavy: loaded when the command runs, not for --help

    from longctx.parallel import ds_ops
    from longctx.train import mfu

    device = f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)" if torch.cuda.is_available() else "CPU"
    flash = "installed" if importlib.util.find_spec("flash_attn") else "not installed (optional, CUDA only)"
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    print(f"torch {torch.__version__} ({device}); deepspeed {_version('deepspeed')}; flash-attn {flash}")
    print(f"C++ compiler: {compiler or 'none (torch.compile and DeepSpeed ops need one)'}")
    if not args.check and not torch.cuda.is_available():
        rates = mfu.measure_environment()
        shown = ", ".join(f"{name}: {rate / 1e9:.1f}" for name, rate in rates.items())
        print(f"CPU GEMM GFLOP/s (dtype @ threads), cached in {mfu.default_rates_file()}: {shown}")
    print(f"DeepSpeed ops in {ds_ops.extensions_root()}:")
    for name in ds_ops.skip_unused_ops():
        print(f"  {name}: not needed (DeepSpeed inference only)")
    builders = ds_ops.offload_builders(offload_optimizer=True)
    if not builders:
        print("  cpu_adam: prebuilt into DeepSpeed or not available on this accelerator")
    for builder in builders:
        if ds_ops.is_built(builder.NAME):
            print(f"  {builder.NAME}: built (for parallel.offload_optimizer)")
        elif args.check:
            print(f"  {builder.NAME}: not built; `longctx setup` builds it ({ds_ops.BUILD_TAKES})")
        else:
            started = time.time()
            ds_ops.ensure_built(offload_optimizer=True, notify=lambda line: print(f"  {line}", flush=True))
            print(f"  {builder.NAME}: built in {time.time() - started:.0f} s (for parallel.offload_optimizer)")
    return 0
