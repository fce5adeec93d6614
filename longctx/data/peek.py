"""A look at the first record of a file source, before any work: the file is non-empty, its first
record parses, and it has the source's text field. Only the first line (jsonl, csv), the footer
(parquet) or the schema (arrow) is read, never a whole file; the loader checks the rest.

    peek_source(src, i)   # UserError naming data.sources[i] and the file
"""
from __future__ import annotations

import csv
import glob
import gzip
import json
import os
from typing import List, Optional

from longctx.base.errors import UserError

KIND_EXTS = {
    "json": (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst"),
    "parquet": (".parquet",),
    "text": (".txt", ".txt.gz", ".md"),
    "arrow": (".arrow",),
    "csv": (".csv", ".csv.gz"),
}
MAX_FIRST_LINE = 64 * 2**20  # a first record longer than this is not parsed here (the loader will)


def list_files(path: str, kind: str) -> List[str]:
    """The files of a source path (a file, a glob or a directory walked for `kind`'s extensions)."""
    path = os.path.expanduser(path)
    if any(c in path for c in "*?["):
        files = sorted(glob.glob(path, recursive=True))
    elif os.path.isdir(path):
        exts = KIND_EXTS.get(kind, ())
        files = sorted(os.path.join(root, f) for root, _, names in os.walk(path) for f in names
                       if f.lower().endswith(exts))
    else:
        files = [path] if os.path.exists(path) else []
    return [f for f in files if os.path.isfile(f)]


def peek_files(files: List[str], kind: str, text_field: str, label: str, where: str) -> None:
    """Check the first non-empty file of a source; all files empty is an error too."""
    if kind not in KIND_EXTS:
        return
    if not files:
        raise UserError(f"{label}.path: no {kind} file found at {where}")
    nonempty = [f for f in files if os.path.getsize(f) > 0]
    if not nonempty:
        what = files[0] if len(files) == 1 else f"all {len(files)} files at {where}"
        raise UserError(f"{label}.path: {what} is empty (no records)")
    PEEKERS[kind](nonempty[0], text_field, label)


def _open_bytes(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _first_line(path: str, label: str) -> Optional[str]:
    """The first non-blank line (None: only blank lines); a read error names the file (and the
    line, for bytes that are not UTF-8)."""
    try:
        with _open_bytes(path) as f:
            for lineno, raw in enumerate(f, 1):
                if raw.strip():
                    try:
                        return raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise UserError(f"{label}: {path} line {lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} "
                                        f"at column {e.start + 1})") from None
                # blank lines before the first record are skipped
    except (OSError, EOFError) as e:
        raise UserError(f"{label}.path: cannot read {path} ({type(e).__name__}: {e})") from None
    return None


def _peek_json(path: str, text_field: str, label: str) -> None:
    if path.endswith(".zst"):
        return  # needs a codec; the loader reads it
    line = _first_line(path, label)
    if line is None:
        raise UserError(f"{label}.path: {path} is empty (no records)")
    if len(line) > MAX_FIRST_LINE:
        return
    stripped = line.strip()
    try:
        record = json.loads(stripped)
    except json.JSONDecodeError as e:
        if not path.endswith((".jsonl", ".jsonl.gz")) and stripped[:1] in "[{":
            return  # a JSON document spread over lines (a .json array or object): the loader parses it
        raise UserError(f"{label}.path: {path}: the first record is not valid JSON ({e.msg} at character "
                        f"{e.pos + 1}); expected JSON lines, one object per line") from None
    if isinstance(record, list) and not path.endswith((".jsonl", ".jsonl.gz")):
        record = record[0] if record and isinstance(record[0], dict) else None
        if record is None:
            return
    if not isinstance(record, dict):
        raise UserError(f"{label}.path: {path}: the first record is a {type(record).__name__}, "
                        "not a JSON object (expected one object per line)")
    _check_field(list(record), text_field, label, path)


def _peek_csv(path: str, text_field: str, label: str) -> None:
    line = _first_line(path, label)
    if line is None:
        raise UserError(f"{label}.path: {path} is empty (no header)")
    header = next(csv.reader([line]), [])
    _check_field(header, text_field, label, path)


def _peek_text(path: str, text_field: str, label: str) -> None:
    if text_field != "text":
        raise UserError(f"{label}.text_field: text files have one column, 'text'; got {text_field!r}")
    if _first_line(path, label) is None:
        raise UserError(f"{label}.path: {path} holds only blank lines (no text)")


def _peek_parquet(path: str, text_field: str, label: str) -> None:
    import pyarrow.parquet as pq  # heavy; only for parquet sources

    try:
        meta = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError on a corrupt footer
        raise UserError(f"{label}.path: {path} is not a readable parquet file ({str(e).splitlines()[0]})") from None
    if meta.metadata.num_rows == 0:
        raise UserError(f"{label}.path: {path} has no rows")
    _check_field(meta.schema_arrow.names, text_field, label, path)


def _peek_arrow(path: str, text_field: str, label: str) -> None:
    import pyarrow as pa  # heavy; only for arrow sources

    schema = None
    for opener in (pa.ipc.open_stream, pa.ipc.open_file):  # 🤗 datasets writes the stream format
        try:
            with pa.memory_map(path) as source:
                schema = opener(source).schema
            break
        except Exception:  # noqa: BLE001 - the other format is tried, then one error
            continue
    if schema is None:
        raise UserError(f"{label}.path: {path} is not a readable Arrow file")
    _check_field(schema.names, text_field, label, path)


def _check_field(columns: List[str], text_field: str, label: str, path: str) -> None:
    if text_field not in columns:
        shown = ", ".join(map(str, columns[:20])) or "none"
        raise UserError(f"{label}.text_field: {text_field!r} is not a column of {path} (its first record); "
                        f"available: {shown}")


PEEKERS = {"json": _peek_json, "csv": _peek_csv, "text": _peek_text, "parquet": _peek_parquet,
           "arrow": _peek_arrow}
