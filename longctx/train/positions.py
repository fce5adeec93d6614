"""Loss by position: the (sum, count) pairs of the position buckets as a record's mapping."""
from __future__ import annotations

import math
from typing import Optional, Sequence

from longctx.config.validation import bucket_labels


def means_by_position(sums: Sequence[float], counts: Sequence[float], ends: Sequence[int]) -> dict:
    """{'0-1024': mean loss, ...}: each bucket's loss sum over its weight sum; an empty bucket
    (no label token at those positions) is None, never NaN; so is a non-finite one (a bad step's)."""
    means: dict[str, Optional[float]] = {}
    for label, total, count in zip(bucket_labels(ends), sums, counts):
        mean = total / count if count > 0 else None
        means[label] = mean if mean is not None and math.isfinite(mean) else None
    return means


def split_sums(flat: Sequence[float], k: int) -> tuple[list, list]:
    """(loss sums, weight sums) of a flattened (2, k) tensor's values."""
    return list(flat[:k]), list(flat[k:2 * k])
