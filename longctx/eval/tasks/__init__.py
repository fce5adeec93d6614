"""Task registry and sample generation.

    build_samples("niah_single_2", tokenizer, 4096, 10, seed=0)  -> list[Sample]

Every sample is a pure function of (seed, task, length, depth, index), so runs are reproducible
and any subset (one rank's share) can be generated alone.
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence, Union

from longctx.base.errors import UserError
from longctx.eval.tasks.base import (
    STYLES,
    Sample,
    Task,
    TaskOptions,
    count_tokens_fn,
    draft_wrap,
    fit_draft,
    resolve_chat_template,
)
from longctx.eval.tasks.cwe import CweTask
from longctx.eval.tasks.fwe import FweTask
from longctx.eval.tasks.minimum import (
    BelowMinimum,
    below_minimum,
    cell_drafts,
    draft_rng,
    min_config,
    no_fit_error,
    skip_notice,
)
from longctx.eval.tasks.niah import NIAH_TASKS
from longctx.eval.tasks.passkey import PasskeyTask
from longctx.eval.tasks.qa import QaTask
from longctx.eval.tasks.vt import VtTask

TASKS: dict[str, Task] = {t.name: t for t in [
    *NIAH_TASKS, VtTask(), CweTask(), FweTask(), QaTask("qa_1", "squad"), QaTask("qa_2", "hotpotqa"),
    PasskeyTask(),
]}
RULER_TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]
# The needle grid uses the vanilla NIAH task (essay haystack, one number).
NIAH_GRID_TASK = "niah_single_2"


def get_task(name: Union[str, Task]) -> Task:
    if isinstance(name, Task):
        return name
    if name not in TASKS:
        raise UserError(f"eval.tasks: unknown task {name!r}; valid: {', '.join(TASKS)}")
    return TASKS[name]


def task_min_length(task: Union[str, Task], tokenizer, options: TaskOptions = TaskOptions(), *,
                    seed: int = 0, probes: int = 3, reference_length: int = 2048) -> int:
    """Smallest target length at which the task has some haystack, with this tokenizer.

    Some tasks change shape with the length (cwe uses RULER's lower word frequencies below
    4096 tokens): `reference_length` selects the regime.
    """
    task = get_task(task)
    shared = task.prepare(tokenizer, reference_length, options, seed)
    count = count_tokens_fn(tokenizer, options)
    tpl = resolve_chat_template(options.chat_template)
    budget = task.max_new_tokens(tokenizer, options)
    worst = 0
    for i in range(probes):
        d = task.draft(draft_rng(seed, task.name, reference_length, None, i), reference_length, options, None, shared)
        n, f = min_config(d)
        worst = max(worst, count(draft_wrap(d, tpl)(d.render(n, f)) + d.answer_prefix))
    return worst + budget


def build_samples(task: Union[str, Task], tokenizer, length: int, num_samples: int, *, seed: int = 0,
                  options: TaskOptions = TaskOptions(), depths: Optional[Sequence[float]] = None,
                  indices: Optional[Sequence[int]] = None) -> list[Sample]:
    """`num_samples` samples per depth (depths None = RULER's random placement).

    Each prompt plus the task's generation budget fits `length` tokens of `tokenizer` and is as
    long as the haystack granularity allows (a filler word). `indices` restricts generation to
    those global sample indices (a rank's share). Raises UserError when the task's data is
    missing, BelowMinimum (a UserError) when `length` is below the task's minimum.
    """
    task = get_task(task)
    reason = task.unavailable_reason(options)
    if reason:
        raise UserError(reason)
    if depths is not None:
        for d in depths:
            if not 0.0 <= d <= 1.0:
                raise UserError(f"eval.depths: {d} is outside [0, 1]")
    budget = task.max_new_tokens(tokenizer, options)
    tpl = resolve_chat_template(options.chat_template)
    count = count_tokens_fn(tokenizer, options)
    target_prompt = length - budget
    shared = task.prepare(tokenizer, length, options, seed)
    samples: list[Sample] = []
    guess = None
    for index, depth, draft in cell_drafts(task, length, num_samples, seed, options, depths, shared, indices):
        wrap = draft_wrap(draft, tpl)
        fitted = fit_draft(draft, count, wrap, target_prompt, guess) if target_prompt > 0 else None
        if fitted is None or (fitted.n, fitted.fill) < min_config(draft):
            raise below_minimum(task, tokenizer, length, num_samples, seed=seed, options=options, depths=depths,
                                indices=indices)
        guess = fitted.n
        if draft.n_max is not None and fitted.n >= draft.n_max and fitted.prompt_tokens + budget < 0.99 * length:
            warnings.warn(f"{task.name}: the haystack material ran out at {fitted.prompt_tokens + budget} "
                          f"of {length} tokens (a larger corpus/data file fills it)", stacklevel=2)
        if task.family != "qa":
            missing = [o for o in draft.outputs if o not in fitted.text]
            if missing:  # a bug, not a user error
                raise RuntimeError(f"{task.name}: answers {missing} missing from the generated context")
        meta = dict(draft.meta, haystack_units=fitted.n, filler_words=fitted.fill)
        samples.append(Sample(
            task=task.name, index=index, input=fitted.text, answer_prefix=draft.answer_prefix,
            outputs=list(draft.outputs), metric=task.metric, target_length=length, max_new_tokens=budget,
            prompt_tokens=fitted.prompt_tokens, depth=depth, stop=task.stop(options), chat_template=tpl,
            meta=meta, pre_template=draft.pre_template))
    return samples


__all__ = ["BelowMinimum", "NIAH_GRID_TASK", "RULER_TASKS", "STYLES", "Sample", "TASKS", "Task", "TaskOptions",
           "build_samples", "get_task", "no_fit_error", "skip_notice", "task_min_length"]
