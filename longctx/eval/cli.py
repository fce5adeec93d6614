"""`longctx eval`: RULER tasks, needle grids, passkey and perplexity vs length.

    longctx eval --model RUN_OR_HF_DIR --suite ruler --lengths 4k,8k,16k --samples 50 --out eval/
    torchrun --nproc-per-node 4 -m longctx eval --model DIR --suite niah --lengths 128k --cp 4 --out eval/
    longctx eval --config eval.yaml [--samples 5 ...]      # same keys as the flags (dashes or underscores)

The lead's longctx/cli.py wires this in with add_eval_parser(subparsers) and run_eval(args).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from longctx.cli import OneLineParser
from longctx.data.tokenizer import check_tokenizer_spec
from longctx.errors import UserError

CP_IMPLS = ("ring", "allgather", "ulysses")
SUITES = ("ruler", "niah", "passkey", "ppl")
DEFAULTS = {
    "suite": "ruler", "tasks": None, "lengths": "4096", "samples": 10, "out": "eval_out", "seed": 0,
    "tokenizer": None, "dtype": "auto", "batch_size": None, "max_batch_tokens": 16384, "cp": 1,
    "cp_impl": "ring", "depths": None, "style": "ruler", "max_new_tokens": None, "chat_template": None,
    "essay": None, "squad": None, "hotpotqa": None, "ppl_data": None, "ppl_windows": 4, "ppl_lengths": None,
    "threshold": 85.6, "strict_lengths": False, "save_inputs": False, "no_progress": False, "model": None,
    "num_digits": None,
}


def add_eval_parser(subparsers_or_parser) -> argparse.ArgumentParser:
    """Register the eval options: given argparse subparsers, adds an "eval" sub-command; given a
    parser (longctx/cli.py passes the one it created for "eval"), adds the options to it."""
    if hasattr(subparsers_or_parser, "add_parser"):
        p = subparsers_or_parser.add_parser("eval", help="long-context evaluation (RULER, needle grid, passkey, ppl)",
                                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        p = subparsers_or_parser
    _add_arguments(p)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument  # defaults live in DEFAULTS so a --config file can fill what flags leave unset
    a("--config", help="YAML/JSON file with any of the options below (flags win)")
    a("--model", help="HF directory, training checkpoint or run directory")
    a("--tokenizer", help="'byte', tokenizer.json or tokenizer dir (default: the model's own)")
    a("--suite", help=f"comma list of {', '.join(SUITES)} (default ruler)")
    a("--tasks", help="comma list of task names (replaces the suite's tasks)")
    a("--lengths", help="comma list of context lengths, e.g. 4096,8k,16k (default 4096)")
    a("--samples", type=int, help="samples per task and length (per depth for grids; default 10)")
    a("--out", help="output directory (default eval_out)")
    a("--seed", type=int, help="data seed (default 0)")
    a("--dtype", help="auto | fp32 | bf16 | fp16 (default: as stored)")
    a("--batch-size", type=int, help="fixed decoding batch size (default: from --max-batch-tokens)")
    a("--max-batch-tokens", type=int, help="prompt tokens per batch when --batch-size is unset (default 16384)")
    a("--cp", type=int, help="context-parallel size for prefill/decoding (run under torchrun; default 1)")
    a("--cp-impl", help="ring | allgather | ulysses (default ring)")
    a("--depths", help="needle depths in [0,1] for grids, e.g. 0,0.25,0.5,0.75,1 (default 11 points)")
    a("--style", help="ruler (RULER's templates and budgets) | compact (for tiny models/short lengths)")
    a("--max-new-tokens", type=int, help="override every task's generation budget")
    a("--num-digits", type=int, help="digits of numeric needle values and pass keys")
    a("--chat-template", help="llama2-chat | llama3-chat | chatml | a string with {input}")
    a("--essay", help="local text corpus (file or folder) for the essay haystack")
    a("--squad", help="local SQuAD v2 dev json for qa_1")
    a("--hotpotqa", help="local HotpotQA dev (distractor) json for qa_2")
    a("--ppl-data", help="long documents for perplexity (file or folder of .txt/.jsonl)")
    a("--ppl-lengths", help="lengths for perplexity (default: --lengths)")
    a("--ppl-windows", type=int, help="windows per length for perplexity (default 4)")
    a("--threshold", type=float, help="effective-length threshold (default 85.6)")
    a("--strict-lengths", action="store_true", default=None,
      help="error (instead of warn) on lengths above the model's max_position_embeddings")
    a("--save-inputs", action="store_true", default=None, help="keep each prompt in results.json")
    a("--no-progress", action="store_true", default=None, help="no progress bars")


def parse_lengths(text, field: str = "eval.lengths") -> list[int]:
    if isinstance(text, int):
        return [text]
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = []
    for item in items:
        s = str(item).strip().lower()
        if not s:
            continue
        mult = 1
        if s.endswith("k"):
            s, mult = s[:-1], 1024
        elif s.endswith("m"):
            s, mult = s[:-1], 1024 * 1024
        try:
            value = int(float(s) * mult)
        except ValueError:
            raise UserError(f"{field}: {item!r} is not a length (use integers or 4k/8k-style values)") from None
        if value <= 0:
            raise UserError(f"{field}: lengths must be positive, got {item!r}")
        out.append(value)
    if not out:
        raise UserError(f"{field}: no lengths given")
    return sorted(set(out))


def _parse_list(text) -> list[str]:
    if text is None:
        return []
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


def _load_config_file(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise UserError(f"--config: {path} {what} (expected a YAML or JSON file of eval options)")
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError, OmegaConfBaseException) as e:
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"--config: {path} is not valid {'JSON' if p.suffix == '.json' else 'YAML'} ({problem})") from None
    if isinstance(data, dict) and isinstance(data.get("eval"), dict):
        data = data["eval"]
    if not isinstance(data, dict) or not data:
        what = "is empty" if not data else f"holds a {type(data).__name__}"
        raise UserError(f"--config: {path} {what}; expected a mapping of eval options (e.g. 'samples: 10')")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(data) - set(DEFAULTS))
    if unknown:
        raise UserError(f"--config: {path}: unknown option {unknown[0]!r}; valid: {', '.join(sorted(DEFAULTS))}")
    return data


def resolve_options(args) -> dict:
    """Flags > config file > defaults, as one plain dict."""
    given = {k: v for k, v in vars(args).items() if v is not None and k in DEFAULTS}
    cfg = _load_config_file(args.config) if getattr(args, "config", None) else {}
    opts = dict(DEFAULTS)
    opts.update(cfg)
    opts.update(given)
    return opts


def _plan(opts: dict):
    from longctx.eval.api import DEFAULT_DEPTHS
    from longctx.eval.tasks import NIAH_GRID_TASK, RULER_TASKS, get_task

    suites = _parse_list(opts["suite"])
    for s in suites:
        if s not in SUITES:
            raise UserError(f"eval.suite: unknown suite {s!r}; valid: {', '.join(SUITES)}")
    depths_given = opts["depths"] is not None
    depths = [_number(x, "eval.depths", float) for x in _parse_list(opts["depths"])] if depths_given else DEFAULT_DEPTHS
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise UserError(f"eval.depths: {d} is outside [0, 1]")
    tasks, grid = [], {}
    if opts["tasks"] is not None:
        tasks = _parse_list(opts["tasks"])
        for t in tasks:
            get_task(t)  # unknown task -> UserError
        if depths_given:
            grid = {t: depths for t in tasks if get_task(t).family in ("niah", "passkey")}
    else:
        for s in suites:
            if s == "ruler":
                tasks += RULER_TASKS
            elif s in ("niah", "passkey"):
                name = NIAH_GRID_TASK if s == "niah" else "passkey"
                tasks.append(name)
                grid[name] = depths
    tasks = list(dict.fromkeys(tasks))
    return tasks, grid, "ppl" in suites


def _check_cp(cp: int) -> None:
    """--cp against the processes this eval runs in (WORLD_SIZE), before any process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cp < 1:
        raise UserError(f"eval.cp: must be >= 1, got {cp}")
    if world == 1 and cp > 1:
        raise UserError(f"eval.cp={cp} needs {cp} processes: torchrun --nproc-per-node {cp} -m longctx eval ...")
    if world % cp != 0:
        raise UserError(f"eval.cp={cp} must divide the number of processes ({world})")


