"""The `longctx plan` report (longctx/commands/plan.py has the rule and the flags): each stage's
estimate as configured, the longest sequence its layout takes, and the advice per cp size.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Optional

from omegaconf import OmegaConf

from longctx.base.errors import UserError
from longctx.config import RunPlan, RunStage, derive_plan, load_config, missing_weights_note, validate_portable
from longctx.model.config import ModelConfig
from longctx.parallel.layout import ulysses_degree, validate_cp
from longctx.plan import (
    GPU_USABLE,
    Layout,
    estimate_layout,
    format_estimate,
    layout_of,
    parse_length,
    parse_size,
    planned_deepspeed,
    relative_time_per_token,
)
from longctx.plan.report import gib
from longctx.plan.target import cluster_line, memory_per_process, planned_device

CHECKPOINTING_ORDER = ("none", "selective", "full")


def _valid_cp(cp: int, layout: Layout, model_cfg: ModelConfig) -> bool:
    """Whether the trainer accepts this cp size for the layout (longctx.parallel.layout's checks)."""
    try:
        validate_cp(layout.world_size, cp, layout.cp_impl, ulysses_degree(layout.cp_impl, cp, layout.ulysses_size),
                    model_cfg.num_attention_heads, model_cfg.num_key_value_heads, layout.seq_len)
    except UserError:
        return False
    return True


def advise(model_cfg, layout, device_bytes: float, *, device: str, runtime_gb: Optional[float],
           document_masking: bool = True) -> list[dict]:
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
                est = estimate_layout(model_cfg, lay, device=device, runtime_overhead_gb=runtime_gb,
                                      document_masking=document_masking)
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


def max_length(model_cfg, layout, device_bytes: float, *, device: str, runtime_gb: Optional[float],
               document_masking: bool = True) -> int:
    """Longest sequence (a multiple of 2 x cp x 64) that fits with this exact layout."""
    unit = 2 * layout.cp_size * 64

    def fits(n: int) -> bool:
        lay = dataclasses.replace(layout, seq_len=n * unit)
        return estimate_layout(model_cfg, lay, device=device, runtime_overhead_gb=runtime_gb,
                               document_masking=document_masking).fits(device_bytes)

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi) and hi < 2**24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * unit


@dataclass(frozen=True)
class Machine:
    """What the job runs on: `processes` GPUs (or CPU processes) of `memory` bytes each."""

    processes: int
    memory: float
    device: str  # "gpu" | "cpu"

    @property
    def unit(self) -> str:
        return "GPUs" if self.device == "gpu" else "processes"

    @property
    def usable(self) -> float:
        return self.memory * (GPU_USABLE if self.device == "gpu" else 1.0)

    def __str__(self) -> str:
        if self.device == "gpu":
            return f"{self.processes} x {gib(self.memory)} GiB"
        return f"{self.processes} processes x {gib(self.memory)} GiB of host memory"


def run_plan(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    stages = validate_portable(cfg)  # a job planned here runs elsewhere: no file, library or world-size checks
    if args.runtime_gb is not None and not (math.isfinite(args.runtime_gb) and args.runtime_gb >= 0):
        raise UserError(f"--runtime-gb: must be a finite number >= 0, got {args.runtime_gb}")
    notes: list[str] = []
    machine = _machine(args, notes)
    plan = _plan(cfg, stages, machine, notes)
    target = parse_length(args.seq_len) if args.seq_len else max(s.seq_len for s in stages)
    report = {"gpus": machine.processes, "gpu_mem_gib": machine.memory / 2**30, "device": machine.device,
              "stages": [], "notes": notes}
    text, all_fit = _stage_estimates(cfg, plan, machine, args, report)
    rows = _advice(cfg, plan, machine, target, args, notes)
    best = recommend(rows)
    report["advice"] = {"seq_len": target, "options": rows, "recommended": best}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, text, cfg, machine, _longest(stages))
    return 3 if (args.check and not all_fit) else 0


def _plan(cfg, stages: list[RunStage], machine: Machine, notes: list) -> RunPlan:
    """The stages' model configs (init_from's config.json read once) and the DeepSpeed JSON where it is readable."""
    note = missing_weights_note(cfg.model)
    if note:
        notes.append(note)
    if machine.device == "gpu" and cfg.data.document_masking and cfg.parallel.attention_backend == "auto":
        notes.append("parallel.attention_backend auto plans for a variable-length kernel (FlashAttention-4, "
                     "flash-attn or torch's own; documents averaging 8k+ tokens take per-document calls instead, "
                     "which parallel.attention_backend=sdpa plans)")
    deepspeed = planned_deepspeed(cfg.parallel.deepspeed_config)
    return derive_plan(cfg, machine.processes, stages=stages, deepspeed=deepspeed)


