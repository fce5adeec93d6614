"""Parallelism applied to a plain model: context-parallel attention (this package's cp/ring/
allgather/ulysses/hybrid modules), zigzag sharding helpers, and (in sibling modules) process
meshes, ZeRO and activation checkpointing."""
from longctx.parallel.cp import (
    CP_IMPLS, CPLayout, ContextParallelAttention, make_cp_attention, validate_cp, validate_heads, validate_layout,
)
from longctx.parallel.sharding import (
    gather_sequence, positions_from_segments, shard_batch, shard_sequence, unshard_sequence, zigzag_indices,
    zigzag_permutation,
)

__all__ = [
    "CP_IMPLS", "CPLayout", "ContextParallelAttention", "gather_sequence", "make_cp_attention",
    "positions_from_segments", "shard_batch", "shard_sequence", "unshard_sequence", "validate_cp",
    "validate_heads", "validate_layout", "zigzag_indices", "zigzag_permutation",
]
