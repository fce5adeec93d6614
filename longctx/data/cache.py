"""Pre-tokenized, pre-packed cache: one directory of memory-mapped arrays per source.

    <cache_dir>/<source name>-<key>/
        meta.json            what was built from what (the key's inputs), row count, stats
        input_ids.bin        (n_rows, seq_len) uint16 (vocab <= 65536) or uint32
        labels.bin           (n_rows, seq_len) int32, pre-shifted, -100 ignored
        position_ids.bin     (n_rows, seq_len) uint16 (seq_len <= 65536) or int32
        answer.bin           (n_rows, seq_len) uint8   (synthetic sources only)
        n_real.bin           (n_rows,) int32           real (non-padding) tokens per row

The key is a hash of everything that changes the rows: the source config, the files' paths,
sizes and SHA-256 (fingerprint.py: an edit that keeps size and modification time is a new key),
the tokenizer's fingerprint, seq_len, BOS/EOS, packing policy and
cross-document labels. The rows are built once (one epoch of the source, documents in a fixed
seeded order; whoever takes the lock builds while the other processes wait, and a lock whose
holder died is taken over at once: longctx/storage/locks.py), showing its progress
(longctx/reporting/progress.py); each epoch then visits the rows in a fresh seeded order, sharded across
data-parallel ranks.
Segment ids are derived from the position ids, so `document_masking` needs no rebuild.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from longctx.base.errors import UserError
from longctx.data.config import DataConfig
from longctx.data.documents import DocFraming, DocumentStream, StreamOrder
from longctx.data.fingerprint import fingerprint_source
from longctx.data.packers import make_packer
from longctx.data.packing import Row, segment_ids_from_position_ids
from longctx.data.source_config import SourceConfig, resolve_kind, source_label
from longctx.data.sources import open_table
from longctx.data.tokenizer import adds_bos_for, tokenizer_fingerprint
from longctx.reporting.progress import Progress
from longctx.storage import atomic
from longctx.storage.locks import is_alive, liveness_lock, read_holder

CACHE_VERSION = 1
BUILD_SEED = 0  # document order inside the cache; the training seed only orders rows


def _files_fingerprint(src: SourceConfig, i: int) -> list:
    """[path, size, sha256] of every file the source reads (fingerprint.py)."""
    return [[f["path"], f["size"], f["sha256"]] for f in fingerprint_source(src, i).get("files", ())]


def cache_description(src: SourceConfig, i: int, cfg: DataConfig, tokenizer) -> dict:
    return {
        "version": CACHE_VERSION,
        "source": dataclasses.asdict(src) | {"weight": None, "streaming": None, "name": None},
        "kind": resolve_kind(src, i),
        "files": _files_fingerprint(src, i),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seq_len": cfg.seq_len,
        "add_bos": adds_bos_for(cfg.add_bos, tokenizer),
        "add_eos": cfg.add_eos,
        "packing": src.packing or cfg.packing,
        "fit_lookahead": cfg.fit_lookahead if (src.packing or cfg.packing) == "fit" else None,
        "final_partial": cfg.final_partial,
        "cross_document_labels": cfg.cross_document_labels,
        "shuffle": cfg.shuffle,
        "shuffle_window": cfg.shuffle_window,
    }


def cache_key(desc: dict) -> str:
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40] or "source"


class PackedCache:
    """The memory-mapped rows of one built cache directory."""

    def __init__(self, directory: str):
        self.dir = directory
        with open(os.path.join(directory, "meta.json"), encoding="utf-8") as f:
            self.meta = json.load(f)
        n, T = self.meta["n_rows"], self.meta["seq_len"]
        self.n_rows, self.seq_len = n, T

        def mm(name, dtype, shape):
            if n == 0:
                return np.zeros(shape, dtype=dtype)
            return np.memmap(os.path.join(directory, name), dtype=dtype, mode="r", shape=shape)

        self.input_ids = mm("input_ids.bin", self.meta["ids_dtype"], (n, T))
        self.labels = mm("labels.bin", np.int32, (n, T))
        self.position_ids = mm("position_ids.bin", self.meta["pos_dtype"], (n, T))
        self.answer = mm("answer.bin", np.uint8, (n, T)) if self.meta["has_answer"] else None
        self.n_real = mm("n_real.bin", np.int32, (n,))

    def row(self, j: int, with_answer: bool) -> Row:
        pos = np.asarray(self.position_ids[j], dtype=np.int32)
        ans = None
        if with_answer:
            ans = (np.asarray(self.answer[j]) != 0) if self.answer is not None else np.zeros(self.seq_len, bool)
        return Row(np.asarray(self.input_ids[j], dtype=np.int32), np.asarray(self.labels[j], dtype=np.int32),
                   pos, segment_ids_from_position_ids(pos), ans, int(self.n_real[j]))


def _write_rows(packer, directory: str, has_answer: bool, ids_dtype: str, pos_dtype: str):
    """Every row of `packer` appended to one .bin file per column; (rows, real tokens)."""
    names = ["input_ids", "labels", "position_ids", "n_real"] + (["answer"] if has_answer else [])
    files = {k: open(os.path.join(directory, f"{k}.bin"), "wb") for k in names}
    n_rows = n_real = 0
    buf = {k: [] for k in names}

    def flush():
        for k in names:
            if buf[k]:
                files[k].write(np.stack(buf[k]).tobytes() if k != "n_real" else np.asarray(buf[k], np.int32).tobytes())
                buf[k].clear()

    try:
        while True:
            row = packer.next_row()
            if row is None:
                break
            buf["input_ids"].append(row.input_ids.astype(ids_dtype))
            buf["labels"].append(row.labels)
            buf["position_ids"].append(row.position_ids.astype(pos_dtype))
            buf["n_real"].append(row.n_real)
            if has_answer:
                buf["answer"].append(row.answer.astype(np.uint8))
            n_rows += 1
            n_real += row.n_real
            if len(buf["labels"]) >= 1024:
                flush()
        flush()
    finally:
        for f in files.values():
            f.close()
    return n_rows, n_real


def _build(directory: str, src: SourceConfig, i: int, cfg: DataConfig, tokenizer, desc: dict, pad_id: int) -> None:
    table = open_table(src, i, cfg, tokenizer)
    has_answer = resolve_kind(src, i) == "synthetic"
    T = cfg.seq_len
    ids_dtype = "uint16" if tokenizer.vocab_size <= 65536 and pad_id < 65536 else "uint32"
    pos_dtype = "uint16" if T <= 65536 else "int32"
    total = None if table.streaming else len(table)
    bar = Progress(total, f"caching {src.name or source_label(i)}", "doc", enabled=cfg.progress)
    n_docs = [0]

    def on_doc(k):
        n_docs[0] += k
        bar.update(k)

    order = StreamOrder(seed=BUILD_SEED, dp_rank=0, dp_size=1, window=cfg.shuffle_window, shuffle=cfg.shuffle,
                        epochs=1)
    framing = DocFraming(add_bos=adds_bos_for(cfg.add_bos, tokenizer), add_eos=cfg.add_eos, answer_mask=has_answer)
    stream = DocumentStream(table, src, i, tokenizer, order, framing, on_doc=on_doc)
    packer = make_packer(stream, T, mode=src.packing or cfg.packing, lookahead=cfg.fit_lookahead, pad_id=pad_id,
                         cross_document_labels=cfg.cross_document_labels, final_partial=cfg.final_partial,
                         answer=has_answer)
    try:
        n_rows, n_real = _write_rows(packer, directory, has_answer, ids_dtype, pos_dtype)
    finally:
        bar.close()
    if n_rows == 0:
        raise UserError(f"{source_label(i)}: no rows to cache (no document passes the filters)")
    meta = {
        "key": cache_key(desc), "description": desc, "n_rows": n_rows, "seq_len": T,
        "ids_dtype": ids_dtype, "pos_dtype": pos_dtype, "has_answer": has_answer,
        "n_docs": n_docs[0], "n_real_tokens": int(n_real),
        "fill": n_real / (n_rows * T), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with open(os.path.join(directory, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, default=str)


def _note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr, flush=True)


def _wait_for_remote_builder(lock: Path, done: str, wait_s: float) -> None:
    """Wait at most `wait_s` for a builder on another host (whose liveness cannot be checked from
    here) to finish; a holder on this host is left to liveness_lock (waited for while it lives)."""
    deadline, named = time.monotonic() + wait_s, False
    while not os.path.exists(done):
        holder = read_holder(lock)
        if holder is None or is_alive(holder) is not None:
            return
        if time.monotonic() > deadline:
            raise UserError(f"data.cache_dir: waited {wait_s:.0f}s (data.cache_wait_s) for the cache build by "
                            f"{holder.describe()}; if that host's job is gone, remove {lock}")
        if not named:
            _note(f"waiting for the cache build by {holder.describe()} (at most {wait_s:.0f}s, data.cache_wait_s); "
                  f"if {holder.host} is gone, remove {lock}")
            named = True
        time.sleep(0.5)


def open_cache(src: SourceConfig, i: int, cfg: DataConfig, tokenizer, pad_id: int) -> PackedCache:
    """Load the cache of source i, building it first if no process has (one builder at a time:
    a live builder is waited for, a dead one's lock and temporary directory are taken over)."""
    desc = cache_description(src, i, cfg, tokenizer)
    final = cache_path(src, i, cfg, tokenizer)
    root = os.path.dirname(final)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise UserError(f"data.cache_dir: cannot create {cfg.cache_dir} ({e.strerror})") from None
    done = os.path.join(final, "meta.json")
    lock = Path(final + ".lock")
    _wait_for_remote_builder(lock, done, cfg.cache_wait_s)
    if not os.path.exists(done):
        with liveness_lock(lock, what=f"the cache build of {final}", notify=_note):
            if not os.path.exists(done):
                atomic.remove_stale(Path(root), _note, name=os.path.basename(final))
                tmp = atomic.make_temp_dir(final)
                try:
                    _build(str(tmp), src, i, cfg, tokenizer, desc, pad_id)
                    shutil.rmtree(final, ignore_errors=True)  # an incomplete one (no meta.json)
                    os.rename(tmp, final)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    return PackedCache(final)


def cache_path(src: SourceConfig, i: int, cfg: DataConfig, tokenizer) -> str:
    """The directory holding source i's cache (built or not)."""
    key = cache_key(cache_description(src, i, cfg, tokenizer))
    return os.path.join(os.path.expanduser(cfg.cache_dir), f"{_safe(src.name or f'source{i}')}-{key}")


class CachedRows:
    """Rank-local iteration over a PackedCache: each epoch a seeded permutation of the rows,
    rank r taking positions r, r+dp, ...; state = (epoch, cursor)."""

    def __init__(self, cache: PackedCache, index: int, *, seed: int, dp_rank: int, dp_size: int,
                 shuffle: bool, epochs: Optional[int], answer: bool):
        self.cache, self.index = cache, index
        self.seed, self.rank, self.world = int(seed), int(dp_rank), int(dp_size)
        self.shuffle, self.epochs, self.answer = shuffle, epochs, answer
        self.epoch = self.cursor = 0
        self.done = False
        self._order_epoch, self._order = -1, None
        if cache.n_rows < dp_size:
            raise UserError(
                f"{source_label(index)}: the cache has {cache.n_rows} rows, "
                f"fewer than the {dp_size} data-parallel ranks"
            )

    def _rank_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            n = self.cache.n_rows
            order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
            if self.shuffle:
                np.random.default_rng([self.seed, self.index, self.epoch, 0xCAC4E]).shuffle(order)
            self._order, self._order_epoch = order[self.rank :: self.world], self.epoch
        return self._order

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "done": self.done,
                "cache": os.path.basename(self.cache.dir)}

    def load_state_dict(self, state: dict) -> None:
        if "cursor" not in state:
            raise UserError("data loader state was saved without data.cache_dir; resume with the same data config")
        mine = os.path.basename(self.cache.dir)
        if state.get("cache", mine) != mine:
            raise UserError(
                f"{source_label(self.index)}: the checkpoint's data came from cache {state['cache']} but this run "
                f"uses {mine} (the data, tokenizer or packing changed); resume with the same data"
            )
        self.epoch, self.cursor, self.done = int(state["epoch"]), int(state["cursor"]), bool(state["done"])

    def next_row(self) -> Optional[Row]:
        while not self.done:
            order = self._rank_order()
            if self.cursor < len(order):
                j = int(order[self.cursor])
                self.cursor += 1
                return self.cache.row(j, self.answer)
            self.epoch += 1
            self.cursor = 0
            if self.epochs is not None and self.epoch >= self.epochs:
                self.done = True
        return None
