"""Parallelism applied to a plain model: parallelize.py is the one step (context-parallel
attention, activation checkpointing, compile, ZeRO engine); one module per CP strategy (ring,
allgather, ulysses, hybrid) with their communication in comm.py; zigzag sharding helpers;
process meshes; decode-time CP (cp_decode.py)."""
from longctx.base.lazy_exports import exported_names, lazy_exports

_EXPORTS = {
    "cp": ["ContextParallelAttention", "make_cp_attention"],
    "layout": ["CP_IMPLS", "CPLayout", "ulysses_degree", "validate_cp", "validate_heads", "validate_layout"],
    "sharding": ["gather_sequence", "positions_from_segments", "shard_batch", "shard_sequence", "unshard_sequence",
                 "zigzag_indices", "zigzag_permutation"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = exported_names(_EXPORTS)
