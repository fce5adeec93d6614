"""The context-parallel layout of a run: which strategy, and its Ulysses x ring degrees.

impl:  ring       K/V around a ring (point to point), zigzag balanced      cp_size ranks
       allgather  all-gather K/V, attend with local queries (Llama 3)
       ulysses    all-to-all sequence <-> heads; ulysses_size = cp_size
       hybrid     ulysses_size (inner, a2a) x cp_size/ulysses_size (outer ring); ulysses_size 0:
                  chosen from the head counts (heads.auto_ulysses_size, resolve_layout)

Any head count splits over a Ulysses degree up to the number of query heads: uneven head
shards where the degree does not divide them (heads.py).

Pure checks of user input (no process group, no tensors): they run before any collective, so
a bad configuration is a one-line UserError on every rank, never a hang.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx.base.errors import require
from longctx.parallel.heads import auto_ulysses_size
from longctx.parallel.zigzag import check_seq_len

CP_IMPLS = ("ring", "allgather", "ulysses", "hybrid")
DECODE_CP_IMPLS = ("ring", "allgather", "ulysses")  # the impls cp_decode prefills with (not hybrid)


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
    ulysses_size: int  # a2a degree (1 for ring / allgather; 0: hybrid, chosen from the heads)
    ring_size: int  # ring degree (1 for ulysses / allgather; 0 while ulysses_size is)


@dataclass(frozen=True)
class CPFields:
    """The config fields the CP checks name: a stage's own where it sets them (stages[1].cp_size)."""

    cp_size: str = "parallel.cp_size"
    seq_len: str = "data.seq_len"


def _divisors(n: int):
    return [d for d in range(1, n + 1) if n % d == 0]


def validate_layout(cp_size: int, impl: str, ulysses_size: Optional[int] = None,
                    world_size: Optional[int] = None, fields: CPFields = CPFields()) -> CPLayout:
    """Checks that need no model or data shapes; returns the resolved layout."""
    cp = fields.cp_size
    require(impl in CP_IMPLS, f"parallel.cp_impl={impl!r} is unknown; valid: {', '.join(CP_IMPLS)}")
    require(isinstance(cp_size, int) and cp_size >= 1, f"{cp}={cp_size!r} must be an integer >= 1")
    if world_size is not None:
        require(world_size % cp_size == 0,
                f"{cp}={cp_size} must divide the world size {world_size}; "
                f"valid: {', '.join(map(str, _divisors(world_size)))}")
    u = ulysses_size or None
    if impl in ("ring", "allgather"):
        require(u in (None, 1), f"parallel.ulysses_size={ulysses_size} applies only to cp_impl ulysses or hybrid "
                                f"(cp_impl is {impl}); set it to 1 or leave it unset")
        return CPLayout(cp_size, impl, 1, cp_size if impl == "ring" else 1)
    if impl == "ulysses":
        require(u in (None, cp_size), f"parallel.ulysses_size={ulysses_size} must equal {cp}={cp_size} "
                                      "for cp_impl ulysses (use cp_impl hybrid to combine with a ring)")
        return CPLayout(cp_size, impl, cp_size, 1)
    if ulysses_size == 0:
        return CPLayout(cp_size, impl, 0, 0)  # resolve_layout picks the degree once the heads are known
    require(u is not None and cp_size % u == 0,
            f"parallel.ulysses_size={ulysses_size} must divide {cp}={cp_size} for cp_impl hybrid; "
            f"valid: {', '.join(map(str, _divisors(cp_size)))}, or 0 (chosen from the head counts)")
    return CPLayout(cp_size, impl, u, cp_size // u)


def resolve_layout(layout: CPLayout, num_heads: int, num_kv_heads: int) -> CPLayout:
    """The layout with an automatic hybrid degree (ulysses_size 0) chosen for these heads."""
    if layout.ulysses_size:
        return layout
    U = auto_ulysses_size(layout.cp_size, num_heads, num_kv_heads)
    return CPLayout(layout.cp_size, layout.impl, U, layout.cp_size // U)


def validate_heads(layout: CPLayout, num_heads: int, num_kv_heads: int, fields: CPFields = CPFields()) -> None:
    """Any head count splits over a Ulysses degree up to the query heads (uneven shards where U
    does not divide them, heads.py); a member without a query head is refused."""
    U = layout.ulysses_size
    if U <= num_heads:
        return
    if layout.impl == "ulysses":
        require(False, f"parallel.ulysses_size={U} (cp_impl ulysses: {fields.cp_size}) exceeds the number of "
                       f"attention heads ({num_heads}): every Ulysses member needs a query head; valid: "
                       f"{fields.cp_size} <= {num_heads}, or cp_impl ring, or cp_impl hybrid with "
                       f"parallel.ulysses_size <= {num_heads}")
    valid = [d for d in _divisors(layout.cp_size) if d <= num_heads]
    require(False, f"parallel.ulysses_size={U} exceeds the number of attention heads ({num_heads}): every "
                   f"Ulysses member needs a query head; valid: {', '.join(map(str, valid))}")


def validate_cp(world_size: int, cp_size: int, impl: str, ulysses_size: Optional[int], num_heads: int,
                num_kv_heads: int, seq_len: int, fields: CPFields = CPFields()) -> CPLayout:
    """Every user-facing CP check; raises longctx.base.errors.UserError naming the config field (`fields`)."""
    layout = resolve_layout(validate_layout(cp_size, impl, ulysses_size, world_size, fields), num_heads, num_kv_heads)
    validate_heads(layout, num_heads, num_kv_heads, fields)
    check_seq_len(seq_len, cp_size, seq_len_field=fields.seq_len, cp_size_field=fields.cp_size)
    return layout
