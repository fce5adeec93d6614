"""The `longctx plan` report (longctx/commands/plan.py has the rule and the flags): each stage's
estimate as configured, the longest sequence its layout takes, and the advice per cp size
(longctx/plan/advice.py).
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
from longctx.plan import (
    GPU_USABLE,
    estimate_layout,
    format_estimate,
    layout_of,
    parse_length,
    parse_size,
    planned_deepspeed,
)
from longctx.plan.advice import (
    DEFAULT_HOST_MEM,
    HOST_USABLE,
    advise,
    longest_with_offload,
    max_length,
    recommend,
)
from longctx.plan.report import gib
from longctx.plan.target import cluster_line, memory_per_process, planned_device, processes_per_node


@dataclass(frozen=True)
class Machine:
    """What the job runs on: `processes` GPUs (or CPU processes) of `memory` bytes each."""

    processes: int
    memory: float
    device: str  # "gpu" | "cpu"
    host_memory: Optional[float] = None  # bytes of host memory per node (GPU jobs: what host offloads use)
    per_node: int = 1  # processes per node

    @property
    def host_per_process(self) -> Optional[float]:
        """Host memory one GPU's offloads may use (HOST_USABLE of the node's, shared by its GPUs)."""
        if self.device != "gpu" or self.host_memory is None:
            return None
        return self.host_memory * HOST_USABLE / self.per_node

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
    if machine.host_memory is not None:
        report["host_mem_gib_per_node"] = machine.host_memory / 2**30
    text, all_fit = _stage_estimates(cfg, plan, machine, args, report)
    rows, longest = _advice(cfg, plan, machine, target, args, notes)
    best = recommend(rows)
    report["advice"] = {"seq_len": target, "options": rows, "recommended": best,
                        "links": {"pcie_gb_per_s": args.pcie_gbps, "nvme_gb_per_s": args.nvme_gbps},
                        "longest_with_offload": longest}
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
    for flag in ("pcie_gbps", "nvme_gbps"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"--{flag.replace('_', '-')}: must be a finite number > 0 (GB/s), got {value}")
    host = None
    if device == "gpu":
        host = parse_size(args.host_mem or cluster.get("host_mem") or DEFAULT_HOST_MEM, what="--host-mem")
    per_node = processes_per_node(cluster, gpus) if "gpus_per_node" in cluster else min(gpus, 8)
    if args.gpu_mem:
        return Machine(gpus, parse_size(args.gpu_mem), device, host, per_node)
    if device == "cpu":
        memory, source = memory_per_process(device, cluster, gpus)
        notes.append(f"--gpu-mem not given: {source}")
        return Machine(gpus, memory, device)
    return Machine(gpus, parse_size(cluster.get("gpu_mem") or "80GB"), device, host, per_node)


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
            notes: list) -> tuple[list[dict], dict]:
    """advise() for the target length, with the longest stage's settings otherwise; and the
    longest length any advised option takes (longest_with_offload)."""
    i = _longest(plan.stages)
    stage, model_cfg = plan.stages[i], plan.model_configs[i]
    layout = dataclasses.replace(layout_of(cfg, stage, machine.processes, plan.deepspeed), seq_len=target,
                                 pcie_bytes_per_s=args.pcie_gbps * 1e9, nvme_bytes_per_s=args.nvme_gbps * 1e9)
    if not _user_set(args.config, args.overrides, "data.micro_batch_size") and layout.micro_batch_size != 1:
        layout = dataclasses.replace(layout, micro_batch_size=1)
        notes.append(f"data.micro_batch_size not set (default {cfg.data.micro_batch_size}): the advice plans one "
                     "sequence per micro-batch, as long-context runs train")
    at = dict(device=machine.device, runtime_gb=args.runtime_gb, document_masking=cfg.data.document_masking,
              host_bytes=machine.host_per_process)
    return (advise(model_cfg, layout, machine.memory, **at),
            longest_with_offload(model_cfg, layout, machine.memory, **at))


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
    for line in advice_table(rows):
        print(line)
    if best:
        print("recommended: " + recommended_overrides(best, cfg))
    else:
        n = machine.processes
        batch = " data.micro_batch_size=1," if rows and rows[0]["micro_batch_size"] > 1 else ""
        print(f"nothing fits {target:,} tokens on {n} {machine.unit}: try more {machine.unit} (--gpus above {n}, "
              f"for cp > {n}),{batch} a shorter target (--seq-len) or a lower train.loss_chunk_size")
    longest = report["advice"]["longest_with_offload"]
    if longest["row"] is not None:
        links = report["advice"]["links"]
        nxt = longest["next"]
        stop = f"; {2 * longest['seq_len']:,} does not fit: {nxt['stopped_by']}" if nxt and not nxt["fits"] else ""
        print(f"longest sequence any advised option takes on {machine}: {longest['seq_len']:,} tokens "
              f"({recommended_overrides(longest['row'], cfg)}; links {links['pcie_gb_per_s']:g} GB/s PCIe, "
              f"{links['nvme_gb_per_s']:g} GB/s NVMe){stop}")


def advice_table(rows: list[dict]) -> list[str]:
    """The advice rows as text: one line per cp size, the offloads and their host bytes and copy time."""
    lines = [f"  {'cp':>4} {'dp':>4} {'tokens/rank':>12}  {'ZeRO':>4}  {'checkpointing':<13} {'offload':<22} "
             f"{'peak GiB':>9} {'host GiB':>9} {'copies s':>9} {'time/token':>10}"]
    for r in rows:
        mark = "" if r["fits"] else f"  does not fit (smallest option shown: {r.get('stopped_by', '')})"
        lines.append(f"  {r['cp_size']:>4} {r['dp_size']:>4} {r['tokens_per_rank']:>12,}  {r['zero_stage']:>4}  "
                     f"{r['activation_checkpointing']:<13} {_offload_label(r):<22} {r['peak_gib']:>9.2f} "
                     f"{r['host_gib']:>9.1f} {r['transfer_s']:>9.2f} {r['relative_time_per_token']:>9.2f}x{mark}")
    return lines


def recommended_overrides(row: dict, cfg) -> str:
    """The key=value overrides that give an advice row's layout."""
    out = [f"parallel.cp_size={row['cp_size']}", f"parallel.zero_stage={row['zero_stage']}",
           f"parallel.activation_checkpointing={row['activation_checkpointing']}"]
    if row["offload_optimizer"]:
        out.append("parallel.offload_optimizer=true")
    if row.get("offload_activations", "none") != "none":
        out.append(f"parallel.offload_activations={row['offload_activations']}")
    if row.get("offload_params", "none") != "none":
        out.append("parallel.offload_params=true")
        if row["offload_params"] == "nvme":
            out.append("parallel.offload_params_device=nvme parallel.offload_params_path=/local_nvme/offload")
    if row.get("recompute_attention") and not cfg.parallel.recompute_attention:
        out.append("parallel.recompute_attention=true")
    if row.get("mlp_tile_tokens", cfg.parallel.mlp_tile_tokens) != cfg.parallel.mlp_tile_tokens:
        out.append(f"parallel.mlp_tile_tokens={row['mlp_tile_tokens']}")
    if row["micro_batch_size"] != cfg.data.micro_batch_size:
        out.append(f"data.micro_batch_size={row['micro_batch_size']}")
    return " ".join(out)

def _offload_label(r: dict) -> str:
    """The advice table's offload column: '-', 'optimizer', 'opt+act:host+par:nvme'."""
    parts = (["opt"] if r["offload_optimizer"] else []) + (
        [f"act:{r['offload_activations']}"] if r["offload_activations"] != "none" else []) + (
        [f"par:{r['offload_params']}"] if r["offload_params"] != "none" else [])
    if parts == ["opt"]:
        return "optimizer"
    return "+".join(parts) or "-"

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
