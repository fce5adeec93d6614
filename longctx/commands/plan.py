"""`longctx plan --config FILE [key=value ...] [--gpus N] [--gpu-mem 80GB] [--seq-len 128k]`.

Per-device memory of every stage of a training config (parameters, gradients, optimizer
states by ZeRO stage and offload, activations under the checkpointing policy, attention and
loss workspaces, communication buffers, runtime), whether it fits, and advice: for the target
length (default: the longest stage), the smallest context-parallel size -- and for it the
lowest ZeRO stage and the least activation checkpointing -- that fits, per cp size.

Defaults come from a recipe's `# cluster: nodes=N gpus_per_node=G gpu_mem=80GB` line when the
config has one, else 8 GPUs of 80 GB. No model is built and nothing is allocated.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from longctx.config import RunStage, load_config, resolve_stages, stage_model_config, validate_portable
from longctx.errors import UserError
from longctx.model.config import PRESETS, ModelConfig
from longctx.parallel.layout import ulysses_degree, validate_cp
from longctx.plan import (GPU_USABLE, Layout, estimate_layout, format_estimate, layout_of, parse_length, parse_size,
                          relative_time_per_token)

CHECKPOINTING_ORDER = ("none", "selective", "full")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument("--config", default=None, help="training YAML (default: the built-in defaults)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. parallel.cp_size=4 data.seq_len=131072")
    p.add_argument("--gpus", type=int, default=None, help="world size: processes/GPUs in the job")
    p.add_argument("--gpu-mem", default=None, help="memory per GPU, e.g. 80GB, 141GB, 24GiB (default 80GB)")
    p.add_argument("--seq-len", default=None, help="target length for the advice, e.g. 131072 or 128k "
                                                   "(default: the longest stage)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="gpu (caching allocator, CUDA context) or cpu (process RSS, gloo)")
    p.add_argument("--runtime-gb", type=float, default=None,
                   help="fixed per-process runtime memory (default: 1.5 on GPU, 0.36 measured on CPU)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--check", action="store_true", help="exit with code 3 when a stage does not fit")


def _cluster_defaults(config: Optional[str]) -> dict:
    if not config:
        return {}
    try:
        text = Path(config).read_text()
    except OSError:
        return {}
    m = re.search(r"^#\s*cluster:\s*(.*)$", text, re.MULTILINE)
    if not m:
        return {}
    return dict(item.split("=", 1) for item in m.group(1).split() if "=" in item)


def _model_config(stage: RunStage, notes: list):
    m = stage.model
    if m.init_from and not (Path(m.init_from) / "config.json").is_file():
        if m.preset in PRESETS:
            notes.append(f"model.init_from {m.init_from} not found: planning with the architecture of "
                         f"model.preset={m.preset}")
            stage = dataclasses.replace(stage, model=dataclasses.replace(m, init_from=None))
        # else stage_model_config raises the usual one-line error
    return stage_model_config(stage)


def _valid_cp(cp: int, layout: Layout, model_cfg: ModelConfig) -> bool:
    """Whether the trainer accepts this cp size for the layout (longctx.parallel.layout's checks)."""
    try:
        validate_cp(layout.world_size, cp, layout.cp_impl, ulysses_degree(layout.cp_impl, cp, layout.ulysses_size),
                    model_cfg.num_attention_heads, model_cfg.num_key_value_heads, layout.seq_len)
    except UserError:
        return False
    return True


def advise(model_cfg, layout, device_bytes: float, *, device: str, runtime_gb: Optional[float]) -> list[dict]:
    """For each valid cp size (ascending): of the options that fit (ZeRO 0..3 x checkpointing
    none/selective/full), the one with the lowest predicted time per token (ties: the lower
    ZeRO stage, less checkpointing); optimizer offload only when none fits without it."""
    rows = []
    world = layout.world_size
    for cp in range(1, world + 1):
        if not _valid_cp(cp, layout, model_cfg):
            continue
        found = None
        smallest = None
        for options in ([(z, ac, False) for z in (0, 1, 2, 3) for ac in CHECKPOINTING_ORDER],
                        [(z, "full", True) for z in (2, 3)]):
            for z, ac, offload in options:
                lay = dataclasses.replace(layout, cp_size=cp, zero_stage=z, activation_checkpointing=ac,
                                          offload_optimizer=offload, offload_params=False)
                est = estimate_layout(model_cfg, lay, device=device, runtime_overhead_gb=runtime_gb)
                if smallest is None or est.peak < smallest[1].peak:
                    smallest = (lay, est)
                time = relative_time_per_token(model_cfg, lay)
                if est.fits(device_bytes) and (found is None or time < found[2] - 1e-9):
                    found = (lay, est, time)
            if found:
                break
        lay, est = found[:2] if found else smallest
        rows.append({"cp_size": cp, "dp_size": world // cp, "fits": found is not None, "zero_stage": lay.zero_stage,
                     "activation_checkpointing": lay.activation_checkpointing,
                     "offload_optimizer": lay.offload_optimizer, "peak_gib": round(est.peak_gb, 2),
                     "tokens_per_rank": lay.micro_batch_size * lay.seq_len // cp,
                     "micro_batch_size": lay.micro_batch_size,
                     "relative_time_per_token": round(relative_time_per_token(model_cfg, lay), 3)})
    return rows


def recommend(rows: list[dict]) -> Optional[dict]:
    """The fitting row with the lowest predicted time per token; offload only if nothing
    else fits; ties: the smaller cp (less communication)."""
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        return None
    without_offload = [r for r in fitting if not r["offload_optimizer"]] or fitting
    return min(without_offload, key=lambda r: (r["relative_time_per_token"], r["cp_size"]))


def _user_set(config: Optional[str], overrides: list[str], key: str) -> bool:
    """Whether the config file or an override sets `key` (a dotted name) itself."""
    if any(o.split("=", 1)[0].strip() == key for o in overrides):
        return True
    if not config:
        return False
    node = OmegaConf.load(config)
    for part in key.split("."):
        if not OmegaConf.is_dict(node) or part not in node:
            return False
        node = node[part]
    return True


def max_length(model_cfg, layout, device_bytes: float, *, device: str, runtime_gb: Optional[float]) -> int:
    """Longest sequence (a multiple of 2 x cp x 64) that fits with this exact layout."""
    unit = 2 * layout.cp_size * 64

    def fits(n: int) -> bool:
        lay = dataclasses.replace(layout, seq_len=n * unit)
        return estimate_layout(model_cfg, lay, device=device, runtime_overhead_gb=runtime_gb).fits(device_bytes)

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi) and hi < 2**24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * unit


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    validate_portable(cfg)  # a job planned here runs elsewhere: no file, library or world-size checks
    if args.runtime_gb is not None and not (math.isfinite(args.runtime_gb) and args.runtime_gb >= 0):
        raise UserError(f"--runtime-gb: must be a finite number >= 0, got {args.runtime_gb}")
    notes: list[str] = []
    gpus, device_bytes = _machine(args, notes)
    stages = resolve_stages(cfg)
    target = parse_length(args.seq_len) if args.seq_len else max(s.seq_len for s in stages)
    report = {"gpus": gpus, "gpu_mem_gib": device_bytes / 2**30, "device": args.device, "stages": [], "notes": notes}
    text, all_fit = _stage_estimates(cfg, stages, gpus, device_bytes, args, report)
    rows = _advice(cfg, stages, gpus, device_bytes, target, args, notes)
    best = recommend(rows)
    report["advice"] = {"seq_len": target, "options": rows, "recommended": best}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, text, cfg, args, _longest(stages))
    return 3 if (args.check and not all_fit) else 0


