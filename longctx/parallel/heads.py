"""Which query and kv heads each member of a Ulysses group attends to (pure index math).

The Hq query heads are cut into U contiguous ranges, the first Hq % U of ceil(Hq/U) heads and
the rest of floor(Hq/U) heads. Member u then needs the kv heads its queries use (query head h
uses kv head h // G, G = Hq / Hkv): a contiguous kv range that may overlap a neighbour's, in
which case that kv head is sent to both (replicated) and its gradient is the sum of theirs.

`even` is the split the fast paths of ulysses.py / hybrid.py handle (U divides Hq, and U
divides Hkv or is a multiple of it: every member gets whole kv groups or a part of one); every
other split goes through the range-based all-to-all. A member's queries are attended in runs
of one kv head (partial groups at the range's ends) or of whole groups (merged), each run one
uniform GQA kernel call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

Range = Tuple[int, int]  # [lo, hi) of global head indices
Run = Tuple[int, int, int, int]  # (q_lo, q_hi, kv_lo, kv_hi), global head indices

# An uneven split is used where its slowest member's attention is at most this much of an even
# split's (U * ceil(Hq/U) / Hq); beyond it the automatic choice takes a smaller Ulysses degree.
UNEVEN_WASTE_LIMIT = 1.25


@dataclass(frozen=True)
class HeadShards:
    num_heads: int
    num_kv_heads: int
    degree: int  # Ulysses degree U

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def even(self) -> bool:
        H, Hkv, U = self.num_heads, self.num_kv_heads, self.degree
        return H % U == 0 and (Hkv % U == 0 or U % Hkv == 0)

    @property
    def max_heads(self) -> int:
        """Query heads of the busiest member: ceil(Hq / U)."""
        return -(-self.num_heads // self.degree)

    @property
    def waste(self) -> float:
        """Attention time of the busiest member over an even split's (1.0 when U divides Hq)."""
        return self.degree * self.max_heads / self.num_heads

    @property
    def max_kv_heads(self) -> int:
        """kv heads of the member that needs the most (after replication)."""
        return max(hi - lo for lo, hi in self.kv_ranges())

    def q_range(self, u: int) -> Range:
        base, extra = divmod(self.num_heads, self.degree)
        lo = u * base + min(u, extra)
        return lo, lo + base + (u < extra)

    def kv_range(self, u: int) -> Range:
        lo, hi = self.q_range(u)
        if hi == lo:
            return lo // self.group, lo // self.group
        return lo // self.group, (hi - 1) // self.group + 1

    def q_ranges(self) -> List[Range]:
        return [self.q_range(u) for u in range(self.degree)]

    def kv_ranges(self) -> List[Range]:
        return [self.kv_range(u) for u in range(self.degree)]

    def runs(self, u: int) -> List[Run]:
        """Member u's queries by kv head: one run per kv head it uses."""
        lo, hi = self.q_range(u)
        G, out = self.group, []
        for kv in range(*self.kv_range(u)):
            out.append((max(lo, kv * G), min(hi, (kv + 1) * G), kv, kv + 1))
        return out

    def calls(self, u: int) -> List[Run]:
        """runs(u) with adjacent whole groups merged: the forward's kernel calls."""
        G, out = self.group, []
        for run in self.runs(u):
            if out and run[1] - run[0] == G and out[-1][1] - out[-1][0] == G * (out[-1][3] - out[-1][2]):
                prev = out.pop()
                run = (prev[0], run[1], prev[2], run[3])
            out.append(run)
        return out

    def rounds(self) -> int:
        """Backward rounds (one kv head per member and round): the most runs of any member."""
        return max(len(self.runs(u)) for u in range(self.degree))


def divides_evenly(degree: int, num_heads: int, num_kv_heads: int) -> bool:
    return HeadShards(num_heads, num_kv_heads, degree).even


def auto_ulysses_size(cp_size: int, num_heads: int, num_kv_heads: int) -> int:
    """The Ulysses degree of an automatic hybrid layout: the largest divisor of cp_size that
    splits the heads evenly, if one > 1 does; else the largest divisor <= Hq whose uneven
    split wastes at most UNEVEN_WASTE_LIMIT; else 1 (plain ring)."""
    divisors = [d for d in range(cp_size, 0, -1) if cp_size % d == 0 and d <= num_heads]
    even = [d for d in divisors if divides_evenly(d, num_heads, num_kv_heads)]
    if even and even[0] > 1:
        return even[0]
    uneven = [d for d in divisors if HeadShards(num_heads, num_kv_heads, d).waste <= UNEVEN_WASTE_LIMIT]
    return uneven[0] if uneven else 1