def _setup_distributed(cp: int):
    _check_cp(cp)
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return None
    from longctx.parallel.mesh import build_mesh, init_distributed

    init_distributed()
    mesh = build_mesh(cp)
    return mesh.cp_group if cp > 1 else None


def _number(value, field: str, kind=int, minimum=None, maximum=None):
    """An option as int/float in [minimum, maximum]; a bad value names `field`."""
    try:
        if isinstance(value, bool):
            raise ValueError
        number = kind(value)
        if kind is int and isinstance(value, float) and value != number:
            raise ValueError
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise UserError(f"{field}: must be {what}, got {value!r}") from None
    if kind is float and not math.isfinite(number):
        raise UserError(f"{field}: must be a finite number, got {value!r}")
    if minimum is not None and number < minimum:
        raise UserError(f"{field}: must be >= {minimum}, got {value!r}")
    if maximum is not None and number > maximum:
        raise UserError(f"{field}: must be <= {maximum}, got {value!r}")
    return number


def _check_paths(opts: dict) -> None:
    """Local data files named by options exist; --out is (or can become) a writable directory."""
    from longctx.config import check_out_dir

    for key in ("essay", "squad", "hotpotqa", "ppl_data"):
        if opts[key] is not None and not Path(str(opts[key])).exists():
            raise UserError(f"eval.{key}: {opts[key]} does not exist")
    check_out_dir(str(opts["out"]), "eval.out")


