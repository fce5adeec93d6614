"""The lines a run prints at its start, confirming what it is about to do: where the weights
came from, how the RoPE changed, the effective context and the parallel layout."""
from __future__ import annotations

from typing import Any, Optional


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
