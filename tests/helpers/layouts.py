"""Generated row layouts for the invariant suite (hypothesis strategies and the batch a layout
makes), as the data pipeline builds rows: packed documents whose positions restart at every
document, trailing padding whose positions restart at 0 and which, with document masking,
shares the last document's segment id (data/packing.py's fold_trailing_padding), labels inside
each document only. A layout also covers rows of one token and, at a length divisible by
2 * cp, documents crossing the zigzag shard boundaries."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from hypothesis import strategies as st

from longctx.base.labels import IGNORE_INDEX

MODEL_TYPES_NATIVE = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class Layout:
    docs: Tuple[int, ...]  # lengths of the packed documents, in row order
    n_pad: int  # trailing padding
    document_masking: bool
    seed: int = 0

    @property
    def length(self) -> int:
        return sum(self.docs) + self.n_pad


@st.composite
def layouts(draw, min_len: int = 1, max_len: int = 16, multiple: int = 1) -> Layout:
    """A row of `length` tokens (a multiple of `multiple`): 1-4 documents, then padding (none,
    some, or all but one token)."""
    length = draw(st.integers(-(-min_len // multiple), max_len // multiple)) * multiple
    n_pad = draw(st.sampled_from([0, 0, 1, length // 2, length - 1])) if length > 1 else 0
    n_pad = min(n_pad, length - 1)
    real = length - n_pad
    cuts = sorted(draw(st.sets(st.integers(1, max(1, real - 1)), max_size=3))) if real > 1 else []
    edges = [0, *cuts, real]
    docs = tuple(b - a for a, b in zip(edges, edges[1:]))
    return Layout(docs, n_pad, draw(st.booleans()), draw(st.integers(0, 2**16)))


def make_batch(layout: Layout, vocab: int = 96, pad_id: int = 0, rows: int = 1) -> dict:
    """(rows, T) input_ids, labels, position_ids, segment_ids (None without document masking)."""
    g = torch.Generator().manual_seed(layout.seed)
    T = layout.length
    ids = torch.randint(3, vocab, (rows, T), generator=g)
    seg = torch.zeros(T, dtype=torch.long)
    pos = torch.zeros(T, dtype=torch.long)
    labels = torch.full((rows, T), IGNORE_INDEX, dtype=torch.long)
    start = 0
    for d, n in enumerate(layout.docs):
        seg[start:start + n] = d
        pos[start:start + n] = torch.arange(n)
        labels[:, start:start + n - 1] = ids[:, start + 1:start + n]
        start += n
    real = sum(layout.docs)
    ids[:, real:] = pad_id
    seg[real:] = len(layout.docs) - 1  # folded into the last document
    pos[real:] = torch.arange(layout.n_pad)
    batch = {"input_ids": ids, "labels": labels, "position_ids": pos.expand(rows, T).clone(),
             "segment_ids": seg.expand(rows, T).clone() if layout.document_masking else None,
             "token_mask": torch.arange(T).expand(rows, T) < real}
    return batch


def with_padding(batch: dict, n_pad: int, pad_id: int = 0) -> dict:
    """The same rows with `n_pad` more padding tokens at the end."""
    rows = batch["input_ids"].shape[0]

    def grow(t: Optional[torch.Tensor], fill) -> Optional[torch.Tensor]:
        if t is None:
            return None
        tail = fill if isinstance(fill, torch.Tensor) else torch.full((rows, n_pad), fill, dtype=t.dtype)
        return torch.cat([t, tail], dim=1)

    last_seg = None if batch["segment_ids"] is None else batch["segment_ids"][:, -1:].expand(rows, n_pad)
    start = batch["position_ids"][:, -1:] + 1 if not bool(batch["token_mask"][:, -1].all()) else 0
    pos_tail = (start + torch.arange(n_pad)).expand(rows, n_pad)
    return {"input_ids": grow(batch["input_ids"], pad_id), "labels": grow(batch["labels"], IGNORE_INDEX),
            "position_ids": grow(batch["position_ids"], pos_tail),
            "segment_ids": grow(batch["segment_ids"], last_seg),
            "token_mask": grow(batch["token_mask"], False)}
