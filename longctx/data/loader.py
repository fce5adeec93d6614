"""The loader the training engine iterates: a weighted mixture of packed sources, sharded
across data-parallel ranks, resumable exactly.

    loader = build_loader(cfg.data, tokenizer, dp_rank=r, dp_size=n, seed=cfg.seed)
    for batch in loader:          # dict of LongTensors (micro_batch_size, seq_len)
        ...                       # input_ids, labels (pre-shifted), position_ids, segment_ids
        ckpt["data"] = loader.state_dict()      # this rank's state, JSON / torch.save-able
    loader.load_state_dict(ckpt["data"])        # next batches == the uninterrupted run's
    loader.load_state_dict(ckpt["data"], restart_sources={1})   # source 1 changed: it starts over

Mixing is per row: row k of rank r comes from source i with probability ∝ weight_i, drawn by
a stateless hash of (seed, r, k), so the mixture needs no RNG state beyond k. Each source
packs its own documents (a row never mixes sources). With `epochs: null` the loader never
ends (sources repeat, reshuffled each epoch); with a number, a source that runs out leaves the
mixture and the loader ends when all have, the last batch completed with padding rows.
"""
from __future__ import annotations

import copy
import queue
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional

from longctx.base.errors import UserError
from longctx.data.cache import CachedRows, open_cache
from longctx.data.config import DataConfig, as_data_config, validate_data_config
from longctx.data.documents import DocFraming, DocumentStream, StreamOrder, uniform
from longctx.data.packers import make_packer
from longctx.data.packing import (
    Row,
    empty_row,
    fold_trailing_padding,
    real_token_mask,
    rows_to_batch,
    trim_unscored_tail,
)
from longctx.data.source_config import SourceConfig, resolve_kind
from longctx.data.sources import open_table
from longctx.data.tokenizer import adds_bos_for

STATE_VERSION = 1


@dataclass(frozen=True)
class ModelInputs:
    """The collate that turns a loader batch into the model's inputs (the trainer's loader):

        input_ids, labels, position_ids      as packed
        real_tokens                          (B,) each row's non-padding tokens (for the metrics)
        token_mask                           (B, T) bool, True on those tokens (padding trails a
                                             row): the MoE load-balancing loss counts only these
        segment_ids                          with document_masking only; a row's unscored tail
                                             folded into the document before it (fold_trailing_padding)
        loss_weights                         1 + (answer_loss_weight - 1) * answer_mask, when
                                             answer tokens are weighted
    then the trailing columns no row scores are dropped, in steps of `trim_multiple` columns
    (trim_unscored_tail). Both rewrites change no loss or gradient (see packing.py).
    """
    document_masking: bool
    answer_loss_weight: float = 1.0
    trim_multiple: int = 1

    def __call__(self, batch: dict) -> dict:
        inputs = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}  # (B, T) each
        inputs["real_tokens"] = batch["real_tokens"]  # (B,)
        inputs["token_mask"] = real_token_mask(batch["real_tokens"], inputs["input_ids"].shape[1])
        if self.document_masking:
            inputs["segment_ids"] = fold_trailing_padding(batch["segment_ids"], batch["labels"])
        w = self.answer_loss_weight
        if w != 1.0 and "answer_mask" in batch:
            inputs["loss_weights"] = 1.0 + (w - 1.0) * batch["answer_mask"].float()  # (B, T) fp32
        return trim_unscored_tail(inputs, self.trim_multiple)


def check_special_tokens(cfg: DataConfig, tokenizer) -> None:
    """UserError when add_bos / add_eos ask for a token the tokenizer does not have."""
    for flag, tid in (("add_bos", tokenizer.bos_id), ("add_eos", tokenizer.eos_id)):
        if getattr(cfg, flag) is True and tid is None:
            raise UserError(f"data.{flag}: tokenizer {tokenizer.name} has no {flag[4:].upper()} token; "
                            f"set data.{flag}=false")


