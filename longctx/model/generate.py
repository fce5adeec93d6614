"""Batched greedy decoding with a KV cache (left padding, per-row positions)."""
from __future__ import annotations

from typing import Callable, Collection, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from longctx.model.cache import KVCache

StopIds = Union[int, Collection[int], None]  # one end-of-sequence id, or every id that ends a row
RowStopped = Optional[Callable[[list[int]], bool]]  # a row's new tokens so far -> whether it is done


def stop_set(eos_id: StopIds) -> frozenset[int]:
    """The ids that end a row (an int, a collection of them, or None: none)."""
    if eos_id is None:
        return frozenset()
    if isinstance(eos_id, int):
        return frozenset({eos_id})
    return frozenset(int(i) for i in eos_id)


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             eos_id: StopIds = None, pad_id: int = 0, stopped: RowStopped = None) -> list[list[int]]:
    """Greedy continuation of each prompt; returns only the new tokens of each row, cut
    before the first stop id (not included). `eos_id`: one id or a set of them (a chat
    model's end-of-turn and end-of-sequence tokens); `stopped`: greedy_decode's.

    Rows are left-padded to the longest prompt. Padding gets its own document id so real
    tokens never attend to it, and positions count from each row's first real token, so a
    row's result does not depend on what it was batched with.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: every prompt needs at least one token")
    device = model.embed_tokens.weight.device
    B, L = len(prompts), max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)  # (B,)
    total = L + max_new_tokens
    ids = torch.full((B, L), pad_id, dtype=torch.long, device=device)  # (B, L)
    kv_segments = torch.full((B, total), -1, dtype=torch.long, device=device)  # -1 = padding
    positions = torch.zeros((B, L), dtype=torch.long, device=device)
    for b, prompt in enumerate(prompts):
        n = len(prompt)
        ids[b, L - n:] = torch.tensor(list(prompt), dtype=torch.long, device=device)
        kv_segments[b, L - n:] = 0
        positions[b, L - n:] = torch.arange(n, device=device)
    kv_segments[:, L:] = 0
    padded = bool((lengths < L).any())

    cache = KVCache.for_model(model, B, total)
    seg = kv_segments[:, :L] if padded else None
    hidden = model.forward_hidden(ids, positions, seg, seg, cache)  # (B, L, hidden)
    next_tok = F.linear(hidden[:, -1], model.output_weight).argmax(-1)  # (B,)

    def step(i: int, tok: torch.Tensor) -> torch.Tensor:
        pos = (lengths + i)[:, None]  # (B, 1)
        q_seg = kv_segments[:, L + i:L + i + 1] if padded else None
        kv_seg = kv_segments[:, :L + i + 1] if padded else None
        hidden = model.forward_hidden(tok[:, None], pos, q_seg, kv_seg, cache)  # (B, 1, hidden)
        return F.linear(hidden[:, -1], model.output_weight).argmax(-1)

    return greedy_decode(next_tok, step, max_new_tokens, eos_id=eos_id, pad_id=pad_id, stopped=stopped)


def greedy_decode(first: torch.Tensor, step: Callable[[int, torch.Tensor], torch.Tensor], max_new_tokens: int,
                  *, eos_id: StopIds, pad_id: int, stopped: RowStopped = None) -> list[list[int]]:
    """The decode loop shared by local and context-parallel generation.

    first (B,): the token predicted by the prefill; step(i, tok) feeds tok as new token i and
    returns the next prediction (B,). Rows that produced a stop id (eos_id: one id or a set),
    or whose tokens so far `stopped` says are enough (a stop string in their text: the
    caller cuts it there, so the tokens after it are not worth computing), are fed pad_id
    afterwards; the loop stops when every row has finished. Rows are independent, so a row
    stopped early keeps exactly the tokens it had. Returns each row cut before its first
    stop id. `stopped` must decide alike on every rank of a context-parallel group (it sees
    the same tokens there).
    """
    stops = stop_set(eos_id)
    stop_tensor = torch.tensor(sorted(stops), dtype=torch.long, device=first.device)  # (S,)
    B = first.shape[0]
    out = torch.empty((B, max_new_tokens), dtype=torch.long, device=first.device)
    finished = torch.zeros(B, dtype=torch.bool, device=first.device)
    next_tok, steps = first, 0
    for i in range(max_new_tokens):
        tok = torch.where(finished, torch.full_like(next_tok, pad_id), next_tok)  # (B,)
        out[:, i] = tok
        steps = i + 1
        if stops:
            finished |= torch.isin(tok, stop_tensor)
        if stopped is not None:
            for b in (~finished).nonzero().flatten().tolist():
                finished[b] = stopped(out[b, :steps].tolist())
        if i == max_new_tokens - 1 or bool(finished.all()):
            break
        next_tok = step(i, tok)
    results = []
    for b in range(B):
        row = out[b, :steps].tolist()
        end = next((j for j, t in enumerate(row) if t in stops), None)
        if end is not None:
            row = row[:end]
        results.append(row)
    return results
