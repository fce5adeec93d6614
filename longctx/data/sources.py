"""Sources: open a 🤗 dataset (or the synthetic corpus) and turn it into a rank-local,
resumable stream of tokenized documents.

    table  = open_table(src, i, data_cfg, tokenizer)     # MapTable | StreamTable
    stream = DocumentStream(table, ...)                  # .next_doc() -> Doc | None

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

import contextlib
import glob
import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from longctx.data.config import DataConfig, SourceConfig, has_glob, resolve_kind, source_label
from longctx.errors import UserError

KIND_EXTS = {
    "json": (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst"),
    "parquet": (".parquet",),
    "text": (".txt", ".txt.gz", ".md"),
    "arrow": (".arrow",),
    "csv": (".csv", ".csv.gz"),
}


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


# ----------------------------------------------------------------------------- tables


class MapTable:
    """Random access to (text, answer spans | None) by index."""

    streaming = False

    def __init__(self, fetch: Callable[[Sequence[int]], List[Tuple[str, Optional[list]]]], length: int, label: str):
        self._fetch = fetch
        self.length = length
        self.label = label

    def __len__(self) -> int:
        return self.length

    def fetch(self, indices: Sequence[int]) -> List[Tuple[str, Optional[list]]]:
        return self._fetch(indices)


class StreamTable:
    """Sequential access: `open(state)` → iterator of (text, spans); `position()` is the
    🤗 state after the last item the iterator yielded (None when not resumable that way)."""

    streaming = True

    def __init__(self, make_dataset: Callable[[], object], text_field: str, label: str):
        self._make = make_dataset
        self.text_field = text_field
        self.label = label
        self._ds = None
        self.length = None

    def open(self, hf_state: Optional[dict], skip: int):
        ds = self._make()
        self._ds = ds
        resumable = hf_state is not None and hasattr(ds, "load_state_dict")
        if resumable:
            ds.load_state_dict(hf_state)
        it = iter(ds)
        if not resumable:
            for _ in range(skip):
                next(it, None)
        field = self.text_field
        checked = False
        for row in it:
            if not checked:
                if field not in row:
                    raise UserError(
                        f"{self.label}.text_field: {field!r} is not a column of {self.label}; "
                        f"available: {', '.join(map(str, row.keys()))}"
                    )
                checked = True
            yield _text_of(row[field], self.label, field), None

    def position(self) -> Optional[dict]:
        if self._ds is not None and hasattr(self._ds, "state_dict"):
            return self._ds.state_dict()
        return None


def _text_of(value, label: str, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise UserError(f"{label}.text_field: {field!r} holds {type(value).__name__}, not text")


def _data_files(src: SourceConfig, i: int, kind: str) -> List[str]:
    path = os.path.expanduser(src.path)
    if has_glob(path):
        files = sorted(glob.glob(path, recursive=True))
    elif os.path.isdir(path):
        exts = KIND_EXTS.get(kind, ())
        files = sorted(
            os.path.join(root, f) for root, _, names in os.walk(path) for f in names if f.lower().endswith(exts)
        )
    elif os.path.exists(path):
        files = [path]
    else:
        raise UserError(f"{source_label(i)}.path: {src.path} does not exist")
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        raise UserError(f"{source_label(i)}.path: no {kind} file found at {src.path}")
    return files


def _load_error(i: int, what: str, exc: Exception) -> UserError:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"{source_label(i)}: cannot load {what} ({type(exc).__name__}: {msg})")


@contextlib.contextmanager
def _no_download_count():
    """`load_dataset("json", data_files=local)` pings the hub to count a download of the
    packaged builder (a 3-5 s DNS timeout on an offline cluster, for local files). Local
    sources skip that telemetry call; hub sources keep 🤗's behaviour."""
    import datasets

    old = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = old


