"""A task's minimum length with a tokenizer, and what to say when a length is below it.

A sample needs its prompt template, the smallest haystack its task allows and the answer budget:
its *need* in tokens. A (task, length) cell fits when every one of its samples' needs is at most
the length. Below that, `build_samples` raises `BelowMinimum`, which carries a length that fits
(checked against that length's own samples, so the suggestion works when followed) and whether
compact style fits the length; `evaluate` skips such cells with one notice, and when nothing is
left to run, `no_fit_error` names the lengths that would work.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Iterator, Optional, Sequence

from longctx.base.errors import UserError
from longctx.eval.tasks.base import Draft, Task, TaskOptions, count_tokens_fn, draft_wrap, resolve_chat_template

MAX_SEARCH_STEPS = 30  # need(length) settles in 1-3 steps; past these, doubling


def draft_rng(seed: int, task: str, length: int, depth: Optional[float], index: int) -> random.Random:
    """The random stream of one sample. String seeds are hashed with SHA-512 by `random`, so
    this is stable across processes."""
    return random.Random(f"{seed}|{task}|{length}|{depth}|{index}")


def min_config(draft: Draft) -> tuple[int, int]:
    """The smallest (haystack units, filler words) a sample may have."""
    if draft.fill_max(draft.n_min) > 0:
        return draft.n_min, 1
    return (max(draft.n_min, 1), 0)


def sample_need(draft: Draft, count: Callable[[str], int], wrap: Callable[[str], str], budget: int) -> int:
    """Tokens of the sample's smallest prompt plus its answer budget."""
    n, f = min_config(draft)
    return count(wrap(draft.render(n, f)) + draft.answer_prefix) + budget


def cell_drafts(task: Task, length: int, num_samples: int, seed: int, options: TaskOptions,
                depths: Optional[Sequence[float]], shared, indices: Optional[Sequence[int]] = None
                ) -> Iterator[tuple[int, Optional[float], Draft]]:
    """(global index, depth, draft) of every sample of a cell (those in `indices` only, if given)."""
    wanted = None if indices is None else set(indices)
    index = -1
    for depth in (list(depths) if depths is not None else [None]):
        for i in range(num_samples):
            index += 1
            if wanted is None or index in wanted:
                yield index, depth, task.draft(draft_rng(seed, task.name, length, depth, i), length, options,
                                               depth, shared)


def cell_need(task: Task, tokenizer, length: int, num_samples: int, *, seed: int = 0,
              options: TaskOptions = TaskOptions(), depths: Optional[Sequence[float]] = None,
              indices: Optional[Sequence[int]] = None) -> int:
    """The largest need among the cell's samples (the cell fits when it is <= length)."""
    count = count_tokens_fn(tokenizer, options)
    tpl = resolve_chat_template(options.chat_template)
    budget = task.max_new_tokens(tokenizer, options)
    shared = task.prepare(tokenizer, length, options, seed)
    return max((sample_need(d, count, draft_wrap(d, tpl), budget)
                for _, _, d in cell_drafts(task, length, num_samples, seed, options, depths, shared, indices)),
               default=0)


def length_that_fits(task: Task, tokenizer, length: int, num_samples: int, **cell) -> int:
    """The smallest length >= `length` found whose own samples all fit (a task's samples, and
    for cwe its word frequencies, depend on the length, so each candidate is checked)."""
    candidate = length
    for _ in range(MAX_SEARCH_STEPS):
        need = cell_need(task, tokenizer, candidate, num_samples, **cell)
        if need <= candidate:
            return candidate
        candidate = need
    while cell_need(task, tokenizer, candidate, num_samples, **cell) > candidate:
        candidate *= 2
        if candidate > 1 << 30:  # a task's fixed text grows with the length: a bug, not a user error
            raise RuntimeError(f"{task.name}: no length up to 2^30 tokens fits its own prompt")
    return candidate


class BelowMinimum(UserError):
    """A (task, length) cell that does not fit: `need` (its largest sample's), `fits` (a length
    that does) and `compact_fits` (whether style=compact fits this length)."""

    def __init__(self, task: str, length: int, need: int, budget: int, fits: int, compact_fits: bool,
                 style: str):
        self.task, self.length, self.need, self.fits, self.compact_fits = task, length, need, fits, compact_fits
        compact = " or style=compact" if compact_fits and style != "compact" else ""
        super().__init__(f"eval.lengths: {length} is below the minimum of task {task} ({need} tokens with this "
                         f"tokenizer: prompt template + {budget}-token answer budget); use longer lengths "
                         f"(lengths={fits} fits){compact}")


def below_minimum(task: Task, tokenizer, length: int, num_samples: int, *, seed: int, options: TaskOptions,
                  depths: Optional[Sequence[float]], indices: Optional[Sequence[int]]) -> BelowMinimum:
    """The error for a cell that does not fit, with a length that does and the compact verdict."""
    cell = dict(seed=seed, depths=depths, indices=indices)
    need = cell_need(task, tokenizer, length, num_samples, options=options, **cell)
    fits = length_that_fits(task, tokenizer, length, num_samples, options=options, **cell)
    compact = dataclasses.replace(options, style="compact")
    compact_fits = options.style != "compact" and cell_need(task, tokenizer, length, num_samples, options=compact,
                                                            **cell) <= length
    return BelowMinimum(task.name, length, need, task.max_new_tokens(tokenizer, options), fits, compact_fits,
                        options.style)


def skip_notice(below: Sequence[BelowMinimum]) -> str:
    """One line naming every skipped (task, lengths) and a length each task fits."""
    by_task: dict[str, list[BelowMinimum]] = {}
    for b in below:
        by_task.setdefault(b.task, []).append(b)
    parts = [f"{name} at {', '.join(str(b.length) for b in cells)} (needs {cells[-1].fits})"
             for name, cells in by_task.items()]
    return "skipped, below the task's minimum length with this tokenizer: " + "; ".join(parts)


def no_fit_error(below: Sequence[BelowMinimum], reasons: Sequence[str] = ()) -> UserError:
    """Every selected cell is below its minimum: the lengths that would work, and compact
    style where it fits the lengths asked for."""
    longest = {}
    for b in below:  # each task's suggestion from its longest requested length
        longest[b.task] = b
    ranked = sorted(longest.values(), key=lambda b: b.fits)
    lengths = sorted({b.length for b in below})
    needs = ", ".join(f"{b.task} {b.fits}" for b in ranked)
    msg = (f"eval.lengths: no selected task fits {', '.join(map(str, lengths))} tokens with this tokenizer "
           f"(lengths that fit: {needs}); use longer lengths (lengths={ranked[0].fits} runs {ranked[0].task})")
    compact = sorted({b.task for b in below if b.compact_fits})
    if compact:
        msg += f" or style=compact (fits {', '.join(compact)})"
    return UserError(msg + "".join(f"; {r}" for r in reasons))
