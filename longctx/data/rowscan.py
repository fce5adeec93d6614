"""Find the first row of a file source that cannot be training text, and say where and why.

    bad = first_bad_row(files, kind, text_field)   # str(bad): "a.jsonl row 151: not valid JSON (...)" | None

🤗 datasets and Arrow report a bad record without its file, or with a row number counted inside
one read block; this reads the files again, record by record, in the order the loader reads
them, and names the file and the 1-based row (and the line, where that differs). It runs only
after a load failed or a column turned out not to be text, so its speed does not matter.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from typing import Iterator, List, NamedTuple, Optional, Tuple


class BadRow(NamedTuple):
    where: str  # "FILE row N" (or "FILE line N")
    problem: str  # what is wrong with it
    about_field: bool  # the record parses but the text field holds no text

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


def _open_bytes(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _lines(path: str) -> Iterator[Tuple[int, bytes]]:
    with _open_bytes(path) as f:
        for lineno, raw in enumerate(f, 1):
            yield lineno, raw


def _decode(raw: bytes) -> Tuple[Optional[str], Optional[str]]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"


def _value_problem(record, text_field: str) -> Optional[str]:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    value = record.get(text_field)
    if value is None or isinstance(value, str):
        return None
    return f"{text_field!r} holds {type(value).__name__}, not text"


def _msg(e: json.JSONDecodeError) -> str:
    return e.msg[: -len(" at")] if e.msg.endswith(" at") else e.msg  # "Invalid control character at"


def _row(n: int, lineno: int) -> str:
    return f"row {n}" if n == lineno else f"row {n} (line {lineno})"


def _scan_json_lines(path: str, text_field: str) -> Optional[str]:
    n = 0
    for lineno, raw in _lines(path):
        if not raw.strip():
            continue
        n += 1
        text, problem = _decode(raw)
        if problem is None:
            try:
                record = json.loads(text.strip())
            except json.JSONDecodeError as e:
                problem = f"not valid JSON ({_msg(e)} at column {e.colno})"
            else:
                field_problem = _value_problem(record, text_field)
                if field_problem:
                    return BadRow(f"{path} {_row(n, lineno)}", field_problem, True)
        if problem:
            return BadRow(f"{path} {_row(n, lineno)}", problem, False)
    return None


def _scan_json_document(path: str, text_field: str) -> Optional[str]:
    """A .json file holding one array of objects (or one object)."""
    with _open_bytes(path) as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return BadRow(f"{path} line {line}", f"not UTF-8 (byte 0x{data[e.start]:02x})", False)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return BadRow(f"{path} line {e.lineno}", f"not valid JSON ({_msg(e)} at column {e.colno})", False)
    records = doc if isinstance(doc, list) else [doc]
    for n, record in enumerate(records, 1):
        problem = _value_problem(record, text_field)
        if problem:
            return BadRow(f"{path} row {n}", problem, True)
    return None


def _is_json_lines(path: str) -> bool:
    """JSON lines unless the first non-blank character opens an array or the file is one object."""
    if path.endswith((".jsonl", ".jsonl.gz")):
        return True
    with _open_bytes(path) as f:
        head = f.read(1 << 16).lstrip()
    if head[:1] == b"[":
        return False
    first = head.split(b"\n", 1)[0]
    try:
        json.loads(first)
        return True
    except ValueError:
        return head[:1] != b"{"


def _scan_json(path: str, text_field: str) -> Optional[str]:
    if _is_json_lines(path):
        return _scan_json_lines(path, text_field)
    return _scan_json_document(path, text_field)


def _undecodable_line(path: str, numbered_lines) -> Optional[BadRow]:
    """The first of (line number, bytes) that is not UTF-8."""
    for lineno, raw in numbered_lines:
        _, problem = _decode(raw)
        if problem:
            return BadRow(f"{path} line {lineno}", problem, False)
    return None


def _scan_text(path: str, text_field: str) -> Optional[str]:
    return _undecodable_line(path, _lines(path))


def _scan_csv(path: str, text_field: str) -> Optional[str]:
    with _open_bytes(path) as f:
        data = f.read()
    bad = _undecodable_line(path, enumerate(io.BytesIO(data), 1))
    if bad:
        return bad
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    header = next(reader, [])
    if text_field not in header:
        return None
    col = header.index(text_field)
    for n, row in enumerate(reader, 1):
        if len(row) <= col:
            return BadRow(f"{path} row {n} (line {reader.line_num})",
                          f"has {len(row)} fields, the header has {len(header)}", False)
    return None


SCANNERS = {"json": _scan_json, "text": _scan_text, "csv": _scan_csv}


def first_bad_row(files: List[str], kind: str, text_field: str) -> Optional[BadRow]:
    """The first bad record of `files` (str(): "FILE row N: what is wrong"); None when every
    record reads as text (or the kind is not one read record by record)."""
    scan = SCANNERS.get(kind)
    if scan is None:
        return None
    for path in files:
        try:
            found = scan(path, text_field)
        except (OSError, EOFError, zlib.error) as e:  # a truncated .gz, an unreadable file
            return BadRow(path, f"cannot be read ({type(e).__name__}: {e})", False)
        if found:
            return found
    return None


def first_non_text(table, text_field: str) -> Optional[Tuple[int, str]]:
    """(row index, type name) of the first value of an Arrow table's column that is neither text
    nor null, for typed columns (parquet, arrow) where no file scan applies."""
    column = table.column(text_field)
    offset = 0
    for chunk in column.chunks:
        for k, value in enumerate(chunk.to_pylist()):
            if value is not None and not isinstance(value, str):
                return offset + k, type(value).__name__
        offset += len(chunk)
    return None
