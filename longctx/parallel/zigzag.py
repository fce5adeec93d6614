"""The zigzag layout's arithmetic, without tensors: the chunks a CP rank holds and the length
rule (checked by config validation before torch loads). sharding.py applies it to tensors."""
from __future__ import annotations

from longctx.base.errors import require


def zigzag_multiple(cp_size: int) -> int:
    """The granularity of the zigzag layout: a sequence length must be a multiple of it."""
    return 1 if cp_size == 1 else 2 * cp_size


def check_seq_len(seq_len: int, cp_size: int, *, seq_len_field: str = "data.seq_len",
                  cp_size_field: str = "parallel.cp_size") -> None:
    """The zigzag layout's length rule; the messages name the given config fields."""
    require(cp_size >= 1, f"{cp_size_field} must be >= 1, got {cp_size}")
    if cp_size > 1:
        n = zigzag_multiple(cp_size)
        lower, upper = (seq_len // n) * n, (seq_len // n + 1) * n
        require(seq_len % n == 0,
                f"{seq_len_field}={seq_len} must be divisible by 2*{cp_size_field}={n} for the zigzag CP layout; "
                f"valid nearby: {lower or upper}, {upper}")


def zigzag_chunks(cp_rank: int, cp_size: int) -> tuple:
    """The two chunk indices (of 2*cp_size) held by `cp_rank`."""
    return cp_rank, 2 * cp_size - 1 - cp_rank
