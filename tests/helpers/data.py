"""Shared helpers of the tests/unit/test_data_*.py files: tiny corpora on disk, a locally trained
BPE tokenizer, and reconstruction of documents from packed batches."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Dict, List

import numpy as np

from longctx.data import DataConfig, SourceConfig

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def make_texts(n: int, seed: int = 0, min_words: int = 3, max_words: int = 60, tag: str = "doc") -> List[str]:
    """n distinct documents of varied length (each starts with a unique tag)."""
    rng = random.Random(seed)
    return [f"{tag}{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))
            for i in range(n)]


def write_jsonl(path, texts, field: str = "text") -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({field: t, "id": i}) + "\n")
    return str(path)


def write_parquet(path, texts, field: str = "text") -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({field: texts, "id": list(range(len(texts)))}), str(path), row_group_size=7)
    return str(path)


def file_config(path, *, seq_len=64, mbs=4, **kw) -> DataConfig:
    src_kw = {k: kw.pop(k) for k in list(kw) if k in SourceConfig.__dataclass_fields__}
    return DataConfig(sources=[SourceConfig(path=str(path), **src_kw)], seq_len=seq_len,
                      micro_batch_size=mbs, prefetch=kw.pop("prefetch", 0), **kw)


def train_bpe(directory, vocab_size: int = 400, with_config: bool = True) -> str:
    """A tiny byte-level BPE trained here (no network) with the project's trainer; returns the
    directory (with a tokenizer_config.json naming the specials unless with_config=False)."""
    from longctx.data.bpe import train_bpe as train

    corpus = make_texts(300, seed=1) + ["The grass is green. The sky is blue. One of the special magic numbers"] * 20
    train(corpus, vocab_size, Path(directory))
    if with_config:
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"}, f)
    return str(directory)


def collect(loader, n_batches=None) -> List[Dict[str, np.ndarray]]:
    out = []
    for b in loader:
        out.append({k: v.numpy().copy() for k, v in b.items()})
        if n_batches is not None and len(out) >= n_batches:
            break
    return out


def rebuild_documents(batches, bos_id: int, pad_id: int) -> List[tuple]:
    """Token sequences of the documents in a rank's row stream (in order): a piece that
    starts with BOS opens a document, any other piece at a row start continues the last one."""
    docs: List[list] = []
    for b in batches:
        for r in range(b["input_ids"].shape[0]):
            ids, pos, lab = b["input_ids"][r], b["position_ids"][r], b["labels"][r]
            T = len(ids)
            starts = [t for t in range(T) if pos[t] == 0] + [T]
            for a, e in zip(starts, starts[1:]):
                piece = ids[a:e].tolist()
                if all(x == pad_id for x in piece):  # padding
                    assert all(x == -100 for x in lab[a:e])
                    continue
                if piece[0] == bos_id or not docs:
                    docs.append(piece)
                else:
                    docs[-1].extend(piece)
    return [tuple(d) for d in docs]


def rows_by_source(loader) -> Dict[int, list]:
    """Drain a finite loader row by row: {source index: [one-row pseudo-batches]} (rows of
    different sources interleave, so documents are rebuilt per source)."""
    out: Dict[int, list] = {}
    while True:
        got = loader.next_row()
        if got is None:
            return out
        i, row = got
        out.setdefault(i, []).append({
            "input_ids": row.input_ids[None], "labels": row.labels[None],
            "position_ids": row.position_ids[None], "segment_ids": row.segment_ids[None],
        })


def assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def resume_roundtrip(make_loader, n_before, n_after):
    """Batches n_before..n_before+n_after of an uninterrupted run vs. a resumed one."""
    full = collect(make_loader(), n_before + n_after)
    first = make_loader()
    collect(first, n_before)
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON
    resumed = make_loader()
    resumed.load_state_dict(state)
    assert_batches_equal(collect(resumed, n_after), full[n_before:])
    return full
