"""The context-parallel layout of a run: which strategy, and its Ulysses x ring degrees.

impl:  ring       K/V around a ring (point to point), zigzag balanced      cp_size ranks
       allgather  all-gather K/V, attend with local queries (Llama 3)
       ulysses    all-to-all sequence <-> heads; ulysses_size = cp_size
       hybrid     ulysses_size (inner, a2a) x cp_size/ulysses_size (outer ring)

Pure checks of user input (no process group, no tensors): they run before any collective, so
a bad configuration is a one-line UserError on every rank, never a hang.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx.errors import require
from longctx.parallel.sharding import check_seq_len

CP_IMPLS = ("ring", "allgather", "ulysses", "hybrid")


def ulysses_degree(cp_impl: str, cp_size: int, ulysses_size: Optional[int]) -> Optional[int]:
    """The all-to-all degree a config asks for: cp_size for ulysses, ulysses_size for hybrid,
    None (no all-to-all) for ring and allgather."""
    if cp_impl == "ulysses":
        return cp_size
    return ulysses_size if cp_impl == "hybrid" else None


@dataclass(frozen=True)
class CPLayout:
    cp_size: int
    impl: str
    ulysses_size: int  # a2a degree (1 for ring / allgather)
    ring_size: int  # ring degree (1 for ulysses / allgather)


def _divisors(n: int):
    return [d for d in range(1, n + 1) if n % d == 0]


def validate_layout(cp_size: int, impl: str, ulysses_size: Optional[int] = None,
                    world_size: Optional[int] = None) -> CPLayout:
    """Checks that need no model or data shapes; returns the resolved layout."""
    require(impl in CP_IMPLS, f"parallel.cp_impl={impl!r} is unknown; valid: {', '.join(CP_IMPLS)}")
    require(isinstance(cp_size, int) and cp_size >= 1, f"parallel.cp_size={cp_size!r} must be an integer >= 1")
    if world_size is not None:
        require(world_size % cp_size == 0,
                f"parallel.cp_size={cp_size} must divide the world size {world_size}; "
                f"valid: {', '.join(map(str, _divisors(world_size)))}")
    u = ulysses_size or None
    if impl in ("ring", "allgather"):
        require(u in (None, 1), f"parallel.ulysses_size={ulysses_size} applies only to cp_impl ulysses or hybrid "
                                f"(cp_impl is {impl}); set it to 1 or leave it unset")
        return CPLayout(cp_size, impl, 1, cp_size if impl == "ring" else 1)
    if impl == "ulysses":
        require(u in (None, cp_size), f"parallel.ulysses_size={ulysses_size} must equal parallel.cp_size={cp_size} "
                                      "for cp_impl ulysses (use cp_impl hybrid to combine with a ring)")
        return CPLayout(cp_size, impl, cp_size, 1)
    require(u is not None and cp_size % u == 0,
            f"parallel.ulysses_size={ulysses_size} must divide parallel.cp_size={cp_size} for cp_impl hybrid; "
            f"valid: {', '.join(map(str, _divisors(cp_size)))}")
    return CPLayout(cp_size, impl, u, cp_size // u)


def validate_heads(layout: CPLayout, num_heads: int, num_kv_heads: int) -> None:
    U = layout.ulysses_size
    if U == 1:
        return
    valid = [d for d in _divisors(num_heads) if num_kv_heads % d == 0 or d % num_kv_heads == 0]
    require(num_heads % U == 0,
            f"parallel.ulysses_size={U} must divide the number of attention heads ({num_heads}); "
            f"valid: {', '.join(map(str, valid))}")
    require(num_kv_heads % U == 0 or U % num_kv_heads == 0,
            f"parallel.ulysses_size={U} must divide, or be a multiple of, the number of kv heads ({num_kv_heads}); "
            f"valid: {', '.join(map(str, valid))}")


def validate_cp(world_size: int, cp_size: int, impl: str, ulysses_size: Optional[int], num_heads: int,
                num_kv_heads: int, seq_len: int) -> CPLayout:
    """Every user-facing CP check; raises longctx.errors.UserError naming the config field."""
    layout = validate_layout(cp_size, impl, ulysses_size, world_size)
    validate_heads(layout, num_heads, num_kv_heads)
    check_seq_len(seq_len, cp_size)
    return layout