def _machine(args: argparse.Namespace, notes: list) -> tuple[int, float]:
    """(GPUs, bytes per GPU): the flags, else the config's '# cluster:' line, else 8 x 80 GB."""
    cluster = _cluster_defaults(args.config)
    if args.gpus is not None:
        gpus = args.gpus
    elif "gpus_per_node" in cluster:
        gpus = int(cluster.get("nodes", 1)) * int(cluster["gpus_per_node"])
        notes.append(f"--gpus {gpus} from the config's '# cluster:' line")
    else:
        gpus = 8
        notes.append("--gpus not given: planning for 8")
    if gpus < 1:
        raise UserError(f"--gpus: must be >= 1, got {gpus}")
    return gpus, parse_size(args.gpu_mem or cluster.get("gpu_mem") or "80GB")


def _longest(stages: list[RunStage]) -> int:
    return max(range(len(stages)), key=lambda i: stages[i].seq_len)


def _stage_estimates(cfg, stages: list[RunStage], gpus: int, device_bytes: float, args: argparse.Namespace,
                     report: dict) -> tuple[list[str], bool]:
    """Each stage's estimate as configured, into report["stages"]; returns (text lines, all fit)."""
    text, all_fit, longest = [], True, _longest(stages)
    for i, stage in enumerate(stages):
        model_cfg = _model_config(stage, report["notes"] if i == 0 else [])
        layout = layout_of(cfg, stage, gpus)
        if gpus % layout.cp_size:
            where = stage.field_names["cp_size"]
            all_fit = False
            report["stages"].append({"name": stage.name, "seq_len": stage.seq_len, "fits": False,
                                     "error": f"{where}={layout.cp_size} does not divide {gpus} GPUs"})
            text.append(f"stage {i} ({stage.name}): seq_len {stage.seq_len:,}: {where}={layout.cp_size} does not "
                        f"divide --gpus {gpus}; see the advice below for a cp size that does")
            continue
        est = estimate_layout(model_cfg, layout, device=args.device, runtime_overhead_gb=args.runtime_gb)
        fits = est.fits(device_bytes)
        all_fit &= fits
        report["stages"].append({"name": stage.name, "seq_len": stage.seq_len, "fits": fits,
                                 "peak_gib": est.peak_gb, "phase": est.phase, "host_gib": est.host / 2**30,
                                 "components_gib": {k: v / 2**30 for k, v in est.components().items()}})
        text.append(f"stage {i} ({stage.name}): seq_len {stage.seq_len:,}, "
                    f"{est.info['parameters_total']:,} parameters, {gpus} x {device_bytes / 2**30:.0f} GiB")
        text.append(format_estimate(est, device_bytes))
        if i == longest:
            report["max_seq_len_as_configured"] = max_length(model_cfg, layout, device_bytes, device=args.device,
                                                             runtime_gb=args.runtime_gb)
    return text, all_fit


