"""Documents: a rank-local, resumable stream of tokenized documents of one source.

How a stream walks one epoch (per data-parallel rank):
  map-style  documents are permuted per epoch (seeded), rank r takes positions r, r+dp, ...
  streaming  the files are read in order, rank r takes documents r, r+dp, ...
and in both, the rank's documents go through *windows* of `shuffle_window` documents:
tokenize (batched) → filter by token length → up-sample by length bucket → shuffle within the
window. A stream's state is (epoch, window, position in window) plus, for streaming, the
🤗 IterableDataset state at the window start; resuming re-reads and re-tokenizes that one
window, which reproduces it exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import numpy as np

from longctx.base.errors import UserError
from longctx.data.source_config import SourceConfig, source_label


@dataclass
class Doc:
    tokens: np.ndarray  # (L,) int32, BOS/EOS included
    answer: Optional[np.ndarray] = None  # (L,) bool: token belongs to an answer span

    def __len__(self) -> int:
        return len(self.tokens)


def mix64(*parts: int) -> int:
    """A 64-bit hash of integers (splitmix64 chain): cheap, stateless randomness."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x


def uniform(*parts: int) -> float:
    return (mix64(*parts) >> 11) * (1.0 / (1 << 53))


def _upsample_factor(src: SourceConfig, n_tokens: int) -> float:
    for b in src.upsample:
        if n_tokens >= b.min_tokens and (b.max_tokens is None or n_tokens < b.max_tokens):
            return float(b.factor)
    return 1.0


@dataclass(frozen=True)
class StreamOrder:
    """Which documents a rank reads, and in what order: windows of `window` documents, shuffled
    within (seeded) when `shuffle`, this rank's share of each (dp_rank of dp_size), `epochs`
    passes (None: without end)."""

    seed: int
    dp_rank: int
    dp_size: int
    window: int
    shuffle: bool
    epochs: Optional[int]


@dataclass(frozen=True)
class DocFraming:
    """What each document's tokens carry: BOS and EOS, and the answer mask (synthetic sources)."""

    add_bos: bool
    add_eos: bool
    answer_mask: bool


