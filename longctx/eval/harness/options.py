"""`--lm-eval`'s options and tasks, checked before any weight or torch loads (EvalConfig.validate).

    args = parse_args("num_fewshot=5,limit=100")     # {option: value}; UserError for a bad one
    check_tasks(["hellaswag"], args)                # UserError naming an unknown task
"""
from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Optional

from longctx.base.errors import UserError


def check_installed() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise UserError("eval.lm_eval: needs lm-evaluation-harness: pip install 'longctx[eval]'")


# simple_evaluate's options that --lm-eval-args may set (the rest are longctx's to choose)
OPTIONS = {"num_fewshot": int, "limit": float, "apply_chat_template": bool, "fewshot_as_multiturn": bool,
           "gen_kwargs": str, "include_path": str, "bootstrap_iters": int, "system_instruction": str,
           "confirm_run_unsafe_code": bool, "max_gen_toks": int, "add_bos_token": bool, "max_length": int}
MODEL_OPTIONS = ("max_gen_toks", "add_bos_token", "max_length")  # LongctxLM's, not simple_evaluate's


def _value(key: str, text: str):
    kind = OPTIONS[key]
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise UserError(f"eval.lm_eval_args: {key} must be true or false, got {text!r}")
        return text.lower() == "true"
    if kind is str:
        return text
    try:
        number = kind(text)
    except ValueError:
        raise UserError(f"eval.lm_eval_args: {key} must be a number, got {text!r}") from None
    return int(number) if kind is float and number >= 1 and number == int(number) else number


def parse_args(text: Optional[str]) -> dict:
    """--lm-eval-args "num_fewshot=5,limit=100" (or a JSON object) -> {option: value}; UserError naming
    an unknown option. A limit below 1 is a fraction of each task's samples, as lm-eval reads it."""
    if not text:
        return {}
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise UserError(f"eval.lm_eval_args: not valid JSON ({e})") from None
        pairs = {k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    else:
        pairs = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq:
                raise UserError(f"eval.lm_eval_args: {part!r} is not key=value")
            pairs[key.strip()] = value.strip()
    for key in pairs:
        if key not in OPTIONS:
            raise UserError(f"eval.lm_eval_args: unknown option {key!r}; valid: {', '.join(OPTIONS)}")
    out = {k: _value(k, str(v).strip('"')) for k, v in pairs.items()}
    if "include_path" in out and not Path(out["include_path"]).is_dir():
        raise UserError(f"eval.lm_eval_args: include_path {out['include_path']} is not a directory of task YAMLs")
    return out


@functools.lru_cache(maxsize=4)
def _index(include_path: Optional[str], defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=defaults)


def task_manager(tasks: tuple, include_path: Optional[str]):
    """lm-eval's index of the tasks: include_path's alone when it has every one of them (indexing
    lm-eval's own ~15k task YAMLs takes seconds), else lm-eval's with include_path's; built once per
    process."""
    if include_path is not None:
        local = _index(include_path, False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return _index(include_path, True)


def check_tasks(tasks: list[str], args: dict) -> None:
    """Every --lm-eval name is a task or group lm-eval knows (with include_path's), before any weight."""
    known = set(task_manager(tuple(tasks), args.get("include_path")).all_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise UserError(f"eval.lm_eval: unknown lm-eval task(s) {', '.join(unknown)} (`lm-eval ls tasks` lists "
                        "them; local task YAMLs: --lm-eval-args include_path=DIR)")