def check_options(opts: dict) -> dict:
    """Every check that needs no model, weights or process group, in one place; returns the
    parsed values run_eval uses (lengths, tasks, grid, want_ppl, ppl_lengths, options, dtype)."""
    from longctx.eval.model_io import parse_dtype
    from longctx.eval.tasks import TaskOptions

    if not opts["model"]:
        raise UserError("eval.model: required (--model DIR: an HF directory, checkpoint or run directory)")
    parsed = {"lengths": parse_lengths(opts["lengths"])}
    opts["samples"] = _number(opts["samples"], "eval.samples", int, 1)
    opts["seed"] = _number(opts["seed"], "eval.seed", int, 0)
    opts["cp"] = _number(opts["cp"], "eval.cp", int)
    opts["max_batch_tokens"] = _number(opts["max_batch_tokens"], "eval.max_batch_tokens", int, 1)
    opts["ppl_windows"] = _number(opts["ppl_windows"], "eval.ppl_windows", int, 1)
    opts["threshold"] = _number(opts["threshold"], "eval.threshold", float, 0, 100)
    if opts["batch_size"] is not None:
        opts["batch_size"] = _number(opts["batch_size"], "eval.batch_size", int, 1)
    for key in ("max_new_tokens", "num_digits"):
        if opts[key] is not None:
            opts[key] = _number(opts[key], f"eval.{key}", int)
    parsed["tasks"], parsed["grid"], want_ppl = _plan(opts)
    parsed["want_ppl"] = want_ppl
    parsed["options"] = TaskOptions(style=opts["style"], max_new_tokens=opts["max_new_tokens"],
                                    essay_path=opts["essay"], squad_path=opts["squad"],
                                    hotpotqa_path=opts["hotpotqa"], chat_template=opts["chat_template"],
                                    num_digits=opts["num_digits"])
    parsed["dtype"] = parse_dtype(opts["dtype"])
    if opts["cp_impl"] not in CP_IMPLS:
        raise UserError(f"eval.cp_impl: {opts['cp_impl']!r} is not valid; valid: {', '.join(CP_IMPLS)}")
    parsed["ppl_lengths"] = parse_lengths(opts["ppl_lengths"], "eval.ppl_lengths") if (want_ppl and opts["ppl_lengths"]) else (
        parsed["lengths"] if want_ppl else [])
    _check_cp(opts["cp"])
    _check_paths(opts)
    if opts["tokenizer"] is not None:
        _as_eval_field(check_tokenizer_spec, str(opts["tokenizer"]))
    return parsed


def _as_eval_field(fn, *args):
    """fn(*args) with the data section's tokenizer errors named as eval's --tokenizer."""
    try:
        return fn(*args)
    except UserError as e:
        msg = str(e)
        if msg.startswith("data.tokenizer"):
            msg = "eval.tokenizer" + msg[len("data.tokenizer"):]
        raise UserError(msg) from None


