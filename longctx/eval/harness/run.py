"""`longctx eval --lm-eval TASKS`: lm-eval's tasks on the loaded model, beside the RULER cells.

    section = run_tasks(cfg, model, tokenizer, identity=..., cp_group=g, stop=flag, overwrite=False)
    add_to_outputs(out, section)      # results.json's "lm_eval" and report.md's section

With --out every answer is kept in OUT/lm_eval/requests_rank<R>.db (lm-eval's request cache),
so the same command rerun after a stop continues from the finished requests; the cache belongs
to one model (OUT/lm_eval/identity.json: cells.run_identity) and another model's is refused
unless --overwrite. OUT/lm_eval/samples_<task>.jsonl has every sample's answers; results.json's
"lm_eval" holds lm-eval's metrics per task and every sample's score of the task's first metric
(what `--compare` pairs).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from longctx.eval.answers_dir import answers_dir
from longctx.eval.extra_sections import add_section
from longctx.eval.harness.model import LongctxLM
from longctx.eval.harness.options import MODEL_OPTIONS, parse_args, task_manager
from longctx.storage import atomic

SECTION = "lm_eval"


def _cache(out: Optional[str], identity: Optional[dict], overwrite: bool, main: bool) -> Optional[str]:
    """The request cache's path prefix in OUT/lm_eval (None without --out); every rank writes its
    own requests_rank<R>.db there."""
    d = answers_dir(out, SECTION, "lm-eval", identity, overwrite, main, every_rank=True)
    return None if d is None else str(d / "requests")


def run_tasks(cfg, model, tokenizer, *, identity: Optional[dict] = None, cp_group=None, stop=None,
              stop_token_ids=None, overwrite: bool = False, main: bool = True) -> Optional[dict]:
    """simple_evaluate over cfg.lm_eval with the model (Stopped propagates); results.json's section
    (None on the other ranks of a cp group: lm-eval aggregates on local rank 0 only)."""
    args = parse_args(cfg.lm_eval_args)
    model_args = {k: args.pop(k) for k in MODEL_OPTIONS if k in args}
    lm = LongctxLM(model, tokenizer, cp_group=cp_group, cp_impl=cfg.cp_impl, batch_size=cfg.batch_size,
                   max_batch_tokens=cfg.max_batch_tokens, stop_token_ids=stop_token_ids, stop=stop, **model_args)
    return _evaluate(cfg, lm, None, args, model_args, identity=identity, overwrite=overwrite, main=main)


def run_served(cfg, url: str, served: str, limit: Optional[int], *, identity: dict, overwrite: bool = False) -> dict:
    """cfg.lm_eval against a server, through lm-eval's own OpenAI-compatible models: local-completions
    (our tokenizer counts the tokens) or, with --endpoint-mode chat, local-chat-completions (the
    server's template: apply_chat_template on). The caller probed the server first."""
    args = parse_args(cfg.lm_eval_args)
    model_args = {k: args.pop(k) for k in MODEL_OPTIONS if k in args}
    chat = cfg.endpoint_mode == "chat"
    served_args = {"base_url": f"{url}/{'chat/completions' if chat else 'completions'}", "model": served,
                   "num_concurrent": cfg.concurrency, "max_retries": max(cfg.retries, 1),
                   "timeout": int(cfg.request_timeout_s), "tokenized_requests": False, **model_args}
    if chat:
        args.setdefault("apply_chat_template", True)
    else:
        served_args.update(tokenizer=str(cfg.tokenizer), tokenizer_backend="huggingface")
    if limit is not None:
        served_args.setdefault("max_length", limit)
    name = "local-chat-completions" if chat else "local-completions"
    return _evaluate(cfg, name, served_args, args, model_args, identity=identity, overwrite=overwrite, main=True)


def _evaluate(cfg, lm, lm_args: Optional[dict], args: dict, model_args: dict, *, identity, overwrite: bool,
              main: bool) -> Optional[dict]:
    from lm_eval import simple_evaluate

    include = args.pop("include_path", None)
    out = simple_evaluate(model=lm, model_args=lm_args, tasks=list(cfg.lm_eval),
                          task_manager=task_manager(tuple(cfg.lm_eval), include),
                          use_cache=_cache(cfg.out, identity, overwrite, main), log_samples=True,
                          random_seed=cfg.seed, numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed,
                          fewshot_random_seed=cfg.seed, **args)
    if out is None:
        return None
    if main and cfg.out is not None:
        write_samples(Path(cfg.out) / SECTION, out.get("samples") or {})
    return section(out, dict(args, include_path=include, **model_args))


def write_samples(d: Path, samples: dict) -> None:
    """OUT/lm_eval/samples_<task>.jsonl: each sample's doc id, target, the model's answers (raw and
    filtered) and its metrics, as lm-eval logs them."""
    skip = ("doc", "arguments", "doc_hash", "prompt_hash", "target_hash")
    for task, rows in samples.items():
        lines = [json.dumps({k: v for k, v in row.items() if k not in skip}, default=str) for row in rows]
        atomic.write_text(d / f"samples_{task}.jsonl", "".join(line + "\n" for line in lines))


def _number(value) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def section(out: dict, args: dict) -> dict:
    """results.json's "lm_eval": per task its metrics (name,filter -> value), the first metric's
    per-sample scores (on a 0-100 scale when every score lies in [0, 1]) and its sample count;
    the groups' subtasks."""
    tasks = {}
    for name, row in out["results"].items():
        metrics = {k: _number(v) for k, v in row.items() if k not in ("alias", "name", "sample_len") and "," in k}
        entry = {"metrics": {k: v for k, v in metrics.items() if v is not None}}
        samples = out.get("samples", {}).get(name)
        config = out.get("configs", {}).get(name, {})
        metric_list = config.get("metric_list") or []
        if samples and metric_list:
            metric = metric_list[0]["metric"]
            scores = {str(s["doc_id"]): _number(s.get(metric)) for s in samples}
            if scores and all(v is not None for v in scores.values()):
                scale = 100.0 if all(0.0 <= v <= 1.0 for v in scores.values()) else 1.0
                entry.update(metric=metric, scale=scale, scores={k: v * scale for k, v in scores.items()})
        entry["n"] = len(samples) if samples else out.get("n-samples", {}).get(name, {}).get("effective")
        tasks[name] = entry
    groups = {g: list(subs) for g, subs in (out.get("group_subtasks") or {}).items() if subs}
    return {"tasks": tasks, "groups": groups, "args": {k: v for k, v in args.items() if v is not None},
            "versions": {k: v for k, v in (out.get("versions") or {}).items()},
            "lm_eval_version": out.get("lm_eval_version") or _version()}


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def render(sec: dict) -> str:
    """report.md's section: one row per task and metric."""
    lines = ["## lm-evaluation-harness", "", f"lm-eval {sec['lm_eval_version']}; options: "
             f"{json.dumps(sec['args']) if sec['args'] else 'defaults'}", "",
             "| task | metric | value | ± s.e. | samples |", "|---|---|---:|---:|---:|"]
    for name, entry in sec["tasks"].items():
        metrics = entry["metrics"]
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if metric.endswith("_stderr"):
                continue
            se = metrics.get(f"{metric}_stderr,{filt}")
            label = metric if filt == "none" else f"{metric} ({filt})"
            lines.append(f"| {name} | {label} | {value:.4g} | {'-' if se is None else f'{se:.3g}'} | "
                         f"{entry.get('n') or '-'} |")
    return "\n".join(lines) + "\n"


def add_to_outputs(out: Path, sec: dict) -> None:
    """results.json gets the "lm_eval" section, report.md its table (each rewritten by a rename)."""
    add_section(out, SECTION, sec, "## lm-evaluation-harness", render(sec))
