"""Loader states for another data-parallel size: the saved per-rank states of a run at dp ranks
become the states its loaders would hold at dp' ranks after the same rows.

    old = by_dp_rank(saved_states)                       # one state per old dp rank, checked
    total = rows_consumed(old)                           # rows the whole run has trained on
    new = reshard_cached(old, dp_rank=r, dp_size=n, sources=[CachedSource(n_real, weight), ...],
                         shuffle=True, epochs=None)      # rank r of n, loadable by DataLoader

Only the pre-packed cache (data.cache_dir) has per-rank states that are a pure function of the
rows consumed: each source visits a seeded order of its rows per epoch, rank r taking the
positions r, r+dp, ... (data/cache.py CachedRows), and the mixture draws row k of rank r from a
stateless hash (data/loader.py). reshard_cached computes, without reading any row, the state
rank r of dp' ranks holds after total / dp' rows: the state of an uninterrupted run at dp'
at the same step. With one source, while every rank is inside the same epoch, that is the
global order continued exactly: the rows 0 .. total-1 of the epoch's order were trained on,
the new ranks continue at row `total`. Loaders without a cache pack documents per rank, so
their states cannot be recomputed; the trainer replays those (checkpoint/layout.py).

This module mirrors the arithmetic of CachedRows (epoch order, lazy epoch wrap) and of
DataLoader._pick; tests/unit/test_data_reshard.py checks it against the real loader.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from longctx.base.errors import UserError
from longctx.data.documents import uniform
from longctx.data.loader import STATE_VERSION

_SHARED = ("version", "dp_size", "seed", "seq_len", "cached")  # the same in every rank's state


@dataclass(frozen=True)
class CachedSource:
    """One source's built cache as the resharding needs it: real tokens per row (its n_rows is
    their count) and its mixture weight."""

    n_real: np.ndarray  # (n_rows,) int, data/cache.py PackedCache.n_real
    weight: float


def by_dp_rank(states: Sequence[dict]) -> list[dict]:
    """One loader state per old data-parallel rank, in dp-rank order, from the states of every
    saved world rank (the cp ranks of a dp rank hold the same state). UserError when the set
    is incomplete or the states disagree on what every rank shares."""
    if not states:
        raise UserError("data loader state: the checkpoint holds no rank states")
    first = states[0]
    if first.get("version") != STATE_VERSION:
        raise UserError(f"data loader state: version {first.get('version')} is not {STATE_VERSION}")
    dp = int(first["dp_size"])
    found: dict[int, dict] = {}
    for state in states:
        for key in _SHARED:
            if state.get(key) != first.get(key):
                raise UserError(f"data loader state: the ranks' states disagree on {key} "
                                f"({first.get(key)} vs {state.get(key)})")
        found.setdefault(int(state["dp_rank"]), state)
    missing = sorted(set(range(dp)) - set(found))
    if missing:
        raise UserError(f"data loader state: the checkpoint has no state of data-parallel rank {missing[0]} of {dp}")
    return [found[r] for r in range(dp)]


def rows_consumed(old: Sequence[dict]) -> int:
    """Rows all data-parallel ranks together have handed out."""
    return sum(int(s["rows"]) for s in old)


def rows_per_rank(total: int, dp_size: int) -> int:
    """Rows each of dp_size ranks has handed out after `total` rows; UserError when they do
    not divide (the global batch changed)."""
    if total % dp_size:
        raise UserError(f"data loader state: {total} rows trained so far do not split over {dp_size} data-parallel "
                        "ranks; resume with the global batch the checkpoint was trained with")
    return total // dp_size


def epoch_order(n_rows: int, *, seed: int, index: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Source `index`'s row order in `epoch` (CachedRows._rank_order before the rank's slice)."""
    order = np.arange(n_rows, dtype=np.int32 if n_rows < 2**31 else np.int64)
    if shuffle:
        np.random.default_rng([seed, index, epoch, 0xCAC4E]).shuffle(order)
    return order


