"""Long-context evaluation: RULER tasks, needle grids, passkey, perplexity vs length.

    from longctx.eval import evaluate, build_samples, TaskOptions
    evaluate(model, tokenizer, tasks=[...], lengths=[...], samples=10, out_dir="eval/")

CLI: `longctx eval` (longctx/eval/cli.py: add_eval_parser, run_eval). See docs/eval.md.
"""
from longctx.eval.api import DEFAULT_DEPTHS, evaluate, generate_all
from longctx.eval.runner import Engine, run_samples
from longctx.eval.scoring import (DEFAULT_THRESHOLD, effective_length, string_match_all,
                                  string_match_part)
from longctx.eval.tasks import (NIAH_GRID_TASK, RULER_TASKS, TASKS, Sample, TaskOptions, build_samples,
                                get_task, task_min_length)

__all__ = [
    "DEFAULT_DEPTHS", "DEFAULT_THRESHOLD", "Engine", "NIAH_GRID_TASK", "RULER_TASKS", "Sample", "TASKS",
    "TaskOptions", "build_samples", "effective_length", "evaluate", "generate_all", "get_task", "run_samples",
    "string_match_all", "string_match_part", "task_min_length",
]
