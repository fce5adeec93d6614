"""The retrieval probe of a validation (`validation.probe`): eval's task samples, scored teacher-forced
on the training's own layout.

Each (task, length) cell holds the samples `longctx eval` builds with the same task, length,
seed, samples and style (eval/tasks/), and each sample is scored as `longctx eval
mode=teacher_forced` scores it (eval/teacher_forced.py): one forward of prompt + reference
answer through the engine (dp x cp, any cp impl, any ZeRO stage), logits only at the answer
positions, right when every answer token is the argmax. dp rank r takes samples r, r + dp, ...
and blank rows (nothing scored) fill up every rank to the same number of forwards; each cp
rank scores the answer positions of its zigzag shard. The (misses, tokens) per reference are
summed over the world in one all-reduce.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch

from longctx.base.errors import UserError
from longctx.base.labels import IGNORE_INDEX
from longctx.config.probe import FIELD, ProbeSection
from longctx.data.tokenizer import prepends_bos
from longctx.eval.tasks import TaskOptions, build_samples
from longctx.eval.teacher_forced import ForcedRow, forced_row, reference_tallies, row_tensors, sample_score
from longctx.parallel.sharding import shard_batch
from longctx.train.step import all_reduce_sum


@dataclasses.dataclass(frozen=True)
class ProbeItem:
    task: str
    length: int
    row: ForcedRow
    columns: int  # the row's padded length: a multiple the stage's layout takes


def probe_options(section: ProbeSection, tokenizer) -> TaskOptions:
    """The TaskOptions `longctx eval --style STYLE` builds for this tokenizer (no chat template:
    a model in training is a base model)."""
    return TaskOptions(style=section.style, add_bos=prepends_bos(tokenizer))


def build_items(section: ProbeSection, lengths: Sequence[int], tokenizer, *, seq_len: int,
                multiple: int) -> list[ProbeItem]:
    """Every sample of every (task, length) cell as a padded forward row; UserError naming the
    field for a length below a task's minimum or a row longer than the stage's."""
    options = probe_options(section, tokenizer)
    add_bos = options.add_bos

    def encode_prompt(text: str) -> list:
        return tokenizer.encode(text, add_bos=add_bos)

    def encode_piece(text: str) -> list:
        return tokenizer.encode(text, add_bos=False)

    items = []
    for task in section.tasks:
        for length in lengths:
            try:
                samples = build_samples(task, tokenizer, length, section.samples, seed=section.seed, options=options)
            except UserError as e:
                raise UserError(f"{FIELD}.lengths: {str(e).removeprefix('eval.lengths: ')}") from None
            for sample in samples:
                row = forced_row(sample, encode_prompt, encode_piece)
                n = len(row.input_ids)
                if n > seq_len:
                    raise UserError(f"{FIELD}.lengths: a {task} sample at {length} is {n} tokens with its answer, "
                                    f"beyond the stage's seq_len={seq_len}; give shorter lengths")
                items.append(ProbeItem(task, length, row, min(-(-n // multiple) * multiple, seq_len)))
    return items


@torch.no_grad()
def probe_tallies(forward: Callable, items: Sequence[ProbeItem], *, dp_rank: int, dp_size: int, cp_rank: int,
                  cp_size: int, device: torch.device, pad_id: int,
                  stop: Optional[Callable[[], bool]] = None) -> Optional[torch.Tensor]:
    """This rank's (n_items, max_refs, 2) float64 [misses, tokens] per reference, or None when
    `stop` (collective, asked between forwards) agreed to stop."""
    max_refs = max(item.row.n_refs for item in items)
    tally = torch.zeros(len(items), max_refs, 2, dtype=torch.float64, device=device)  # (S, R, 2)
    per_rank = -(-len(items) // dp_size)
    mine: list = list(range(dp_rank, len(items), dp_size))
    mine += [None] * (per_rank - len(mine))  # blank rows: the same forwards on every rank
    for k, index in enumerate(mine):
        item = items[index if index is not None else 0]
        batch = row_tensors([item.row], item.columns, pad_id)  # (1, T)
        if index is None:
            batch["labels"].fill_(IGNORE_INDEX)
        batch = {key: v.to(device) for key, v in batch.items()}
        if cp_size > 1:
            batch = shard_batch(batch, cp_rank, cp_size)  # (1, T / cp), global position ids
        at = batch["labels"] != IGNORE_INDEX  # (1, T / cp)
        logits = forward(batch["input_ids"], position_ids=batch["position_ids"], logits_at=at)  # (N, V)
        if index is not None:
            row_of = torch.zeros(logits.shape[0], dtype=torch.long, device=device)  # (N,)
            tally[index] += reference_tallies(logits, batch["labels"][at], batch["refs"][at], row_of, 1, max_refs)[0]
        if stop is not None and k < len(mine) - 1 and stop():
            return None
    return tally


def probe_scores(flat: Sequence[float], items: Sequence[ProbeItem]) -> tuple[dict, dict]:
    """({task: {length: mean sample score}}, {task: {length: share of answer tokens that are the
    argmax}}), both 0..100, from the world's summed tallies."""
    max_refs = max(item.row.n_refs for item in items)
    scores: dict = {}
    tokens: dict = {}
    for i, item in enumerate(items):
        base = i * max_refs * 2
        tally = [(flat[base + 2 * r], flat[base + 2 * r + 1]) for r in range(max_refs)]
        key = str(item.length)
        scores.setdefault(item.task, {}).setdefault(key, []).append(sample_score(tally, item.row.n_refs))
        right, total = tokens.setdefault(item.task, {}).get(key, (0.0, 0.0))
        tokens[item.task][key] = (right + sum(t - m for m, t in tally), total + sum(t for _, t in tally))
    return ({task: {k: sum(s) / len(s) for k, s in cells.items()} for task, cells in scores.items()},
            {task: {k: 100.0 * r / t for k, (r, t) in cells.items()} for task, cells in tokens.items()})


def run_probe(forward: Callable, items: Sequence[ProbeItem], mesh, device: torch.device, pad_id: int,
              stop: Optional[Callable[[], bool]] = None) -> Optional[tuple[dict, dict]]:
    """Collective: the probe's scores and token accuracies (probe_scores), or None when stopped."""
    local = probe_tallies(forward, items, dp_rank=mesh.dp_rank, dp_size=mesh.dp_size, cp_rank=mesh.cp_rank,
                          cp_size=mesh.cp_size, device=device, pad_id=pad_id, stop=stop)
    if local is None:
        return None
    return probe_scores(all_reduce_sum(local.flatten()), items)
