"""Long-context evaluation: RULER tasks, needle grids, passkey, perplexity vs length.

    from longctx.eval import EvalConfig, evaluate
    evaluate(model, tokenizer, EvalConfig(tasks=["passkey"], lengths=["4k", "8k"], samples=10, out="eval/"))

CLI: `longctx eval` (longctx/commands/eval.py). See docs/eval.md.
"""
from longctx.eval.api import evaluate, generate_all
from longctx.eval.config import DEFAULT_DEPTHS, EvalConfig, EvalSelection, select
from longctx.eval.runner import Engine, run_samples
from longctx.eval.scoring import (DEFAULT_THRESHOLD, effective_length, string_match_all,
                                  string_match_part)
from longctx.eval.tasks import (NIAH_GRID_TASK, RULER_TASKS, TASKS, Sample, TaskOptions, build_samples,
                                get_task, task_min_length)

__all__ = [
    "DEFAULT_DEPTHS", "DEFAULT_THRESHOLD", "Engine", "EvalConfig", "EvalSelection", "NIAH_GRID_TASK", "RULER_TASKS",
    "Sample", "TASKS", "TaskOptions", "build_samples", "effective_length", "evaluate", "generate_all", "get_task",
    "run_samples", "select", "string_match_all", "string_match_part", "task_min_length",
]
