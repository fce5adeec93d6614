"""Per-device memory of a layout, phase by phase (the accounting is in longctx/plan/__init__.py)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from longctx.config import RunStage, TrainConfig
from longctx.model.config import ModelConfig
from longctx.plan.activations import activation_bytes
from longctx.plan.adapter import adapter_counts
from longctx.plan.layout import Layout, head_shards, layout_of, parameter_counts

GiB = 2**30
# Fixed per-process runtime memory (Python, torch, DeepSpeed, data loader; CUDA context and
# NCCL on GPU). CPU: the peak RSS of the trainer with the debug-tiny model, as
# benchmarks/bench_plan.py measures it (docs/plan.md). GPU: CUDA context + cuBLAS/NCCL
# workspaces, typical for H100/A100 with NCCL's default buffers.
RUNTIME_GB = {"cpu": 0.36, "gpu": 1.5}
GPU_USABLE = 0.92  # fraction of nominal memory a plan may use (allocator fragmentation, reserve)

COMPONENTS = ("parameters", "gradients", "optimizer", "activations", "attention", "loss", "communication", "runtime")


@dataclass
class MemoryEstimate:
    """Per-device bytes of each component at the peak phase (they sum to `peak`)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    attention: float
    loss: float
    communication: float
    runtime: float
    phase: str  # the phase where the peak occurs
    host: float  # offloaded bytes per process in host memory
    disk: float = 0.0  # offloaded bytes per process on a drive (activations disk, parameters nvme)
    phases: dict = field(default_factory=dict)  # phase -> total bytes
    info: dict = field(default_factory=dict)  # the inputs (P, t, stage, ...)
    device: str = "gpu"

    def components(self) -> dict:
        return {k: getattr(self, k) for k in COMPONENTS}

    @property
    def peak(self) -> float:
        return sum(self.components().values())

    @property
    def peak_gb(self) -> float:
        return self.peak / GiB

    def fits(self, device_bytes: float) -> bool:
        return self.peak <= device_bytes * (GPU_USABLE if self.device == "gpu" else 1.0)


def _model_states(n: dict, lay: Layout, device: str) -> dict:
    """Persistent and transient bytes of parameters, gradients and optimizer states. P counts
    every parameter, T the trained ones (all of them, but an adapter run's): gradients, the
    optimizer's partitions and the buckets that reduce gradients are T's."""
    P, W, z = n["total"], lay.world_size, lay.zero_stage
    T = n.get("trained", P)
    b = 2 if lay.dtype == "bfloat16" else 4
    mixed = b == 2
    gpu = device == "gpu"
    # elements of a DeepSpeed bucket that count: all of it on GPU, the touched part on CPU
    def bucket(elements_used: int) -> int:
        return lay.reduce_bucket_size if gpu else min(lay.reduce_bucket_size, elements_used)

    out = {"params": 0.0, "grads": 0.0, "grads_transient": 0.0, "opt": 0.0, "host": 0.0, "disk": 0.0,
           "opt_step": 0.0, "comm": 0.0, "comm_persistent": 0.0, "gathered": 0.0, "init": 0.0}
    opt_host = lay.offload_optimizer
    if z == 0:
        out["params"] = b * P
        out["grads"] = b * T
        out["opt"] = (12 if mixed else 8) * T
        if mixed:
            out["grads_transient"] = 4 * T  # fp32 gradients of the master weights at the step
        out["comm"] = b * bucket(T)  # buffered all-reduce flattens the gradients
        out["opt_step"] = 4 * T  # torch AdamW (foreach) sqrt(v) temporary
    elif z in (1, 2):
        out["params"] = b * P  # flat buffer (the module's trained parameters are views into it)
        out["init"] = b * T  # the flat copy exists next to the original parameters once
        part = math.ceil(T / W)
        master = 4 * part  # DeepSpeed clones the fp32 partition, in fp32 runs too
        adam = 8 * part
        if z == 1:
            out["grads"] = b * T + (4 * T if mixed else 0)  # full grads (+ BF16_Optimizer's fp32 accumulator)
            out["comm"] = 4 * bucket(T)  # fp32 staging bucket of the reduction
        else:
            out["grads"] = 4 * part  # fp32 gradient partition
            out["comm"] = 2 * b * bucket(T)  # two ipg buckets (overlap_comm)
        if opt_host:
            out["host"] = master + adam + (4 * part if z == 2 else 0)
        else:
            out["opt"] = master + adam
        out["opt_step"] = 4 * part
    else:  # z3
        part = math.ceil(T / W)
        out["params"] = b * math.ceil(P / W)
        out["grads"] = 4 * part if not mixed else 2 * part + 4 * part
        master, adam = 4 * part, 8 * part
        if opt_host:  # DeepSpeed's stage3.py keeps the gradient partitions in host memory then (4 bytes)
            out["host"] = master + adam + 4 * part
            out["grads"] = 0.0
        else:
            out["opt"] = master + adam
        if lay.offload_params:
            out["disk" if lay.offload_params_device == "nvme" else "host"] += out["params"]
            out["params"] = 0.0
        # gathered parameters: ZeRO-3 keeps a parameter gathered while its next use is within
        # stage3_max_reuse_distance (1e9) and caps what is live at stage3_max_live_parameters
        # (1e9): small models stay fully gathered, a 7B model holds about 1e9 parameters
        out["gathered"] = b * min(P, lay.max_live_parameters + lay.prefetch_bucket_size)
        out["comm_persistent"] = b * bucket(T)  # the reduce-scatter bucket, allocated once
        out["opt_step"] = 4 * part
    return out


