"""What `longctx eval` does once its options are parsed (longctx/commands/eval.py builds the
parser from eval/fields.py alone, so `--help` loads none of this): the config from the command
line, the checks before any weight is read, the model and tokenizer, what --out already holds
(eval/cells.py: a rerun continues), the evaluation, the summary; SIGTERM / SIGUSR1 end it after
the batch in flight with exit code 85 (PREEMPTED_EXIT_CODE, as training)."""
from __future__ import annotations

import signal
import sys
import time
import typing
import warnings
from pathlib import Path

import torch

from longctx.base.errors import UserError
from longctx.checkpoint.adapter_source import adapter_source
from longctx.checkpoint.manifest import gather_objects
from longctx.checkpoint.safe_load import check_files
from longctx.data.tokenizer import check_tokenizer_spec
from longctx.eval import gate, mrcr_run
from longctx.eval.api import evaluate, out_lock
from longctx.eval.cells import run_identity
from longctx.eval.comparability import warning_line
from longctx.eval.config import TOKENIZER_FIELD, EvalConfig, select
from longctx.eval.end_summary import end_summary
from longctx.eval.endpoint.command import endpoint_chat, failure_line, run_endpoint
from longctx.eval.model_io import (
    check_lengths,
    check_pair,
    eval_device,
    is_ds_only_checkpoint,
    load_model,
    load_tokenizer_for,
    parse_dtype,
    resolve_model_dir,
    tokenizer_spec_for,
)
from longctx.eval.model_overrides import apply_overrides, base_model_config
from longctx.eval.prepare import prepare
from longctx.eval.ruler_prompts import write_prompts
from longctx.eval.runner import Engine
from longctx.eval.stall_watch import WatchedStop, stalls_end_the_job, start_watch
from longctx.eval.state import EvalContext, EvalResult
from longctx.eval.wandb_table import log_results
from longctx.model.auto.support import AutoModelSpec
from longctx.model.config import check_window
from longctx.parallel.mesh import build_mesh, init_distributed, shutdown_distributed
from longctx.runtime.launch_env import read_env
from longctx.runtime.watchdog import meet_at_end
from longctx.storage import atomic
from longctx.train.signals import PREEMPTED_EXIT_CODE, PreemptionFlag

ENDPOINT_FAILED_EXIT_CODE = 1  # a served model's requests failed for good: the finished cells are kept


def check(cfg: EvalConfig, world_size: int) -> typing.Optional[Path]:
    """Every check before any weight is read or process group exists; returns the model directory
    (None for write_data without a model: validate checked its tokenizer)."""
    cfg.validate(world_size)
    if not cfg.model:
        return None
    model_dir = resolve_model_dir(cfg.model, cfg.revision)  # UserError for a bad path or Hub id, before the weights
    model_config, _ = apply_overrides(base_model_config(model_dir), cfg.model_overrides)
    _checks_before_writing(cfg, model_dir, model_config)
    check_tokenizer_spec(tokenizer_spec_for(model_dir, cfg.tokenizer), TOKENIZER_FIELD)
    return model_dir


