"""Read the records of a W&B run file (run-<id>.wandb), as W&B writes it, decoded with W&B's own
protobuf schema (wandb.proto.wandb_internal_pb2).

    records = read_records(path)               # [wandb_internal_pb2.Record, ...]
    steps = history_steps(records)             # {step: {"train/loss": 1.23, ...}}

The file is a header (":W&B", 2 bytes magic, 1 byte version) then 32 KiB blocks of chunks, each
chunk a 7-byte header (CRC32, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) and
its bytes; a record is one full chunk or a first..last sequence.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

HEADER = 7
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, records, pending = HEADER, [], b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # the block's tail is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a file
            break
        pending += chunk
        if kind in (FULL, LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


def history_steps(records: list) -> dict:
    """{step: {key: value}} of the history records (values decoded from their JSON)."""
    out: dict = {}
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            out[int(rec.history.step.num)] = items
    return out