def run_eval(args) -> int:
    """Entry point for `longctx eval`; UserError propagates to the CLI layer (exit 2)."""
    from longctx.eval.model_io import check_lengths, check_pair, load_tokenizer_for, resolve_model_dir

    opts = resolve_options(args)
    parsed = check_options(opts)
    lengths, ppl_lengths = parsed["lengths"], parsed["ppl_lengths"]
    model_dir = resolve_model_dir(opts["model"])  # UserError for a missing/invalid path, before the weights
    tokenizer = _as_eval_field(load_tokenizer_for, model_dir, opts["tokenizer"])
    model = _load_weights(model_dir, parsed["dtype"])
    check_pair(tokenizer, model.config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notes = check_lengths(sorted(set(lengths) | set(ppl_lengths)), model.config, bool(opts["strict_lengths"]))
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    cp_group = _setup_distributed(int(opts["cp"]))
    completed = False
    try:
        rc = _evaluate_and_report(opts, model, model_dir, tokenizer, parsed["tasks"], parsed["grid"], lengths,
                                  ppl_lengths, parsed["options"], cp_group, opts["cp_impl"], notes)
        completed = True
        return rc
    finally:
        from longctx.parallel.mesh import shutdown_distributed

        shutdown_distributed(completed)


def tokenizer_spec_for_eval(model_dir: Path, spec):
    """The tokenizer the model is evaluated with (UserError named eval.tokenizer), unloaded."""
    from longctx.eval.model_io import tokenizer_spec_for

    found = _as_eval_field(tokenizer_spec_for, model_dir, spec)
    _as_eval_field(check_tokenizer_spec, found)
    return found


def _load_weights(model_dir: Path, dtype):
    from longctx.model.hf import load_pretrained

    model = load_pretrained(model_dir, dtype=dtype)
    model.eval()
    return model


def _evaluate_and_report(opts, model, model_dir, tokenizer, tasks, grid, lengths, ppl_lengths, options,
                         cp_group, cp_impl, notes) -> int:
    import torch

    from longctx.eval.api import evaluate

    torch.manual_seed(0)
    meta = {"model": str(model_dir), "tokenizer": getattr(tokenizer, "name", str(opts["tokenizer"])),
            "suite": opts["suite"] if opts["tasks"] is None else "tasks", "cp": int(opts["cp"]),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "max_position_embeddings": model.config.max_position_embeddings, "lengths": lengths, "tasks": tasks}
    result = evaluate(model, tokenizer, tasks=tasks, lengths=lengths if tasks else [], samples=int(opts["samples"]),
                      seed=int(opts["seed"]), options=options, depths=grid, ppl_lengths=ppl_lengths,
                      ppl_windows=int(opts["ppl_windows"]), ppl_data=opts["ppl_data"], cp_group=cp_group,
                      cp_impl=cp_impl, batch_size=opts["batch_size"], max_batch_tokens=int(opts["max_batch_tokens"]),
                      threshold=float(opts["threshold"]), out_dir=opts["out"], meta=meta,
                      progress=not opts["no_progress"], save_inputs=bool(opts["save_inputs"]), warnings_=notes)
    if result["files"]:
        for s in result["skipped"]:
            print(s, file=sys.stderr)
        _print_summary(result)
        print(f"wrote {', '.join(result['files'])}")
    return 0


def _print_summary(result: dict) -> None:
    summary = result["summary"]
    lengths = summary.get("lengths", [])
    if summary.get("tasks"):
        width = max(len(t) for t in summary["tasks"]) + 2
        print("task".ljust(width) + "".join(f"{L:>9}" for L in lengths))
        for name, t in summary["tasks"].items():
            print(name.ljust(width) + "".join(f"{t['scores'].get(str(L), float('nan')):9.1f}" for L in lengths))
        print("average".ljust(width) + "".join(f"{summary['average_by_length'][str(L)]:9.1f}" for L in lengths))
        se = summary.get("average_stderr_by_length", {})
        if se:  # the sampling noise of the average (one standard error over the samples)
            print("± (std err)".ljust(width) + "".join(f"{se.get(str(L), float('nan')):9.1f}" for L in lengths))
        print(f"effective length (> {summary['threshold']}): {summary['effective_length'] or 'none'}")
    if result.get("ppl"):
        print("ppl: " + ", ".join(f"{r['length']}: {r['ppl']:.3f}" for r in result["ppl"]["rows"]))


def main(argv: Optional[list[str]] = None) -> int:
    parser = OneLineParser(prog="python -m longctx.eval.cli", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a one-line argparse error (2)
        return e.code if isinstance(e.code, int) else 2
    try:
        return run_eval(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