def run(cfg: EvalConfig, *, overwrite: bool = False) -> int:
    """`longctx eval` with a config that passed cfg.validate (commands/eval.py); a UserError
    propagates to the CLI layer (exit 2). Returns 0, or PREEMPTED_EXIT_CODE after a SIGTERM /
    SIGUSR1 (the finished cells are in --out)."""
    start = time.monotonic()
    world = read_env().world_size
    if cfg.write_data is not None:  # prompts only, no weights
        files, skipped = write_prompts(cfg)
        for s in skipped:
            print(s, file=sys.stderr)
        print(f"wrote {len(files)} RULER data files under {cfg.write_data}")
        return 0
    flag = PreemptionFlag().install()  # from here: a signal while the weights load stops after one batch
    try:
        if cfg.endpoint is not None:  # a served model: eval/endpoint/
            result = run_endpoint(cfg, flag, overwrite=overwrite)
            if failure_line(result):
                print(failure_line(result), file=sys.stderr, flush=True)
                return ENDPOINT_FAILED_EXIT_CODE
            if (cfg.mrcr or cfg.lm_eval) and not result.preempted:
                with endpoint_chat(cfg) as (client, info, tokenizer):
                    identity = {"endpoint": info.url, "served_model": info.model, "mode": cfg.endpoint_mode}
                    if cfg.lm_eval:
                        _served_lm_eval(cfg, info, result, identity, overwrite)
                    if cfg.mrcr:
                        _mrcr(cfg, mrcr_run.endpoint_answerer(client, info.model, tokenizer, cfg.max_new_tokens),
                              result, None, stop=flag, identity=identity, overwrite=overwrite)
        else:
            result = _evaluate(cfg, world, flag, overwrite=overwrite)
    finally:
        flag.uninstall()
    if result.preempted:
        if read_env().rank == 0:
            print(_preempted_line(result.preempted), file=sys.stderr, flush=True)
        return PREEMPTED_EXIT_CODE
    if result.files:
        for s in result.skipped:
            print(s, file=sys.stderr)
        for note in (result.ppl or {}).get("notes", []):
            print(f"warning: {note}", file=sys.stderr)
        _print_summary(result)
        if cfg.wandb_project is not None and read_env().rank == 0:
            log_results(cfg, result)
        if result.comparability and not result.comparability["ruler_comparable"]:
            print(warning_line(result.comparability), file=sys.stderr)
        print(end_summary(result, time.monotonic() - start))
        if cfg.compare is not None and read_env().rank == 0:
            return _compare(cfg, result)
    return 0


def _compare(cfg: EvalConfig, result: EvalResult) -> int:
    """--compare: the paired differences against the base's results.json (eval/gate.py), written
    beside the results; REGRESSED_EXIT_CODE when a gated task regressed, else 0."""
    report = gate.compare(gate.load_base(cfg.compare), {"lm_eval": result.lm_eval, "samples": result.records},
                          threshold=cfg.gate_threshold, tasks=cfg.gate_tasks)
    if cfg.out is not None:
        gate.add_to_outputs(Path(cfg.out), report, cfg.compare)
    for line in gate.lines(report):
        print(line)
    return gate.REGRESSED_EXIT_CODE if report["regressed"] else 0


def _evaluate(cfg: EvalConfig, world: int, flag: PreemptionFlag, *, overwrite: bool) -> EvalResult:
    """Plan (samples, cells, what --out already has) before the weights load; then evaluate,
    holding --out's lock (rank 0) from the plan to the last write."""
    model_dir = resolve_model_dir(cfg.model, cfg.revision)
    model_config, overrides = apply_overrides(base_model_config(model_dir), cfg.model_overrides)  # config.json only
    _checks_before_writing(cfg, model_dir, model_config)
    spec = tokenizer_spec_for(model_dir, cfg.tokenizer)
    tokenizer = load_tokenizer_for(model_dir, cfg.tokenizer)
    identity = run_identity(model_dir, spec, cfg.dtype, model_overrides=overrides) if cfg.out is not None else None
    with out_lock(cfg.out) as release_lock:
        main = read_env().rank == 0
        plan = prepare(cfg, tokenizer, identity=identity, model_path=str(model_dir), overwrite=overwrite,
                       remove=main, notify=atomic.note if main else (lambda line: None))
        return _load_and_evaluate(cfg, world, flag, model_dir, tokenizer, plan,
                                  (model_config if overrides else None, overrides), release_lock, identity, overwrite)


