"""Perplexity that isolates context length: the same target tokens scored with more context.

`perplexity_vs_length` (ppl.py) scores the first L tokens of a document, so each length scores
other tokens. Here the targets are fixed first and only the context grows:

- a document qualifies when it holds at least `max_length` tokens (the longest L compared);
- in it, `positions` target spans of `target` tokens end at evenly spaced token offsets
  e_1 < ... < e_k, the first at max_length and the last at the document's end;
- for each L, the window is the L tokens ending at e_j (with the tokenizer's BOS first when it
  prepends one: BOS + the L - 1 tokens before e_j), and only its last `target` tokens count: each
  is predicted from the L - 1 - ... tokens before it in the window, never from outside it.

So every L scores exactly the same tokens of the same documents, and a change in perplexity with L
is the model's use of the extra context. Each window's NLL sum is kept (`windows`), so two
variants compare per window (paired). The NLL is the training loss (chunked, no full logits).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from longctx.base.labels import IGNORE_INDEX
from longctx.data.tokenizer import prepends_bos


def target_ends(n_tokens: int, max_length: int, positions: int) -> list[int]:
    """`positions` token offsets (exclusive ends), evenly spaced from max_length to n_tokens; []
    when the document is shorter than max_length. Fewer when the document has fewer distinct ends."""
    if n_tokens < max_length or positions < 1:
        return []
    if positions == 1:
        return [n_tokens]
    span = n_tokens - max_length
    return sorted({max_length + round(span * j / (positions - 1)) for j in range(positions)})


def windows_for(tokens: Sequence[int], end: int, length: int, target: int, bos) -> tuple[list[int], list[int]]:
    """(input ids, labels) of the window of `length` tokens ending at `end`; labels hold the next
    token for the last `target` tokens' predecessors and IGNORE elsewhere (pre-shifted)."""
    if bos is not None:
        ids = [bos] + list(tokens[end - length + 1:end])
    else:
        ids = list(tokens[end - length:end])
    labels = [IGNORE_INDEX] * length
    for i in range(length - target - 1, length - 1):  # position i predicts ids[i + 1]
        labels[i] = ids[i + 1]
    return ids, labels


def plan_targets(token_docs: Sequence[Sequence[int]], max_length: int, positions: int) -> list[tuple[int, int]]:
    """[(document index, end)] of every target span, in document order."""
    return [(d, e) for d, toks in enumerate(token_docs) for e in target_ends(len(toks), max_length, positions)]


@torch.no_grad()
def score_windows(model, tokenizer, token_docs: Sequence[Sequence[int]], spans: Sequence[tuple[int, int]],
                  length: int, target: int, *, chunk: int = 1024) -> list[dict]:
    """One {"doc", "end", "nll", "tokens"} per span at context `length` (nll: the sum over its targets)."""
    if target >= length:
        raise ValueError(f"target ({target}) must be shorter than the window ({length})")
    bos = tokenizer.bos_id if prepends_bos(tokenizer) else None
    device = model.embed_tokens.weight.device
    out = []
    for d, end in spans:
        ids, labels = windows_for(token_docs[d], end, length, target, bos)
        loss_sum, count = model(torch.tensor([ids], device=device), labels=torch.tensor([labels], device=device),
                                loss_chunk_size=chunk)
        out.append({"doc": d, "end": end, "nll": float(loss_sum), "tokens": int(count)})
    return out


def perplexity(windows: Sequence[dict]) -> float:
    """exp(total NLL / total target tokens) over the windows."""
    tokens = sum(w["tokens"] for w in windows)
    return math.exp(min(sum(w["nll"] for w in windows) / max(tokens, 1), 700.0))