class DocumentStream:
    """Rank-local stream of tokenized documents of one source, resumable exactly."""

    def __init__(self, table, src: SourceConfig, index: int, tokenizer, order: StreamOrder, framing: DocFraming,
                 on_doc: Optional[Callable[[int], None]] = None):
        self.table, self.src, self.index, self.tok = table, src, index, tokenizer
        self.seed, self.rank, self.world = int(order.seed), int(order.dp_rank), int(order.dp_size)
        self.W, self.shuffle, self.epochs = int(order.window), bool(order.shuffle), order.epochs
        self.add_bos, self.add_eos, self.answer_mask = framing.add_bos, framing.add_eos, framing.answer_mask
        self.on_doc = on_doc
        self.label = source_label(index)
        # position: the next document is self._docs[self.pos] of window self.window
        self.epoch, self.window, self.pos = 0, 0, 0
        self.win_start = {"hf": None, "index": 0}  # streaming: where the current window starts
        self._docs: Optional[List[Doc]] = None
        self._order: Optional[np.ndarray] = None  # map-style: this rank's order for self.epoch
        self._order_epoch = -1
        self._it = None  # streaming: live iterator, positioned at self._it_index
        self._it_index = 0
        self._epoch_docs = 0  # documents produced in this epoch (detects empty sources)
        self.exhausted = False

    # -- state
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "window": self.window, "pos": self.pos,
                "win_start": dict(self.win_start), "epoch_docs": self._epoch_docs,
                "exhausted": self.exhausted}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.window, self.pos = int(state["epoch"]), int(state["window"]), int(state["pos"])
        self.win_start = dict(state["win_start"])
        self._epoch_docs = int(state.get("epoch_docs", 0))
        self.exhausted = bool(state.get("exhausted", False))
        self._docs = None
        self._it = None

    # -- reading one window of raw documents
    def _rank_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            n = len(self.table)
            order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)  # 4 bytes per document
            if self.shuffle:
                np.random.default_rng([self.seed, self.index, self.epoch, 0x5EED]).shuffle(order)
            self._order = order[self.rank :: self.world]
            self._order_epoch = self.epoch
        return self._order

    def _read_raw(self) -> Optional[list]:
        """Raw (text, spans) of window (epoch, window); None when the epoch has no more."""
        if not self.table.streaming:
            order = self._rank_order()
            lo = self.window * self.W
            if lo >= len(order):
                return None
            return self.table.fetch(order[lo : lo + self.W])
        start = self.win_start
        if self._it is None or self._it_index != start["index"]:
            self._it = self.table.open(start["hf"], start["index"])
            self._it_index = start["index"]
        out = []
        for text, spans in self._it:
            j = self._it_index
            self._it_index += 1
            if j % self.world == self.rank:
                out.append((text, spans))
                if len(out) == self.W:
                    break
        self._next_win_start = {"hf": self.table.position(), "index": self._it_index}
        return out or None

    def _process(self, raw: list) -> List[Doc]:
        texts = [t for t, _ in raw]
        toks = self.tok.encode_batch(texts, add_bos=self.add_bos, add_eos=self.add_eos)
        src = self.src
        docs: List[Doc] = []
        reps: List[int] = []
        rng = np.random.default_rng([self.seed, self.index, self.epoch, self.window, self.rank, 0xD0C])
        coins = rng.random(len(raw))
        for k, ((text, spans), ids) in enumerate(zip(raw, toks)):
            n = len(ids)
            if n - int(self.add_bos) - int(self.add_eos) <= 0:
                continue  # empty text
            if n < src.min_tokens or (src.max_tokens is not None and n > src.max_tokens):
                continue
            f = _upsample_factor(src, n)
            r = int(f) + int(coins[k] < f - int(f))
            if r == 0:
                continue
            answer = None
            if self.answer_mask and spans:
                m = self.tok.span_mask(text, spans)
                answer = np.zeros(n, dtype=bool)
                answer[int(self.add_bos) : int(self.add_bos) + len(m)] = m
            docs.append(Doc(ids, answer))
            reps.append(r)
        out = [d for d, r in zip(docs, reps) for _ in range(r)]
        if self.shuffle and len(out) > 1:
            perm = rng.permutation(len(out))
            out = [out[j] for j in perm]
        return out

    def _load_window(self) -> bool:
        """Make self._docs the current window; False at the end of the epoch."""
        self._next_win_start = None
        raw = self._read_raw()
        if raw is None:
            return False
        self._docs = self._process(raw)
        return True

    def _end_epoch(self) -> None:
        if self._epoch_docs == 0:
            rows = self._it_index if self.table.streaming else len(self.table)
            where = self.src.path or self.src.hub_name or "the synthetic corpus"
            if rows == 0:
                raise UserError(f"{self.label}: {where} has no rows (empty dataset)")
            if rows < self.world:
                raise UserError(f"{self.label}: {where} has {rows} documents, "
                                f"fewer than the {self.world} data-parallel ranks")
            raise UserError(
                f"{self.label}: no document of {where} passes min_tokens={self.src.min_tokens}, "
                f"max_tokens={self.src.max_tokens} and the upsample factors (data-parallel rank {self.rank})"
            )
        self.epoch += 1
        self.window, self.pos = 0, 0
        self.win_start = {"hf": None, "index": 0}
        self._epoch_docs = 0
        self._docs = None
        self._it = None
        if self.epochs is not None and self.epoch >= self.epochs:
            self.exhausted = True

    def next_doc(self) -> Optional[Doc]:
        while not self.exhausted:
            if self._docs is None:
                if not self._load_window():
                    self._end_epoch()
                    continue
            if self.pos < len(self._docs):
                doc = self._docs[self.pos]
                self.pos += 1
                self._epoch_docs += 1
                if self.on_doc is not None:
                    self.on_doc(1)
                return doc
            # next window
            if self.table.streaming:
                nxt = getattr(self, "_next_win_start", None)
                if nxt is None:  # (resumed mid-window: the window was re-read just now)
                    nxt = {"hf": self.table.position(), "index": self._it_index}
                self.win_start = nxt
            self.window += 1
            self.pos = 0
            self._docs = None
        return None