def _advice(cfg, stages: list[RunStage], gpus: int, device_bytes: float, target: int, args: argparse.Namespace,
            notes: list) -> list[dict]:
    """advise() for the target length, with the longest stage's settings otherwise."""
    stage = stages[_longest(stages)]
    model_cfg = _model_config(stage, [])
    layout = dataclasses.replace(layout_of(cfg, stage, gpus), seq_len=target)
    if not _user_set(args.config, args.overrides, "data.micro_batch_size") and layout.micro_batch_size != 1:
        layout = dataclasses.replace(layout, micro_batch_size=1)
        notes.append(f"data.micro_batch_size not set (default {cfg.data.micro_batch_size}): the advice plans one "
                     "sequence per micro-batch, as long-context runs train")
    return advise(model_cfg, layout, device_bytes, device=args.device, runtime_gb=args.runtime_gb)


def _print_report(report: dict, text: list[str], cfg, args: argparse.Namespace, longest: int) -> None:
    gpus, device_bytes = report["gpus"], report["gpu_mem_gib"] * 2**30
    target, rows, best = report["advice"]["seq_len"], report["advice"]["options"], report["advice"]["recommended"]
    for note in report["notes"]:
        print(f"note: {note}")
    print("\n".join(text))
    usable = device_bytes * (GPU_USABLE if args.device == "gpu" else 1.0) / 2**30
    if "max_seq_len_as_configured" in report:
        print(f"\nlongest sequence that fits stage {longest}'s layout: "
              f"{report['max_seq_len_as_configured']:,} tokens")
    print(f"\nadvice for seq_len {target:,} on {gpus} x {device_bytes / 2**30:.0f} GiB "
          f"({usable:.1f} GiB usable; per cp: the fitting option with the lowest predicted time per token):")
    print(f"  {'cp':>4} {'dp':>4} {'tokens/rank':>12}  {'ZeRO':>4}  {'checkpointing':<13} {'offload':<8} "
          f"{'peak GiB':>9} {'time/token':>10}")
    for r in rows:
        mark = "" if r["fits"] else "  does not fit (smallest option shown)"
        print(f"  {r['cp_size']:>4} {r['dp_size']:>4} {r['tokens_per_rank']:>12,}  {r['zero_stage']:>4}  "
              f"{r['activation_checkpointing']:<13} {'optimizer' if r['offload_optimizer'] else '-':<8} "
              f"{r['peak_gib']:>9.2f} {r['relative_time_per_token']:>9.2f}x{mark}")
    if best:
        print(f"recommended: parallel.cp_size={best['cp_size']} parallel.zero_stage={best['zero_stage']} "
              f"parallel.activation_checkpointing={best['activation_checkpointing']}"
              + (" parallel.offload_optimizer=true" if best["offload_optimizer"] else "")
              + (f" data.micro_batch_size={best['micro_batch_size']}"
                 if best["micro_batch_size"] != cfg.data.micro_batch_size else ""))
    else:
        print(f"nothing fits {target:,} tokens on {gpus} GPUs: add GPUs (cp > {gpus}), lower "
              "data.micro_batch_size or train.loss_chunk_size, or use a shorter target")
