"""Long-context evaluation: RULER tasks, needle grids, passkey, perplexity vs length.

    from longctx.eval import EvalConfig, evaluate
    evaluate(model, tokenizer, EvalConfig(tasks=["passkey"], lengths=["4k", "8k"], samples=10, out="eval/"))

CLI: `longctx eval` (longctx/commands/eval.py). See docs/eval.md. The names below load on first
use, so importing one light module of the package (eval/fields.py for `--help`) loads no torch.
"""
import importlib

_EXPORTS = {
    "longctx.eval.api": ("evaluate",),
    "longctx.eval.prepare": ("generate_all",),
    "longctx.eval.config": ("DEFAULT_DEPTHS", "EvalConfig", "EvalSelection", "select"),
    "longctx.eval.runner": ("Engine", "run_samples"),
    "longctx.eval.state": ("EvalContext", "EvalResult"),
    "longctx.eval.scoring": ("DEFAULT_THRESHOLD", "effective_length", "string_match_all", "string_match_part"),
    "longctx.eval.tasks": ("NIAH_GRID_TASK", "RULER_TASKS", "TASKS", "Sample", "TaskOptions", "build_samples",
                           "get_task", "task_min_length"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'longctx.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
