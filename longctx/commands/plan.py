"""`longctx plan --config FILE [key=value ...] [--gpus N] [--gpu-mem 80GB] [--seq-len 128k]`.

Per-device memory of every stage of a training config (parameters, gradients, optimizer
states by ZeRO stage and offload, activations under the checkpointing policy, attention and
loss workspaces, communication buffers, runtime), whether it fits, and advice for the target
length (default: the longest stage): for every valid cp size, the option that fits with the
lowest predicted time per token among ZeRO 0-3 x checkpointing none/selective/full (ties: the
lower ZeRO stage, less checkpointing), optimizer offload only when none of them fits; the
recommendation is the fitting row with the lowest predicted time per token (offload only when
nothing else fits; ties: the smaller cp). When even optimizer offload does not fit, the last tier
offloads the checkpointed blocks' inputs (host memory or a per-rank file) with the parameters
(ZeRO-3: host or NVMe), or runs ZeRO-2 with MLP tiles; offloads must fit the node's host memory
(--host-mem) and their copies are timed at --pcie-gbps / --nvme-gbps. The report ends with the
longest sequence any option takes and what stops twice that.

Defaults come from a recipe's `# cluster: nodes=N gpus_per_node=G gpu_mem=80GB` line when the
config has one (`device=cpu` there: host memory per process), else 8 GPUs of 80 GB. No model
is built and nothing is allocated.
"""
from __future__ import annotations

import argparse

# The planner (longctx/plan/command.py) loads when the command runs, so `--help` stays fast.


def add_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument("--config", default=None, help="training YAML (default: the built-in defaults)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. parallel.cp_size=4 data.seq_len=131072")
    p.add_argument("--gpus", type=int, default=None, help="world size: processes/GPUs in the job")
    p.add_argument("--gpu-mem", default=None,
                   help="memory per GPU (per process with --device cpu), e.g. 80GB, 141GB, 24GiB (default: the "
                        "config's '# cluster:' gpu_mem, else 80GB; on CPU this machine's memory / its processes)")
    p.add_argument("--seq-len", default=None, help="target length for the advice, e.g. 131072 or 128k "
                                                   "(default: the longest stage)")
    p.add_argument("--device", choices=("gpu", "cpu"), default=None,
                   help="gpu (caching allocator, CUDA context) or cpu (host memory per process: RSS, gloo); "
                        "default: the config's '# cluster:' line (device=cpu), else gpu")
    p.add_argument("--runtime-gb", type=float, default=None,
                   help="fixed per-process runtime memory (default: 1.5 on GPU, 0.36 measured on CPU)")
    p.add_argument("--host-mem", default=None,
                   help="host memory per node for offloads (GPU jobs), e.g. 2TB (default: the config's '# cluster:' "
                        "host_mem, else 2TB); 90%% of it is shared by the node's GPUs")
    p.add_argument("--pcie-gbps", type=float, default=25.0,
                   help="host <-> GPU copy rate per GPU in GB/s, for offload times (default 25)")
    p.add_argument("--nvme-gbps", type=float, default=3.0,
                   help="NVMe read/write rate per GPU in GB/s, for disk/nvme offload times (default 3)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--check", action="store_true", help="exit with code 3 when a stage does not fit")


def run(args: argparse.Namespace) -> int:
    from longctx.plan.command import run_plan  # see the top

    return run_plan(args)
