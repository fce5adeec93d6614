"""Sources: open a 🤗 dataset (or the synthetic corpus) as a table of documents.

    table = open_table(src, i, data_cfg, tokenizer)   # MapTable (random access) | StreamTable

A MapTable fetches (text, answer spans | None) by index (a 🤗 `Dataset`, memory-mapped Arrow,
or the synthetic corpus); a StreamTable iterates a 🤗 `IterableDataset` and reports its
resumable position. documents.py walks a table per rank and epoch.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Callable, List, Optional, Sequence, Tuple

from longctx.base.errors import UserError
from longctx.data.config import DataConfig
from longctx.data.fingerprint import content_key, source_files
from longctx.data.peek import list_files
from longctx.data.rowscan import first_bad_row, first_non_text
from longctx.data.source_config import EXT_TO_KIND, SourceConfig, has_glob, resolve_kind, source_label
from longctx.data.synthetic import SyntheticCorpus
from longctx.data.tokenizer import adds_bos_for

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

    def __init__(self, make_dataset: Callable[[], object], text_field: str, label: str,
                 explain: Optional[Callable[[Exception], UserError]] = None):
        self._make = make_dataset
        self.text_field = text_field
        self.label = label
        self._explain = explain  # a read error -> one line naming the file and row
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
        while True:
            try:
                row = next(it, None)
                if row is None:
                    return
                if not checked:
                    if field not in row:
                        raise UserError(
                            f"{self.label}.text_field: {field!r} is not a column of {self.label}; "
                            f"available: {', '.join(map(str, row.keys()))}"
                        )
                    checked = True
                text = row[field]
                if text is not None and not isinstance(text, str):
                    raise NotText(f"{self.label}.text_field: {field!r} holds {type(text).__name__}, not text")
            except Exception as e:  # noqa: BLE001 - 🤗 / Arrow / codec errors name neither file nor row
                raise (self._explain(e) if self._explain is not None else e) from None
            yield text or "", None

    def position(self) -> Optional[dict]:
        if self._ds is not None and hasattr(self._ds, "state_dict"):
            return self._ds.state_dict()
        return None


class NotText(Exception):
    """A row's text field holds no text (explained by file and row where a scan finds it)."""