def _hf_dataset(src: SourceConfig, i: int, kind: str, streaming: bool, hf_cache_dir: Optional[str]):
    """The 🤗 Dataset / IterableDataset behind a non-synthetic source."""
    import datasets

    kw = {"cache_dir": hf_cache_dir} if hf_cache_dir else {}
    if kind == "hub":
        what = f"hub dataset {src.hub_name!r}"
        try:
            return datasets.load_dataset(src.hub_name, src.hub_config, split=src.split, streaming=streaming, **kw)
        except Exception as e:  # offline, unknown name, bad split ...
            raise _load_error(i, what, e) from None
    path = os.path.expanduser(src.path)
    if kind == "disk":
        try:
            ds = datasets.load_from_disk(path)
        except Exception as e:
            raise _load_error(i, path, e) from None
        if isinstance(ds, datasets.DatasetDict):
            if src.split not in ds:
                raise UserError(f"{source_label(i)}.split: {src.split!r} not in {path}; available: {', '.join(ds)}")
            ds = ds[src.split]
        return ds.to_iterable_dataset(num_shards=min(64, max(1, len(ds)))) if streaming else ds
    if kind == "dir":
        try:
            with _no_download_count():
                return datasets.load_dataset(path, split=src.split, streaming=streaming, **kw)
        except Exception as e:
            raise _load_error(i, path, e) from None
    files = _data_files(src, i, kind)
    extra = {"sample_by": src.sample_by} if kind == "text" else {}
    try:
        with _no_download_count():
            return datasets.load_dataset(kind, data_files=files, split="train", streaming=streaming, **extra, **kw)
    except Exception as e:
        raise _load_error(i, src.path, e) from None


def open_table(src: SourceConfig, i: int, cfg: DataConfig, tokenizer):
    """The MapTable / StreamTable of source `i`; checks it is non-empty and has text_field."""
    label = source_label(i)
    kind = resolve_kind(src, i)
    if kind == "synthetic":
        from longctx.data.synthetic import SyntheticCorpus

        corpus = SyntheticCorpus(src.synthetic, seq_len=cfg.seq_len, tokenizer=tokenizer,
                                 add_bos=cfg.add_bos, add_eos=cfg.add_eos)

        def fetch_synthetic(indices):
            docs = [corpus[int(j)] for j in indices]
            return [(d.text, d.answer_spans) for d in docs]

        return MapTable(fetch_synthetic, len(corpus), label)
    streaming = cfg.streaming if src.streaming is None else src.streaming
    where = src.hub_name if kind == "hub" else src.path
    if streaming:
        first = _hf_dataset(src, i, kind, True, cfg.hf_cache_dir)  # fail fast on bad paths
        cols = getattr(first, "column_names", None)
        if cols is not None and src.text_field not in cols:
            raise UserError(f"{label}.text_field: {src.text_field!r} is not a column of {where}; available: {', '.join(cols)}")
        made = [first]

        def make():
            return made.pop() if made else _hf_dataset(src, i, kind, True, cfg.hf_cache_dir)

        return StreamTable(make, src.text_field, label)
    ds = _hf_dataset(src, i, kind, False, cfg.hf_cache_dir)
    if len(ds) == 0:
        raise UserError(f"{label}: {where} has no rows (empty dataset)")
    if src.text_field not in ds.column_names:
        raise UserError(
            f"{label}.text_field: {src.text_field!r} is not a column of {where}; available: {', '.join(ds.column_names)}"
        )
    col = ds.select_columns([src.text_field])
    field = src.text_field

    def fetch_hf(indices):
        rows = col[list(map(int, indices))][field]  # one Arrow take for the batch
        return [(_text_of(t, label, field), None) for t in rows]

    return MapTable(fetch_hf, len(ds), label)


# ----------------------------------------------------------------------------- documents


def _upsample_factor(src: SourceConfig, n_tokens: int) -> float:
    for b in src.upsample:
        if n_tokens >= b.min_tokens and (b.max_tokens is None or n_tokens < b.max_tokens):
            return float(b.factor)
    return 1.0


class DocumentStream:
    """Rank-local stream of tokenized documents of one source, resumable exactly."""

    def __init__(self, table, src: SourceConfig, index: int, tokenizer, *, seed: int, dp_rank: int,
                 dp_size: int, window: int, shuffle: bool, epochs: Optional[int], add_bos: bool,
                 add_eos: bool, answer_mask: bool, on_doc: Optional[Callable[[int], None]] = None):
        self.table, self.src, self.index, self.tok = table, src, index, tokenizer
        self.seed, self.rank, self.world = int(seed), int(dp_rank), int(dp_size)
        self.W, self.shuffle, self.epochs = int(window), bool(shuffle), epochs
        self.add_bos, self.add_eos, self.answer_mask = add_bos, add_eos, answer_mask
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
                raise UserError(f"{self.label}: {where} has {rows} documents, fewer than the {self.world} data-parallel ranks")
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
