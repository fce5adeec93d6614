"""Parallelism applied to a plain model: parallelize.py is the one step (context-parallel
attention, activation checkpointing, compile, ZeRO engine); one module per CP strategy (ring,
allgather, ulysses, hybrid) with their communication in comm.py; zigzag sharding helpers;
process meshes; decode-time CP (cp_decode.py)."""
from longctx.parallel.cp import ContextParallelAttention, make_cp_attention
from longctx.parallel.layout import CP_IMPLS, CPLayout, ulysses_degree, validate_cp, validate_heads, validate_layout
from longctx.parallel.sharding import (
    gather_sequence,
    positions_from_segments,
    shard_batch,
    shard_sequence,
    unshard_sequence,
    zigzag_indices,
    zigzag_permutation,
)

__all__ = [
    "CP_IMPLS", "CPLayout", "ContextParallelAttention", "gather_sequence", "make_cp_attention",
    "positions_from_segments", "shard_batch", "shard_sequence", "ulysses_degree", "unshard_sequence", "validate_cp",
    "validate_heads", "validate_layout", "zigzag_indices", "zigzag_permutation",
]