def _text_of(value, label: str, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise UserError(f"{label}.text_field: {field!r} holds {type(value).__name__}, not text")


def _data_files(src: SourceConfig, i: int, kind: str) -> List[str]:
    path = os.path.expanduser(src.path)
    if not has_glob(path) and not os.path.exists(path):
        raise UserError(f"{source_label(i)}.path: {src.path} does not exist")
    files = list_files(path, kind)
    if not files:
        raise UserError(f"{source_label(i)}.path: no {kind} file found at {src.path}")
    return files


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of a chain (🤗's DatasetGenerationError wraps the real one)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc = inner
    return exc


def _load_error(i: int, what: str, exc: Exception) -> UserError:
    if isinstance(exc, UserError):
        return exc
    exc = _root_cause(exc)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"{source_label(i)}: cannot load {what} ({type(exc).__name__}: {msg})")


def _scan_kind(path: str, kind: str) -> Optional[str]:
    if kind != "dir":
        return kind
    lower = path.lower()
    return next((k for ext, k in EXT_TO_KIND.items() if lower.endswith(ext)), None)


def bad_row(src: SourceConfig, i: int) -> Optional[UserError]:
    """The error naming the file and row of the first record of source i that is not text."""
    kind = resolve_kind(src, i)
    for path, _ in source_files(src, i):
        found = first_bad_row([path], _scan_kind(path, kind) or "", src.text_field)
        if found:
            return UserError(f"{source_label(i)}{'.text_field' if found.about_field else ''}: {found}")
    return None


def explain_failure(src: SourceConfig, i: int, exc: Exception) -> UserError:
    """One line for a source that failed to load or read: the file and row when a scan finds it,
    else the innermost cause."""
    if isinstance(exc, UserError):
        return exc
    found = bad_row(src, i) if src.path else None
    if found:
        return found
    if isinstance(exc, NotText):
        return UserError(str(exc))
    return _load_error(i, src.hub_name if resolve_kind(src, i) == "hub" else src.path, exc)


def _content_cache_dir(src: SourceConfig, i: int, hf_cache_dir: Optional[str]) -> str:
    """🤗's cache for a local source, one directory per content: 🤗 keys its own cache by the
    files' paths and modification times, so an edit that keeps those would read stale rows."""
    import datasets  # heavy, see _no_download_count

    root = os.path.expanduser(hf_cache_dir) if hf_cache_dir else datasets.config.HF_DATASETS_CACHE
    return os.path.join(str(root), "longctx-content", content_key(src, i))


@contextlib.contextmanager
def _no_download_count():
    """`load_dataset("json", data_files=local)` pings the hub to count a download of the
    packaged builder (a DNS timeout on an offline cluster, for local files). Local
    sources skip that telemetry call; hub sources keep 🤗's behaviour."""
    import datasets  # slow to import: only runs that read a 🤗 source pay for it

    old = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = old


@contextlib.contextmanager
def _builder_errors_unlogged():
    """🤗's JSON builder logs `Failed to load JSON from file ...` before it raises; the raise
    becomes our one line naming the row, so that log line would be a second, vaguer one."""
    logger = logging.getLogger("datasets.packaged_modules.json.json")
    old = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = old


def _hf_dataset(src: SourceConfig, i: int, kind: str, streaming: bool, hf_cache_dir: Optional[str]):
    """The 🤗 Dataset / IterableDataset behind a non-synthetic source."""
    import datasets  # heavy, see _no_download_count

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
    if not streaming:  # streaming reads the files themselves, no cache
        kw = {"cache_dir": _content_cache_dir(src, i, hf_cache_dir)}
    if kind == "dir":
        try:
            with _no_download_count():
                return datasets.load_dataset(path, split=src.split, streaming=streaming, **kw)
        except Exception as e:
            raise explain_failure(src, i, e) from None
    files = _data_files(src, i, kind)
    extra = {"sample_by": src.sample_by} if kind == "text" else {}
    try:
        with _no_download_count(), _builder_errors_unlogged():
            return datasets.load_dataset(kind, data_files=files, split="train", streaming=streaming, **extra, **kw)
    except Exception as e:
        raise explain_failure(src, i, e) from None


def check_text_column(ds, src: SourceConfig, i: int) -> None:
    """UserError naming the file and row unless source i's text column holds valid UTF-8 text
    (Arrow keeps invalid UTF-8 of a JSON file as is, and a column of numbers or mixed values
    loads too; both would fail only when the row is drawn)."""
    import pyarrow as pa  # loaded with datasets already

    label, field = source_label(i), src.text_field
    column = ds.data.column(field)
    where = src.path or src.hub_name
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        try:
            column.validate(full=True)  # UTF-8 of every value, at memory speed
            return
        except pa.ArrowInvalid as e:
            fallback = UserError(f"{label}: {where}: {field!r} is not valid UTF-8 ({str(e).splitlines()[0]})")
    else:
        found = first_non_text(ds.data, field)
        fallback = UserError(f"{label}.text_field: {where}: {field!r} holds {column.type}, not text"
                             if found is None
                             else f"{label}.text_field: {where} row {found[0] + 1}: "
                                  f"{field!r} holds {found[1]}, not text")
    raise (bad_row(src, i) if src.path else None) or fallback


def open_table(src: SourceConfig, i: int, cfg: DataConfig, tokenizer):
    """The MapTable / StreamTable of source `i`; checks it is non-empty and has text_field."""
    label = source_label(i)
    kind = resolve_kind(src, i)
    if kind == "synthetic":
        corpus = SyntheticCorpus(src.synthetic, seq_len=cfg.seq_len, tokenizer=tokenizer,
                                 add_bos=adds_bos_for(cfg.add_bos, tokenizer), add_eos=cfg.add_eos)

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
            raise UserError(f"{label}.text_field: {src.text_field!r} is not a column of {where}; "
                            f"available: {', '.join(cols)}")
        made = [first]

        def make():
            return made.pop() if made else _hf_dataset(src, i, kind, True, cfg.hf_cache_dir)

        return StreamTable(make, src.text_field, label, explain=lambda e: explain_failure(src, i, e))
    ds = _hf_dataset(src, i, kind, False, cfg.hf_cache_dir)
    if len(ds) == 0:
        raise UserError(f"{label}: {where} has no rows (empty dataset)")
    if src.text_field not in ds.column_names:
        raise UserError(
            f"{label}.text_field: {src.text_field!r} is not a column of {where}; "
            f"available: {', '.join(ds.column_names)}"
        )
    check_text_column(ds, src, i)
    col = ds.select_columns([src.text_field])
    field = src.text_field

    def fetch_hf(indices):
        rows = col[list(map(int, indices))][field]  # one Arrow take for the batch
        return [(_text_of(t, label, field), None) for t in rows]

    return MapTable(fetch_hf, len(ds), label)
