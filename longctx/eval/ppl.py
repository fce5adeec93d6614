"""Perplexity vs context length on long documents.

For each length L, `num_windows` windows of L tokens (each starting at a document's BOS when
documents are long enough, else spanning document boundaries) are scored with next-token NLL
over all positions; ppl(L) = exp(total NLL / predicted tokens). The NLL is the training loss
(model/loss.py: chunks of positions, no full logits). Under context parallelism
each rank scores its zigzag shard and the sums are all-reduced.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from longctx.base.errors import UserError
from longctx.base.labels import IGNORE_INDEX
from longctx.data.tokenizer import prepends_bos
from longctx.eval.haystack import BUILTIN_ESSAY
from longctx.eval.sequence_rope import row_lengths
from longctx.model.llama import window_positions
from longctx.parallel import make_cp_attention, shard_sequence
from longctx.parallel.zigzag import zigzag_multiple
from longctx.reporting.progress import Progress


def load_documents(path: Optional[str]) -> tuple[list[str], str]:
    """Texts from a .txt/.jsonl/.json file or a folder of them; the built-in essay when None."""
    if path is None:
        return [BUILTIN_ESSAY], "built-in essay (repeats itself: give --ppl-data for meaningful numbers)"
    p = Path(path)
    if not p.exists():
        raise UserError(f"eval.ppl_data: {path} does not exist (a .txt/.jsonl/.json file or a folder of them)")
    files = sorted(f for f in p.rglob("*") if f.suffix in (".txt", ".jsonl", ".json")) if p.is_dir() else [p]
    docs: list[str] = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix == ".jsonl":
            docs += [json.loads(x).get("text", "") for x in text.splitlines() if x.strip()]
        elif f.suffix == ".json":
            obj = json.loads(text)
            items = obj if isinstance(obj, list) else [obj]
            docs += [d.get("text", "") if isinstance(d, dict) else str(d) for d in items]
        else:
            docs.append(text)
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise UserError(f"eval.ppl_data: {path} contains no text")
    return docs, str(path)


def make_windows(tokenizer, docs: Sequence[str], length: int,
                 num_windows: int) -> tuple[list[list[int]], str, Optional[str]]:
    """(windows, how they were cut, a note when not every window starts a document)."""
    add_bos = prepends_bos(tokenizer)
    encoded = [tokenizer.encode(d, add_bos=add_bos) for d in docs]
    long_docs = [e[:length] for e in encoded if len(e) >= length]
    if len(long_docs) >= num_windows:
        return long_docs[:num_windows], "document starts", None
    stream = [t for e in encoded for t in e]
    need = length * num_windows
    if len(stream) < need:
        stream = stream * (need // max(len(stream), 1) + 1)
        mode = "repeated text"
    else:
        mode = "spans documents"
    note = (f"ppl at {length}: {len(long_docs)} of {len(docs)} documents reach {length} tokens, "
            f"{num_windows} windows wanted; windows are cut from the concatenated stream ({mode})")
    return [stream[i * length:(i + 1) * length] for i in range(num_windows)], mode, note


@torch.no_grad()
def window_nll(model, ids: torch.Tensor, *, cp_group=None, cp_impl: str = "ring",
               chunk: int = 1024) -> tuple[float, int]:
    """Sum of next-token NLL and number of predicted tokens for windows ids (B, L), from the
    training loss (the chunked cross-entropy; no full logits)."""
    labels = torch.full_like(ids, IGNORE_INDEX)  # (B, L), pre-shifted as in training
    labels[:, :-1] = ids[:, 1:]
    P = dist.get_world_size(cp_group) if cp_group is not None else 1
    if P == 1:
        loss_sum, count = model(ids, labels=labels, loss_chunk_size=chunk)
        return float(loss_sum), int(count)
    L = ids.shape[1] // zigzag_multiple(P) * zigzag_multiple(P)
    ids, labels = ids[:, :L], labels[:, :L].clone()
    labels[:, -1] = IGNORE_INDEX
    rank = dist.get_rank(cp_group)
    pos = torch.arange(L, device=ids.device).expand_as(ids)
    window_positions(model.config, pos, "the perplexity windows (eval.ppl_lengths)")  # every cp rank alike
    local_ids, local_pos, local_labels = (shard_sequence(x, rank, P, dim=1).contiguous() for x in (ids, pos, labels))
    with model.attention_scope(make_cp_attention(cp_group, impl=cp_impl)), \
            row_lengths(model, [L] * ids.shape[0]):  # a shard's positions are part of the window
        loss_sum, count = model(local_ids, local_pos, labels=local_labels, loss_chunk_size=chunk)
    buf = torch.stack([loss_sum.double(), count.double()])
    dist.all_reduce(buf, group=cp_group)
    return float(buf[0]), int(buf[1])


def perplexity_vs_length(model, tokenizer, lengths: Sequence[int], *, num_windows: int = 4,
                         data_path: Optional[str] = None, cp_group=None, cp_impl: str = "ring",
                         batch_size: int = 1, progress: bool = False) -> dict:
    """{"source", "num_windows", "rows": one per length, "notes": lengths whose windows were cut
    across documents (none for the built-in essay, whose source line says it repeats itself)}."""
    docs, source = load_documents(data_path)
    device = model.embed_tokens.weight.device
    rows, notes = [], []
    bar = Progress(len(lengths) * num_windows, "ppl", "window", enabled=progress)
    for L in lengths:
        windows, mode, note = make_windows(tokenizer, docs, L, num_windows)
        if note and data_path is not None:
            notes.append(note)
        total, count = 0.0, 0
        for i in range(0, len(windows), batch_size):
            ids = torch.tensor(windows[i:i + batch_size], dtype=torch.long, device=device)
            t, c = window_nll(model, ids, cp_group=cp_group, cp_impl=cp_impl)
            total, count = total + t, count + c
            bar.update(ids.shape[0])
        nll = total / max(count, 1)
        rows.append({"length": L, "nll": nll, "ppl": math.exp(min(nll, 700.0)), "tokens": count, "windows": mode})
    bar.close()
    return {"source": source, "num_windows": num_windows, "rows": rows, "notes": notes}
