"""The memory planner's text output and its command-line units (80GB, 128k)."""
from __future__ import annotations

import re
from typing import Optional

from longctx.base.errors import UserError
from longctx.plan.memory import COMPONENTS, GPU_USABLE, GiB, MemoryEstimate


def fmt_bytes(x: float) -> str:
    return f"{x / GiB:8.2f} GiB"


def gib(x: float) -> str:
    """A memory size in GiB for a sentence: '80', '3.9'."""
    value = x / GiB
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def format_estimate(est: MemoryEstimate, device_bytes: Optional[float] = None) -> str:
    lay = est.info["layout"]
    what = "memory per GPU" if est.device == "gpu" else "host memory per process (CPU RSS)"
    offload = ", ".join([k for k in ("offload_optimizer", "offload_params") if lay[k]]
                        + ([f"offload_activations {lay['offload_activations']}"]
                           if lay.get("offload_activations", "none") != "none" else [])) or "no offload"
    split = f" {est.info['ulysses']}" if est.info.get("ulysses") else ""
    lines = [f"  {what}: ZeRO-{lay['zero_stage']} ({offload}), {lay['dtype']}, "
             f"checkpointing {lay['activation_checkpointing']}, cp {lay['cp_size']} ({lay['cp_impl']}{split}), "
             f"{est.info['tokens_per_rank']:,} tokens/rank/micro-batch; peak in phase '{est.phase}'"]
    labels = {"parameters": "parameters", "gradients": "gradients", "optimizer": "optimizer states",
              "activations": "activations", "attention": "attention workspace", "loss": "loss workspace",
              "communication": "communication buffers", "runtime": "runtime (context, libraries)"}
    total, trained = est.info["parameters_total"], est.info.get("parameters_trained", est.info["parameters_total"])
    if trained != total:
        lines.append(f"    adapter: {trained:,} of {total:,} parameters trained ({100 * trained / total:.2f}%): "
                     "gradients and optimizer states for those only, the rest frozen")
    for key in COMPONENTS:
        lines.append(f"    {labels[key]:<30}{fmt_bytes(getattr(est, key))}")
    lines.append(f"    {'total (peak)':<30}{fmt_bytes(est.peak)}")
    if est.host:
        lines.append(f"    {'host memory (offloaded)':<30}{fmt_bytes(est.host)}")
    if est.disk:
        lines.append(f"    {'drive (offloaded)':<30}{fmt_bytes(est.disk)}")
    if device_bytes:
        usable = device_bytes * (GPU_USABLE if est.device == "gpu" else 1.0)
        verdict = "fits" if est.fits(device_bytes) else "does NOT fit"
        lines.append(f"    {verdict} in {gib(device_bytes)} GiB ({usable / GiB:.1f} GiB usable)")
    return "\n".join(lines)


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str, *, what: str = "--gpu-mem") -> float:
    """'80GB', '80G', '80GiB', '141' (GiB) -> bytes. GPU memory is sold in GiB-ish units, so
    GB and GiB both mean 2**30 here (an '80GB' H100 has 79.6 GiB usable by CUDA)."""
    match = _SIZE.match(str(text))
    if not match:
        raise UserError(f"{what}: cannot read {text!r}; use e.g. 80GB, 141GB or 24GiB")
    value, unit = float(match.group(1)), match.group(2).lower()
    scale = {"": GiB, "k": 2**10, "m": 2**20, "g": GiB, "t": 2**40}[unit]
    if value <= 0:
        raise UserError(f"{what}: must be positive, got {text!r}")
    return value * scale


def parse_length(text: str, *, what: str = "--seq-len") -> int:
    s = str(text).strip().lower()
    mult = 1024 if s.endswith("k") else (1024 * 1024 if s.endswith("m") else 1)
    try:
        n = int(float(s.rstrip("km")) * mult)
    except ValueError:
        raise UserError(f"{what}: cannot read {text!r}; use e.g. 131072 or 128k") from None
    if n < 2:
        raise UserError(f"{what}: must be >= 2, got {text!r}")
    return n