def _load_and_evaluate(cfg: EvalConfig, world: int, flag: PreemptionFlag, model_dir: Path, tokenizer, plan,
                       override: tuple, release_lock: typing.Callable[[], None], identity: typing.Optional[dict] = None,
                       overwrite: bool = False) -> EvalResult:
    """override: (the overridden ModelConfig or None, the overridden fields as the model runs with
    them); release_lock: --out's (a stall's exit runs it); identity: the model's (cells.run_identity),
    which lm-eval's request cache in --out belongs to."""
    check_eval_window(override[0] or base_model_config(model_dir), plan.run.lengths + plan.run.ppl_lengths)
    adapter = adapter_source(model_dir)  # an adapter run: its base + adapter, or its merged export
    if adapter is not None and read_env().rank == 0:
        print(adapter["description"], flush=True)
    model = load_model(model_dir, dtype=parse_dtype(cfg.dtype), config=override[0]).eval()
    model.to(eval_device(cfg.device, read_env().local_rank))
    check_pair(tokenizer, model.config)
    notes = _length_warnings(cfg, model.config, plan.run)
    cp_group, watchdog = None, None
    if world > 1:
        init_distributed(timeout_s=cfg.startup_timeout_s)
        watchdog = start_watch(cfg, read_env().rank, world, on_end=release_lock)
        mesh = build_mesh(cfg.cp, cfg.startup_timeout_s)
        cp_group = mesh.cp_group if cfg.cp > 1 else None
    completed = False
    try:
        with stalls_end_the_job(watchdog):  # a stalled peer: exit 86, the finished cells kept
            _check_ranks_agree(plan)
            torch.manual_seed(0)
            meta = dict(_meta(cfg, model, model_dir, tokenizer, plan.run), model_overrides=override[1])
            if adapter is not None:  # only an adapter run's meta has the key (a served eval's has none)
                meta["adapter"] = adapter
            stop = flag if watchdog is None else WatchedStop(flag, watchdog)
            result = evaluate(model, tokenizer, cfg, plan=plan, stop=stop,
                              context=EvalContext(cp_group=cp_group, meta=meta, warnings=notes))
            if cfg.lm_eval and not result.preempted:
                _lm_eval(cfg, model, tokenizer, plan, result, cp_group=cp_group, stop=stop, identity=identity,
                         overwrite=overwrite)
            if cfg.mrcr and not result.preempted:
                engine = Engine(model, tokenizer, cp_group=cp_group, cp_impl=cfg.cp_impl, stop_ids=plan.stop_ids)
                _mrcr(cfg, mrcr_run.model_answerer(engine, tokenizer, cfg.max_new_tokens), result, plan, stop=stop,
                      identity=identity, overwrite=overwrite)
            if result.preempted:  # which signal stopped it (it may have reached another rank only)
                result.preempted["signal"] = next((s for s in gather_objects(flag.received) if s), None)
        completed = True
    finally:
        if completed and world > 1:
            meet_at_end(watchdog)
        shutdown_distributed(False)  # met above after a completed evaluation
        if watchdog is not None:
            watchdog.stop()
    return result


def _lm_eval(cfg: EvalConfig, model, tokenizer, plan, result: EvalResult, **kwargs) -> None:
    """lm-eval's tasks on the model (eval/harness/); their section joins results.json and report.md,
    or a stop marks the result preempted (the finished requests are in --out's request cache)."""
    from longctx.eval.harness.model import Stopped
    from longctx.eval.harness.run import add_to_outputs, run_tasks

    main = read_env().rank == 0
    try:
        section = run_tasks(cfg, model, tokenizer, stop_token_ids=plan.stop_ids, main=main, **kwargs)
    except Stopped:
        result.preempted = {"cells_done": len(plan.cells), "cells": len(plan.cells), "out": cfg.out,
                            "partial": ["lm-eval's tasks (the finished requests are kept)" if cfg.out else
                                        "lm-eval's tasks"]}
        return
    if section is not None and main and cfg.out is not None:
        add_to_outputs(Path(cfg.out), section)
    result.lm_eval = section


def _served_lm_eval(cfg: EvalConfig, info, result: EvalResult, identity: dict, overwrite: bool) -> None:
    """lm-eval's tasks against the server that passed longctx's checks (eval/harness/run.run_served)."""
    from longctx.eval.harness.run import add_to_outputs, run_served

    section = run_served(cfg, info.url, info.model, info.limit, identity=identity, overwrite=overwrite)
    if cfg.out is not None and result.files:
        add_to_outputs(Path(cfg.out), section)
    result.lm_eval = section


def _mrcr(cfg: EvalConfig, answer, result: EvalResult, plan, **kwargs) -> None:
    """MRCR (eval/mrcr_run.py): its section joins results.json and report.md, or a stop marks the
    result preempted (the answered rows are kept in --out)."""
    main = read_env().rank == 0
    section, finished = mrcr_run.run(cfg, answer, main=main, **kwargs)
    if not finished:
        cells = len(plan.cells) if plan is not None else 0
        result.preempted = {"cells_done": cells, "cells": cells, "out": cfg.out,
                            "partial": [f"MRCR ({cfg.mrcr})" + (": the answered rows are kept" if cfg.out else "")]}
        return
    if main and cfg.out is not None and result.files:
        mrcr_run.add_to_outputs(Path(cfg.out), section)
    result.mrcr = section