def ulysses_split(m, lay: Layout) -> Optional[str]:
    """'U x R' of a layout with an all-to-all, with the uneven query heads per member: '2 x 2, heads 5/4'."""
    s = head_shards(m, lay)
    if s is None:
        return None
    text = f"{s.degree} x {lay.cp_size // s.degree}"
    return text if s.even else text + ", heads " + "/".join(str(hi - lo) for lo, hi in s.q_ranges())


def estimate_layout(m, lay: Layout, *, device: str = "gpu", runtime_overhead_gb: Optional[float] = None,
                    document_masking: bool = True) -> MemoryEstimate:
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
    n = parameter_counts(m)
    head_trained = True
    if lay.adapter is not None:  # the LoRA factors join the model; only they and the trainable modules train
        counts = adapter_counts(m, lay.adapter)
        n = dict(n, total=n["total"] + counts.added, trained=counts.trained)
        head_trained = counts.head_trained
    ms = _model_states(n, lay, device)
    act = activation_bytes(m, lay, device, document_masking)
    b_model = 2 if lay.dtype == "bfloat16" else 4
    runtime = (RUNTIME_GB[device] if runtime_overhead_gb is None else runtime_overhead_gb) * GiB
    accum = lay.grad_accum > 1
    z = lay.zero_stage
    # gradients that exist during the forward: the accumulated ones (grad_accum > 1) or
    # DeepSpeed's partitions (z2/z3 keep theirs allocated)
    grads_fwd = ms["grads"] if (accum or z >= 2) else 0.0
    phases: dict[str, dict] = {}
    base = {"parameters": ms["params"], "optimizer": ms["opt"], "runtime": runtime,
            "communication": ms["comm_persistent"]}
    phases["init"] = dict(base, parameters=ms["params"] + ms["init"], optimizer=0.0, communication=0.0)
    phases["loss"] = dict(base, gradients=grads_fwd, activations=act["saved"], loss=act["loss_fwd"],
                          parameters=ms["params"] + ms["gathered"])
    # the forward of the last block: its attention with the mask and the cp K/V buffers
    phases["forward"] = dict(base, gradients=grads_fwd, parameters=ms["params"] + ms["gathered"],
                             activations=act["top"] - act["mlp_saved"],
                             attention=act["attn_fwd"] + act["mask"],
                             communication=ms["comm_persistent"] + act["comm_fwd"])
    # backward of the last block's MLP: every saved activation (+ the block recomputed under
    # checkpointing) and the MLP's gradient temporaries; the head's gradient already exists
    head_grad = b_model * n["head"] if z <= 1 and head_trained else 0.0
    phases["backward_mlp"] = dict(
        base, parameters=ms["params"] + ms["gathered"], gradients=grads_fwd + head_grad,
        activations=act["top"] + act["mlp_bwd"])
    # backward of its attention: the MLP half is freed, the attention kernel's gradients, the
    # document mask and the context-parallel K/V (and dK/dV) buffers are live
    phases["backward_attention"] = dict(
        base, parameters=ms["params"] + ms["gathered"], gradients=grads_fwd + head_grad,
        activations=act["top"] - act["mlp_saved"],
        attention=act["attn_bwd"] + act["mask"], communication=ms["comm_persistent"] + act["comm_bwd"])
    # the recomputed forward of a checkpointed block: reruns its attention (mask, cp buffers)
    # only with parallel.recompute_attention (else the kept kernel outputs are reused)
    if act["recompute"] and lay.recompute_attention:
        phases["recompute"] = dict(
            base, parameters=ms["params"] + ms["gathered"], gradients=grads_fwd + head_grad,
            activations=act["top"] - act["mlp_saved"],
            attention=act["attn_fwd"] + act["mask"],
                             communication=ms["comm_persistent"] + act["comm_fwd"])
    # start of the backward: the loss hands back its saved gradients (scaled copies)
    phases["loss_backward"] = dict(base, gradients=grads_fwd, parameters=ms["params"] + ms["gathered"],
                                   activations=act["saved"], loss=act["loss_bwd"])
    # end of the backward: all gradients exist, activations are gone, buckets are filled
    phases["step"] = dict(base, gradients=ms["grads"] + ms["grads_transient"],
                          communication=ms["comm_persistent"] + ms["comm"],
                          optimizer=ms["opt"] + ms["opt_step"])
    totals = {k: sum(v.values()) for k, v in phases.items()}
    peak_phase = max(totals, key=totals.get)
    comp = {k: float(phases[peak_phase].get(k, 0.0)) for k in COMPONENTS}
    info = {"parameters_total": n["total"], "parameters_trained": n.get("trained", n["total"]),
            "tokens_per_rank": act["tokens"], "layout": dataclasses.asdict(lay),
            "ulysses": ulysses_split(m, lay)}
    host, disk = float(ms["host"]), float(ms["disk"])
    if lay.offload_activations == "host":
        host += act["offloaded"]
    elif lay.offload_activations == "disk":
        disk += act["offloaded"]
    return MemoryEstimate(**comp, phase=peak_phase, host=host, disk=disk, phases=totals, info=info, device=device)


def estimate_memory(cfg: TrainConfig, stage: RunStage, model_cfg: ModelConfig, world_size: int, *,
                    device: str = "gpu", runtime_overhead_gb: Optional[float] = None,
                    deepspeed: Optional[dict] = None) -> MemoryEstimate:
    """Per-device peak memory of `stage` of `cfg` on `world_size` processes (see module doc);
    `deepspeed`: the parsed parallel.deepspeed_config (RunPlan.deepspeed), read when not given."""
    return estimate_layout(model_cfg, layout_of(cfg, stage, world_size, deepspeed), device=device,
                           runtime_overhead_gb=runtime_overhead_gb, document_masking=cfg.data.document_masking)