class _Cursor:
    """One source's (epoch, cursor, done) at rank r of dp, advanced as CachedRows.next_row does
    (the epoch wraps lazily: after the last row of an epoch the cursor stays at its end)."""

    def __init__(self, n_rows: int, dp_rank: int, dp_size: int, epochs: Optional[int]):
        self.length = len(range(dp_rank, n_rows, dp_size))
        if self.length == 0:
            raise UserError(f"data loader state: a cache of {n_rows} rows has none for data-parallel rank {dp_rank} "
                            f"of {dp_size}")
        self.epochs = epochs
        self.epoch = self.cursor = 0
        self.done = False
        self.taken: dict[int, int] = {}  # epoch -> rows taken in it

    def take(self, count: int) -> int:
        """Take up to `count` rows; returns how many were taken (fewer once the source is done)."""
        got = 0
        while got < count and not self.done:
            if self.cursor < self.length:
                step = min(count - got, self.length - self.cursor)
                self.cursor += step
                self.taken[self.epoch] = self.taken.get(self.epoch, 0) + step
                got += step
                continue
            self.epoch += 1
            self.cursor = 0
            if self.epochs is not None and self.epoch >= self.epochs:
                self.done = True
        return got


def _pick(seed: int, rank: int, k: int, attempt: int, weights: Sequence[float], live: list[int]) -> int:
    """DataLoader._pick: the source of row k of `rank` among the live ones."""
    total = sum(weights[i] for i in live)
    u = uniform(seed, rank, k, attempt) * total
    acc = 0.0
    for i in live:
        acc += weights[i]
        if u < acc:
            return i
    return live[-1]


def _mix(cursors: list[_Cursor], weights: Sequence[float], seed: int, rank: int,
         rows: int) -> tuple[int, list[int], bool]:
    """Draw `rows` rows of `rank` from the mixture; (rows drawn, rows per source, finished)."""
    per_source = [0] * len(cursors)
    active = [i for i, w in enumerate(weights) if w > 0]
    if len(active) == 1:  # no draws: every row comes from the one source
        got = cursors[active[0]].take(rows)
        per_source[active[0]] = got
        return got, per_source, got < rows
    k = 0
    while k < rows:
        attempt = 0
        while True:
            live = [i for i in active if not cursors[i].done]
            if not live:
                return k, per_source, True
            i = _pick(seed, rank, k, attempt, weights, live)
            if cursors[i].take(1):
                break
            attempt += 1
        per_source[i] += 1
        k += 1
    return k, per_source, False


def _tokens(cursor: _Cursor, source: CachedSource, *, seed: int, index: int, dp_rank: int, dp_size: int,
            shuffle: bool) -> int:
    """Real tokens of the rows `cursor` took at rank dp_rank (each epoch's first rows of its slice)."""
    n_real = np.asarray(source.n_real)
    total = 0
    for epoch, count in cursor.taken.items():
        mine = epoch_order(len(n_real), seed=seed, index=index, epoch=epoch, shuffle=shuffle)[dp_rank::dp_size]
        total += int(n_real[mine[:count]].sum())
    return total


def reshard_cached(old: Sequence[dict], *, dp_rank: int, dp_size: int, sources: Sequence[CachedSource],
                   shuffle: bool, epochs: Optional[int]) -> dict:
    """The loader state of rank dp_rank of dp_size after the rows the old ranks (`by_dp_rank`)
    handed out, for a data.cache_dir loader (see the module docstring)."""
    first = old[0]
    if not first.get("cached"):
        raise UserError("data loader state: saved without data.cache_dir; only cached loader states are resharded")
    if len(first["sources"]) != len(sources):
        raise UserError(f"data loader state: saved with {len(first['sources'])} sources, this run has {len(sources)}")
    seed = int(first["seed"])
    weights = [float(s.weight) for s in sources]
    rows = rows_per_rank(rows_consumed(old), dp_size)
    cursors = [_Cursor(len(s.n_real), dp_rank, dp_size, epochs) for s in sources]
    drawn, per_source, finished = _mix(cursors, weights, seed, dp_rank, rows)
    finished = finished or all(bool(s["finished"]) for s in old)
    source_states = []
    for i, (cursor, saved) in enumerate(zip(cursors, first["sources"])):
        if "cursor" not in saved:
            raise UserError("data loader state: saved without data.cache_dir; only cached loader states are resharded")
        source_states.append({"epoch": cursor.epoch, "cursor": cursor.cursor, "done": cursor.done,
                              "cache": saved.get("cache")})
    tokens = [_tokens(c, s, seed=seed, index=i, dp_rank=dp_rank, dp_size=dp_size, shuffle=shuffle)
              for i, (c, s) in enumerate(zip(cursors, sources))]
    return {"version": STATE_VERSION, "dp_rank": int(dp_rank), "dp_size": int(dp_size), "seed": seed,
            "seq_len": first["seq_len"], "cached": True, "rows": drawn, "finished": finished,
            "source_rows": per_source, "source_tokens": tokens, "sources": source_states}