def _check_ranks_agree(plan) -> None:
    """Every rank reuses the same cells (they read --out each; it must be on a shared file system)."""
    signatures = gather_objects(plan.signature())
    if any(s != signatures[0] for s in signatures):
        bad = next(r for r, s in enumerate(signatures) if s != signatures[0])
        raise UserError(f"eval.out: rank {bad} sees other cells in {plan.store.out} than rank 0; --out must be on a "
                        "file system every rank shares")


def _preempted_line(info: dict) -> str:
    """e.g. preempted (SIGTERM): 3 of 8 cells done in eval/x (and 4 of 8 samples of passkey at
    512); exit code 85; run the same command again to continue."""
    name = signal.Signals(info["signal"]).name if info.get("signal") else "a signal"
    partial = f" (and {', '.join(info['partial'])})" if info["partial"] else ""
    where = f" in {info['out']}" if info["out"] else " (no --out: nothing kept)"
    return (f"preempted ({name}): {info['cells_done']} of {info['cells']} cells done{where}{partial}; exit code "
            f"{PREEMPTED_EXIT_CODE}; run the same command again to continue")


def _checks_before_writing(cfg: EvalConfig, model_dir: Path, model_config) -> None:
    """What would stop the evaluation once the weights load, checked before --out is made: a
    transformers-path model at cp > 1 (no CP decoding for it), a checkpoint without model/ has its
    DeepSpeed files read by the weights_only unpickler
    (DeepSpeed's consolidation unpickles freely), and the sliding window fits the lengths."""
    if isinstance(model_config, AutoModelSpec) and cfg.cp > 1:
        raise UserError(f"eval.cp: {cfg.cp} needs longctx's own context-parallel decoding of the native families; a "
                        f"{model_config.model_type} model (transformers path) evaluates at eval.cp=1")
    if is_ds_only_checkpoint(model_dir):
        check_files(sorted((model_dir / "ds").glob("*.pt")))
    if cfg.ruler_data is None:  # with ruler_data the lengths are the data's: checked once it is read
        selection = select(cfg)
        check_eval_window(model_config, selection.lengths + selection.ppl_lengths)


def check_eval_window(model_config, lengths: list[int]) -> None:
    """A sliding window shorter than the longest length: one UserError (longctx runs full attention)."""
    if lengths:
        check_window(model_config, max(lengths), "eval.lengths", "eval.model_overrides.sliding_window=null")


def _length_warnings(cfg: EvalConfig, model_config, selection) -> list[str]:
    """Lengths beyond max_position_embeddings: printed as warnings (or an error with strict_lengths)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notes = check_lengths(sorted(set(selection.lengths) | set(selection.ppl_lengths)), model_config,
                              cfg.strict_lengths)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return notes


def _meta(cfg: EvalConfig, model, model_dir: Path, tokenizer, selection) -> dict:
    """selection: the plan's (with ruler_data, its lengths are the data's)."""
    suite = "ruler_data" if cfg.ruler_data is not None else ",".join(cfg.suite) if cfg.tasks is None else "tasks"
    return {"model": str(model_dir), "tokenizer": getattr(tokenizer, "name", str(cfg.tokenizer)), "suite": suite,
            "cp": cfg.cp,
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "max_position_embeddings": model.config.max_position_embeddings,
            "rope_parameters": model.config.rope_parameters, "lengths": selection.lengths,
            "tasks": selection.tasks}


def _print_summary(result: EvalResult) -> None:
    summary = result.summary
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
    if result.mrcr:
        print(f"mrcr: {result.mrcr['summary']['all']['score']:.1f} over {result.mrcr['summary']['all']['n']} samples")
    if result.ppl:
        print("ppl: " + ", ".join(f"{r['length']}: {r['ppl']:.3f}" for r in result.ppl["rows"]))
    for name, entry in ((result.lm_eval or {}).get("tasks") or {}).items():
        shown = [f"{k.partition(',')[0]} {v:.4g}" for k, v in entry["metrics"].items() if "_stderr" not in k]
        print(f"lm-eval {name}: {', '.join(shown)}")