class DataLoader:
    def __init__(self, cfg: DataConfig, tokenizer, *, dp_rank: int = 0, dp_size: int = 1, seed: int = 0,
                 collate: Optional[ModelInputs] = None):
        cfg = as_data_config(cfg)
        validate_data_config(cfg)
        if not (0 <= dp_rank < dp_size):
            raise ValueError(f"dp_rank {dp_rank} is not in [0, {dp_size})")
        check_special_tokens(cfg, tokenizer)
        self.cfg, self.tokenizer = cfg, tokenizer
        self.collate = collate  # applied to every batch (None: batches as packed)
        self.rank, self.world = int(dp_rank), int(dp_size)
        self.seed = int(cfg.seed if cfg.seed is not None else seed)
        self.pad_id = next(t for t in (tokenizer.pad_id, tokenizer.eos_id, 0) if t is not None)
        self.weights = [float(s.weight) for s in cfg.sources]
        self.sources = [self._open_source(s, i) for i, s in enumerate(cfg.sources)]
        self.rows = 0  # rows emitted by this rank (the mixture's counter)
        self.source_rows = [0] * len(self.sources)
        self.source_tokens = [0] * len(self.sources)  # real (non-padding) tokens
        self.finished = False
        self._consumed = self._snapshot()
        self._initial = copy.deepcopy(self._consumed["sources"])  # each source at the start of its order
        self._ahead = False  # sources advanced past what the consumer has seen

    def _open_source(self, src: SourceConfig, i: int):
        cfg = self.cfg
        answer = cfg.emit_answer_mask
        if cfg.cache_dir:
            cache = open_cache(src, i, cfg, self.tokenizer, self.pad_id)
            return CachedRows(cache, i, seed=self.seed, dp_rank=self.rank, dp_size=self.world,
                              shuffle=cfg.shuffle, epochs=cfg.epochs, answer=answer)
        table = open_table(src, i, cfg, self.tokenizer)
        order = StreamOrder(seed=self.seed, dp_rank=self.rank, dp_size=self.world, window=cfg.shuffle_window,
                            shuffle=cfg.shuffle, epochs=cfg.epochs)
        framing = DocFraming(add_bos=adds_bos_for(cfg.add_bos, self.tokenizer), add_eos=cfg.add_eos,
                             answer_mask=answer and resolve_kind(src, i) == "synthetic")
        stream = DocumentStream(table, src, i, self.tokenizer, order, framing)
        return make_packer(stream, cfg.seq_len, mode=src.packing or cfg.packing, lookahead=cfg.fit_lookahead,
                           pad_id=self.pad_id, cross_document_labels=cfg.cross_document_labels,
                           final_partial=cfg.final_partial, answer=answer)

    # ------------------------------------------------------------------ state
    def _snapshot(self) -> dict:
        # fresh dicts all the way down (the sources build new ones; the 🤗 stream state inside
        # is a copy made when it was captured and never mutated), so no deepcopy per batch
        return {
            "version": STATE_VERSION, "dp_rank": self.rank, "dp_size": self.world, "seed": self.seed,
            "seq_len": self.cfg.seq_len, "cached": bool(self.cfg.cache_dir), "rows": self.rows,
            "finished": self.finished, "source_rows": list(self.source_rows),
            "source_tokens": list(self.source_tokens),
            "sources": [s.state_dict() for s in self.sources],
        }

    def state_dict(self) -> dict:
        """Everything needed to continue exactly after the last batch handed out (this rank)."""
        return copy.deepcopy(self._consumed)

    def load_state_dict(self, state: dict, restart_sources: Iterable[int] = ()) -> None:
        """Continue after the batch `state` was taken at. The sources in `restart_sources` (their
        data changed since) start again at the beginning of their seeded order, as in a fresh
        run; the others and the mixture continue exactly."""
        restart = set(restart_sources)
        if state.get("version") != STATE_VERSION:
            raise UserError(f"data loader state: version {state.get('version')} is not {STATE_VERSION}")
        for key, mine in (("dp_size", self.world), ("dp_rank", self.rank), ("seq_len", self.cfg.seq_len),
                          ("seed", self.seed), ("cached", bool(self.cfg.cache_dir))):
            if state[key] != mine:
                raise UserError(
                    f"data loader state: saved with {key}={state[key]} but this run has {key}={mine}; "
                    "resume with the same data config, seed and data-parallel size"
                )
        if len(state["sources"]) != len(self.sources):
            raise UserError(f"data loader state: saved with {len(state['sources'])} sources, "
                            f"this run has {len(self.sources)}")
        bad = sorted(i for i in restart if not (isinstance(i, int) and 0 <= i < len(self.sources)))
        if bad:
            raise ValueError(f"restart_sources: {bad} are not source indices (0..{len(self.sources) - 1})")
        consumed = copy.deepcopy(state)
        for i in restart:
            consumed["sources"][i] = copy.deepcopy(self._initial[i])
        if restart:
            consumed["finished"] = False
        for s, st in zip(self.sources, consumed["sources"]):
            s.load_state_dict(copy.deepcopy(st))
        self.rows, self.finished = int(consumed["rows"]), bool(consumed["finished"])
        self.source_rows = list(consumed["source_rows"])
        self.source_tokens = list(consumed["source_tokens"])
        self._consumed = consumed
        self._ahead = False

    # ------------------------------------------------------------------ rows and batches
    def _pick(self, k: int, attempt: int, live: List[int]) -> int:
        total = sum(self.weights[i] for i in live)
        u = uniform(self.seed, self.rank, k, attempt) * total
        acc = 0.0
        for i in live:
            acc += self.weights[i]
            if u < acc:
                return i
        return live[-1]

    def next_row(self):
        """(source index, Row) of the next row of this rank, or None when all sources ended."""
        attempt = 0
        while True:
            live = [i for i, s in enumerate(self.sources) if self.weights[i] > 0 and not s.done]
            if not live:
                self.finished = True
                return None
            i = self._pick(self.rows, attempt, live)
            row = self.sources[i].next_row()
            if row is None:  # that source ended (finite epochs): draw again among the others
                attempt += 1
                continue
            self.rows += 1
            self.source_rows[i] += 1
            self.source_tokens[i] += row.n_real
            return i, row

    def _produce(self) -> Iterator[tuple]:
        """(batch, state after it) pairs; advances the sources."""
        B = self.cfg.micro_batch_size
        while not self.finished:
            rows: List[Row] = []
            while len(rows) < B:
                got = self.next_row()
                if got is None:
                    break
                rows.append(got[1])
            if not rows:
                return
            while len(rows) < B:  # last batch of a finite run: complete it with padding rows
                rows.append(empty_row(self.cfg.seq_len, self.pad_id, self.cfg.emit_answer_mask))
            batch = rows_to_batch(rows, document_masking=self.cfg.document_masking,
                                  answer_mask=self.cfg.emit_answer_mask)
            if self.collate is not None:
                batch = self.collate(batch)
            yield batch, self._snapshot()

    def __iter__(self) -> Iterator[dict]:
        """Batches from the last one handed out on. One live iterator at a time: starting a
        new one stops the previous (which then raises if used)."""
        self._generation = getattr(self, "_generation", 0) + 1
        me = self._generation
        self._halt_producer()
        if self._ahead:
            self.load_state_dict(self._consumed)
        if self.cfg.prefetch <= 0:
            for batch, state in self._produce():
                self._consumed = state
                yield batch
                if self._generation != me:
                    raise RuntimeError("this data loader iterator was replaced by a newer iter(loader)")
            return
        yield from self._iter_prefetch(me)

    def _halt_producer(self) -> None:
        active = getattr(self, "_producer", None)
        if active is not None:
            stop, thread = active
            stop.set()
            thread.join()
            self._producer = None

    def _iter_prefetch(self, me: int) -> Iterator[dict]:
        q: "queue.Queue" = queue.Queue(maxsize=self.cfg.prefetch)
        stop = threading.Event()
        END = object()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work():
            try:
                for item in self._produce():
                    if not put(item):
                        return
                put(END)
            except BaseException as e:  # re-raised in the consumer
                put(e)

        self._ahead = True
        thread = threading.Thread(target=work, name="longctx-data", daemon=True)
        self._producer = (stop, thread)
        thread.start()
        try:
            while True:
                if self._generation != me:
                    raise RuntimeError("this data loader iterator was replaced by a newer iter(loader)")
                item = q.get()
                if item is END:
                    self._ahead = False
                    break
                if isinstance(item, BaseException):
                    raise item
                batch, self._consumed = item
                yield batch
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(0.05)
            if self._generation == me:
                self._producer = None
        # the producer may have run ahead; __iter__ restores self._consumed on the next call


def build_loader(cfg: DataConfig, tokenizer, *, dp_rank: int, dp_size: int, seed: int,
                 collate: Optional[ModelInputs] = None) -> DataLoader:
    """The training engine's loader for data-parallel rank `dp_rank` of `dp_size`.

    `seed` is the training seed; `cfg.seed`, when set, overrides it for the data. `collate`
    (the trainer's ModelInputs) rewrites every batch into the model's inputs."""
    return DataLoader(cfg, tokenizer, dp_rank=dp_rank, dp_size=dp_size, seed=seed, collate=collate)