def _machine(args: argparse.Namespace, notes: list) -> Machine:
    """The flags, else the config's '# cluster:' line, else 8 GPUs of 80 GB (on CPU: this
    machine's memory shared by the processes of one node)."""
    cluster = cluster_line(args.config)
    device = planned_device(cluster, args.device)
    if args.device is None and device == "cpu":
        notes.append("device cpu from the config's '# cluster:' line: host memory per process (--device gpu "
                     "for GPUs)")
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
    if args.gpu_mem:
        return Machine(gpus, parse_size(args.gpu_mem), device)
    if device == "cpu":
        memory, source = memory_per_process(device, cluster, gpus)
        notes.append(f"--gpu-mem not given: {source}")
        return Machine(gpus, memory, device)
    return Machine(gpus, parse_size(cluster.get("gpu_mem") or "80GB"), device)


def _longest(stages: list[RunStage]) -> int:
    return max(range(len(stages)), key=lambda i: stages[i].seq_len)


def _stage_estimates(cfg, plan: RunPlan, machine: Machine, args: argparse.Namespace,
                     report: dict) -> tuple[list[str], bool]:
    """Each stage's estimate as configured, into report["stages"]; returns (text lines, all fit)."""
    text, all_fit, longest = [], True, _longest(plan.stages)
    gpus, device_bytes = machine.processes, machine.memory
    for i, (stage, model_cfg) in enumerate(zip(plan.stages, plan.model_configs)):
        layout = layout_of(cfg, stage, gpus, plan.deepspeed)
        if gpus % layout.cp_size:
            where = stage.field_names["cp_size"]
            all_fit = False
            report["stages"].append({"name": stage.name, "seq_len": stage.seq_len, "fits": False,
                                     "error": f"{where}={layout.cp_size} does not divide {gpus} {machine.unit}"})
            text.append(f"stage {i} ({stage.name}): seq_len {stage.seq_len:,}: {where}={layout.cp_size} does not "
                        f"divide --gpus {gpus}; see the advice below for a cp size that does")
            continue
        est = estimate_layout(model_cfg, layout, device=machine.device, runtime_overhead_gb=args.runtime_gb,
                              document_masking=cfg.data.document_masking)
        fits = est.fits(device_bytes)
        all_fit &= fits
        report["stages"].append({"name": stage.name, "seq_len": stage.seq_len, "fits": fits,
                                 "peak_gib": est.peak_gb, "phase": est.phase, "host_gib": est.host / 2**30,
                                 "components_gib": {k: v / 2**30 for k, v in est.components().items()}})
        text.append(f"stage {i} ({stage.name}): seq_len {stage.seq_len:,}, "
                    f"{est.info['parameters_total']:,} parameters, {machine}")
        text.append(format_estimate(est, device_bytes))
        if i == longest:
            report["max_seq_len_as_configured"] = max_length(model_cfg, layout, device_bytes, device=machine.device,
                                                             runtime_gb=args.runtime_gb,
                                                             document_masking=cfg.data.document_masking)
    return text, all_fit


def _advice(cfg, plan: RunPlan, machine: Machine, target: int, args: argparse.Namespace,
            notes: list) -> list[dict]:
    """advise() for the target length, with the longest stage's settings otherwise."""
    i = _longest(plan.stages)
    stage, model_cfg = plan.stages[i], plan.model_configs[i]
    layout = dataclasses.replace(layout_of(cfg, stage, machine.processes, plan.deepspeed), seq_len=target)
    if not _user_set(args.config, args.overrides, "data.micro_batch_size") and layout.micro_batch_size != 1:
        layout = dataclasses.replace(layout, micro_batch_size=1)
        notes.append(f"data.micro_batch_size not set (default {cfg.data.micro_batch_size}): the advice plans one "
                     "sequence per micro-batch, as long-context runs train")
    return advise(model_cfg, layout, machine.memory, device=machine.device, runtime_gb=args.runtime_gb,
                  document_masking=cfg.data.document_masking)


def _print_report(report: dict, text: list[str], cfg, machine: Machine, longest: int) -> None:
    target, rows, best = report["advice"]["seq_len"], report["advice"]["options"], report["advice"]["recommended"]
    for note in report["notes"]:
        print(f"note: {note}")
    print("\n".join(text))
    if "max_seq_len_as_configured" in report:
        print(f"\nlongest sequence that fits stage {longest}'s layout: "
              f"{report['max_seq_len_as_configured']:,} tokens")
    print(f"\nadvice for seq_len {target:,} on {machine} ({machine.usable / 2**30:.1f} GiB usable; per cp: the "
          "fitting option with the lowest predicted time per token):")
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
        n = machine.processes
        batch = " data.micro_batch_size=1," if rows and rows[0]["micro_batch_size"] > 1 else ""
        print(f"nothing fits {target:,} tokens on {n} {machine.unit}: try more {machine.unit} (--gpus above {n}, "
              f"for cp > {n}),{batch} a shorter target (--seq-len) or a lower train.loss_chunk_size")
