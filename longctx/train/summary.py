"""The lines a run prints at its start, confirming what it is about to do (where the weights
came from, how the RoPE changed, the effective context and the parallel layout), and the
summary it ends with (steps, final loss, times, throughput, where its outputs are)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from longctx.reporting.progress import format_duration


def _value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return f"[{len(v)} values]"
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe_rope(params: dict) -> str:
    """e.g. "yarn (factor 4, original_max_position_embeddings 4096, rope_theta 10000)"."""
    rest = ", ".join(f"{k} {_value(v)}" for k, v in sorted(params.items()) if k != "rope_type")
    return f"{params.get('rope_type', 'default')} ({rest})"


def weights_line(init_from: Optional[str], preset: str, n_tensors: int, n_params: int, seed: int) -> str:
    if init_from:
        return f"model: loaded {n_tensors} tensors ({n_params:,} parameters) from {init_from}"
    return f"model: preset {preset}, {n_params:,} parameters, random init (train.seed {seed})"


def rope_line(where: str, before, after) -> str:
    """`before` / `after`: ModelConfig of the weights' origin (or the previous stage) and now."""
    context = f"effective context {after.max_position_embeddings} (max_position_embeddings"
    if before.max_position_embeddings != after.max_position_embeddings:
        context += f", was {before.max_position_embeddings}"
    context += ")"
    if before.rope_parameters == after.rope_parameters:
        return f"{where}: RoPE {describe_rope(after.rope_parameters)}, unchanged; {context}"
    return (f"{where}: RoPE changed from {describe_rope(before.rope_parameters)} to "
            f"{describe_rope(after.rope_parameters)}; {context}")


def layout_line(world: int, dp: int, cp: int, cp_impl: str, zero_stage: int, offload: bool, dtype: str,
                checkpointing: str) -> str:
    cp_part = f"cp {cp} ({cp_impl})" if cp > 1 else "cp 1"
    offload_part = " with CPU optimizer offload" if offload else ""
    return (f"layout: world {world} = dp {dp} x {cp_part}, ZeRO-{zero_stage}{offload_part}, {dtype}, "
            f"activation checkpointing {checkpointing}")


@dataclass
class RunTotals:
    """What the end summary reports, filled in as the job goes."""

    first_step: int  # the step the job started from (0, or a resumed checkpoint's)
    first_tokens: int
    loop_start: float = field(default_factory=time.monotonic)
    step: int = 0
    tokens: int = 0
    final_loss: Optional[float] = None
    train_seconds: float = 0.0  # the step loop, checkpoint saves included
    wall_seconds: float = 0.0  # the whole job, from the trainer's start
    last_checkpoint: Optional[Path] = None
    export: Optional[Path] = None


def end_summary(t: RunTotals, out_dir: Path, *, stages: int, preempted: bool = False) -> str:
    """e.g.
    train done: 10 steps (2 stages), final loss 6.1958, wall 0:36 (training 0:06, 3,215 tokens/s)
      last checkpoint: runs/cpu-yarn/checkpoints/step_0000010
      hf export:       runs/cpu-yarn/hf
      metrics:         runs/cpu-yarn/metrics.jsonl (per-rank logs in runs/cpu-yarn/logs)"""
    steps = t.step - t.first_step
    what = f"{steps} steps" if t.first_step == 0 else f"{steps} steps (steps {t.first_step + 1}-{t.step})"
    if stages > 1:
        what += f" ({stages} stages)"
    head = f"train preempted at step {t.step}: {what}" if preempted else f"train done: {what}"
    if t.final_loss is not None:
        head += f", final loss {t.final_loss:.4f}" if math.isfinite(t.final_loss) else f", final loss {t.final_loss}"
    rate = (t.tokens - t.first_tokens) / t.train_seconds if t.train_seconds > 0 else 0.0
    head += (f", wall {format_duration(t.wall_seconds)} "
             f"(training {format_duration(t.train_seconds)}, {rate:,.0f} tokens/s)")
    checkpoint = str(t.last_checkpoint) if t.last_checkpoint else "none written"
    if t.export:
        export = str(t.export)
    elif preempted:
        export = "not written (the run stopped early; resume with checkpoint.resume=auto)"
    elif t.last_checkpoint:
        export = (f"not written (checkpoint.export_hf: false); "
                  f"longctx export --checkpoint {t.last_checkpoint} --out DIR")
    else:
        export = "not written (checkpoint.export_hf: false)"
    lines = [head,
             f"  last checkpoint: {checkpoint}",
             f"  hf export:       {export}",
             f"  metrics:         {out_dir / 'metrics.jsonl'} (per-rank logs in {out_dir / 'logs'})"]
    return "\n".join(lines)
