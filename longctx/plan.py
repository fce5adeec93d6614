"""Memory planner: per-device peak memory of one training stage, and the smallest layout that fits.

The estimate follows what this trainer actually allocates (longctx/train/loop.py, the model in
longctx/model/llama.py, DeepSpeed's ZeRO optimizers), phase by phase, and reports the
breakdown at the phase with the highest total:

    init       model built, then flattened/partitioned by DeepSpeed (two copies briefly)
    loss       end of the forward: every saved activation + the chunked loss's workspace
    backward   saved activations + gradient buffers + one block's backward (and its
               recomputation under activation checkpointing) + attention/communication buffers
    step       gradients + optimizer states + the optimizer's temporaries

Notation (per device): P parameters, W = world size (ZeRO shards over all dp x cp ranks),
t = micro_batch_size * seq_len / cp local tokens, d hidden, f intermediate, L layers, Hq/Hkv
heads of size D, V vocabulary, c = train.loss_chunk_size, b bytes of the compute dtype.

Model states (bytes per parameter, the ZeRO paper's accounting, as DeepSpeed 0.1x does it):
    fp32         z0: 4 params + 4 grads + 8 Adam            z1: 4 + 4 + (4 master copy + 8)/W
                 z2: 4 + 4/W + 12/W                         z3: 4/W + 4/W + 12/W
    bf16         z0: 2 + 2 + 4 fp32 grads + 12 (master+Adam), all replicated
                 z1: 2 + 2 + 4 fp32 grad accumulator + 12/W  (DeepSpeed's BF16_Optimizer)
                 z2: 2 + 2/W + 12/W                          z3: 2/W + 2/W + 12/W
  plus DeepSpeed's gradient reduction buckets (reduce_bucket_size = 5e8 elements, two with
  overlap_comm at z2) and the ZeRO-3 gathered-parameter working set. With optimizer offload the
  master weights, Adam states and fp32 gradient partitions live in host memory (reported
  separately); parameter offload (z3) moves the parameter partitions there too.

Activations per token and layer saved for backward (no checkpointing), in elements of b bytes:
    6d (block input, normed input, projection input; twice) + 3 HqD + 2 HkvD (rotated q,
    k, v, attention output and its reshaped copy) + 4f (gate, silu, up, product)
  `full` checkpointing keeps only the block input (d) of every layer; `selective` (every k-th
  block) does so for ceil(L/k) blocks. Backward adds one block's activations (recomputed) and
  its gradient temporaries (3f + 3d).

On a GPU the caching allocator reserves whole buffers and the CUDA context/NCCL need memory of
their own; on CPU the measured peak is RSS, which only counts pages a process has touched, so a
5e8-element bucket costs only the part gradients fill. `device` selects these semantics.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from longctx.config import RunStage, TrainConfig
from longctx.errors import UserError
from longctx.model.config import ModelConfig

GiB = 2**30
BUCKET = int(5e8)  # DeepSpeed reduce_bucket_size / allreduce bucket (elements), our config leaves the default
PREFETCH = int(5e7)  # stage3_prefetch_bucket_size (elements)
MAX_LIVE = int(1e9)  # stage3_max_live_parameters: gathered parameters kept at most
# Fixed per-process runtime memory (Python, torch, DeepSpeed, data loader; CUDA context and
# NCCL on GPU). CPU: measured as the peak RSS of the trainer with the debug-tiny model
# (benchmarks/bench_plan.py prints it; 0.36 GiB with torch 2.13 / DeepSpeed 0.19). GPU: CUDA
# context + cuBLAS/NCCL workspaces, typical for H100/A100 with NCCL's default buffers.
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


@dataclass
class Layout:
    """Everything of a config that changes memory (so advice can vary it)."""

    seq_len: int
    world_size: int
    cp_size: int
    cp_impl: str
    ulysses_size: int
    zero_stage: int
    offload_optimizer: bool
    offload_params: bool
    activation_checkpointing: str
    checkpoint_every: int
    recompute_attention: bool
    micro_batch_size: int
    grad_accum: int
    dtype: str
    loss_chunk_size: int
    attention_backend: str
    # DeepSpeed buffer sizes (elements): its defaults, or a parallel.deepspeed_config's values
    reduce_bucket_size: int = BUCKET
    prefetch_bucket_size: int = PREFETCH
    max_live_parameters: int = MAX_LIVE


def _deepspeed_knobs(path: Optional[str]) -> dict:
    """Bucket sizes from a user DeepSpeed JSON (parallel.deepspeed_config), where it sets them."""
    if not path or not Path(path).is_file():
        return {}
    try:
        zero = json.loads(Path(path).read_text()).get("zero_optimization") or {}
    except (OSError, ValueError):
        return {}
    keys = {"reduce_bucket_size": "reduce_bucket_size", "stage3_prefetch_bucket_size": "prefetch_bucket_size",
            "stage3_max_live_parameters": "max_live_parameters"}
    return {ours: int(float(zero[theirs])) for theirs, ours in keys.items() if theirs in zero}


def layout_of(cfg: TrainConfig, stage: RunStage, world_size: int) -> Layout:
    """The layout of one resolved stage of `cfg` (its train section: dtype, batch, loss chunks)."""
    par, tr = stage.parallel, cfg.train
    return Layout(**_deepspeed_knobs(par.deepspeed_config), seq_len=stage.seq_len, world_size=world_size,
                  cp_size=par.cp_size, cp_impl=par.cp_impl, ulysses_size=par.ulysses_size, zero_stage=par.zero_stage,
                  offload_optimizer=par.offload_optimizer, offload_params=par.offload_params,
                  activation_checkpointing=par.activation_checkpointing, checkpoint_every=par.checkpoint_every,
                  recompute_attention=par.recompute_attention, micro_batch_size=stage.data.micro_batch_size,
                  grad_accum=tr.grad_accum, dtype=tr.dtype, loss_chunk_size=tr.loss_chunk_size,
                  attention_backend=par.attention_backend)


# ------------------------------------------------------------------------ step time
ZERO3_GATHER_COST = 1.05  # parameter all-gathers in forward and backward, mostly overlapped
OFFLOAD_COST = 1.25  # the optimizer step on the host (CPU Adam) and its PCIe copies


def relative_time_per_token(m, lay: Layout) -> float:
    """Predicted training time per token of a layout, relative to the same model with no
    recomputation, ZeRO <= 2 and no offload (1.0); used to rank layouts that fit, not to
    predict seconds. Compute per token is the same for every cp size; activation
    checkpointing re-runs the forward of checkpointed blocks (without the attention kernel
    unless recompute_attention), ZeRO-3 and optimizer offload pay the constants above."""
    c = parameter_counts(m)
    n = m.num_hidden_layers * (c["attn"] + c["mlp"]) + c["head"]  # parameters in matmuls
    attention = m.num_hidden_layers * m.num_attention_heads * m.head_dim * lay.seq_len  # causal: 6 x this
    step = 6 * n + 6 * attention
    recomputed = 2 * n + (2 * attention if lay.recompute_attention else 0)
    share = {"none": 0.0, "full": 1.0, "selective": 1.0 / max(1, lay.checkpoint_every)}[lay.activation_checkpointing]
    factor = 1.0 + share * recomputed / step
    if lay.zero_stage == 3:
        factor *= ZERO3_GATHER_COST
    if lay.offload_optimizer:
        factor *= OFFLOAD_COST
    return factor


# ----------------------------------------------------------------------------- counting
def parameter_counts(m) -> dict:
    """Exact parameter counts of longctx's Transformer for a ModelConfig (no model built)."""
    d, f, D = m.hidden_size, m.intermediate_size, m.head_dim
    q, kv = m.num_attention_heads * D, m.num_key_value_heads * D
    attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv + d) if m.attention_bias else 0)
    mlp = 3 * d * f + ((2 * f + d) if m.mlp_bias else 0)
    layer = attn + mlp + 2 * d
    embed = m.vocab_size * d
    head = 0 if m.tie_word_embeddings else m.vocab_size * d
    total = m.num_hidden_layers * layer + embed + head + d
    return {"total": total, "layer": layer, "embed": embed, "head": head or embed, "mlp": mlp, "attn": attn}


def _model_states(n: dict, lay: Layout, device: str) -> dict:
    """Persistent and transient bytes of parameters, gradients and optimizer states."""
    P, W, z = n["total"], lay.world_size, lay.zero_stage
    b = 2 if lay.dtype == "bfloat16" else 4
    mixed = b == 2
    gpu = device == "gpu"
    # elements of a DeepSpeed bucket that count: all of it on GPU, the touched part on CPU
    def bucket(elements_used: int) -> int:
        return lay.reduce_bucket_size if gpu else min(lay.reduce_bucket_size, elements_used)

    out = {"params": 0.0, "grads": 0.0, "grads_transient": 0.0, "opt": 0.0, "host": 0.0,
           "opt_step": 0.0, "comm": 0.0, "comm_persistent": 0.0, "gathered": 0.0, "init": 0.0}
    opt_host = lay.offload_optimizer
    if z == 0:
        out["params"] = b * P
        out["grads"] = b * P
        out["opt"] = (12 if mixed else 8) * P
        if mixed:
            out["grads_transient"] = 4 * P  # fp32 gradients of the master weights at the step
        out["comm"] = b * bucket(P)  # buffered all-reduce flattens the gradients
        out["opt_step"] = 4 * P  # torch AdamW (foreach) sqrt(v) temporary
    elif z in (1, 2):
        out["params"] = b * P  # flat buffer (the module's parameters are views into it)
        out["init"] = b * P  # the flat copy exists next to the original parameters once
        part = math.ceil(P / W)
        master = 4 * part if (mixed or True) else 0  # DeepSpeed clones the fp32 partition even in fp32
        adam = 8 * part
        if z == 1:
            out["grads"] = b * P + (4 * P if mixed else 0)  # full grads (+ BF16_Optimizer's fp32 accumulator)
            out["comm"] = 4 * bucket(P)  # fp32 staging bucket of the reduction
        else:
            out["grads"] = 4 * part  # fp32 gradient partition
            out["comm"] = 2 * b * bucket(P)  # two ipg buckets (overlap_comm)
        if opt_host:
            out["host"] = master + adam + (4 * part if z == 2 else 0)
        else:
            out["opt"] = master + adam
        out["opt_step"] = 4 * part
    else:  # z3
        part = math.ceil(P / W)
        out["params"] = b * part
        out["grads"] = 4 * part if not mixed else 2 * part + 4 * part
        master, adam = 4 * part, 8 * part
        if opt_host:
            out["host"] = master + adam + 4 * part
            out["grads"] = b * part
        else:
            out["opt"] = master + adam
        if lay.offload_params:
            out["host"] += out["params"]
            out["params"] = 0.0
        # gathered parameters: ZeRO-3 keeps a parameter gathered while its next use is within
        # stage3_max_reuse_distance (1e9) and caps what is live at stage3_max_live_parameters
        # (1e9): small models stay fully gathered, a 7B model holds about 1e9 parameters
        out["gathered"] = b * min(P, lay.max_live_parameters + lay.prefetch_bucket_size)
        out["comm_persistent"] = b * bucket(P)  # the reduce-scatter bucket, allocated once
        out["opt_step"] = 4 * part
    return out


def _activations(m, lay: Layout, device: str, document_masking: bool = True) -> dict:
    """Bytes of saved activations and the transient workspaces of one stage."""
    b = 2 if lay.dtype == "bfloat16" else 4
    cp = lay.cp_size
    t = lay.micro_batch_size * lay.seq_len // cp  # local tokens
    d, f, L, V = m.hidden_size, m.intermediate_size, m.num_hidden_layers, m.vocab_size
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    Hq = m.num_attention_heads
    # saved per layer (elements per token); bf16 RMSNorm also keeps an fp32 copy of its input (2x4 bytes)
    per_layer = t * (b * (6 * d + 3 * q + 2 * kv + 4 * f) + 4 * Hq + (2 * 4 * d if b == 2 else 0))
    block_input = t * b * d
    rope = 2 * t * m.head_dim * 4  # cos, sin (fp32), shared by all layers
    final = 3 * t * b * d  # last block output, final norm's normalized value and output (the loss input)
    is_wrapped = [lay.activation_checkpointing == "full" or
                  (lay.activation_checkpointing == "selective" and i % lay.checkpoint_every == 0) for i in range(L)]
    # a checkpointed block keeps its input and, unless parallel.recompute_attention, the
    # attention kernel's output and LSE (selective activation checkpointing keeps the fused
    # kernel's results so the recomputation never reruns attention or its cp communication).
    # CPU kernels tile multi-document calls: about two kernel calls (outputs) per query row.
    calls = 2 if (document_masking and cp == 1 and (device == "cpu" or lay.attention_backend in ("sdpa", "eager"))) else 1
    attn_kept = 0 if lay.recompute_attention else calls * t * (q * b + 4 * Hq)
    kept = [block_input + attn_kept if w else per_layer for w in is_wrapped]
    saved = sum(kept) + rope + final  # at the end of the forward
    # while the last block runs (forward, recomputation, backward), the blocks below keep what
    # they saved and the last block has all of its activations (saved or recomputed)
    top = sum(kept[:-1]) + rope + per_layer
    recompute = per_layer if is_wrapped[-1] else 0
    mlp_saved = t * b * (4 * f + 3 * d)  # a block's MLP half: freed before its attention backward runs
    mlp_bwd = t * b * (3 * f + 2 * d)  # gradient temporaries of the MLP backward (and the residual)

    # attention kernel workspace (per layer, transient)
    if cp == 1:
        attn_fwd = t * q * b
        attn_bwd = t * (q + 2 * kv) * b + (t * q * 4 if device == "gpu" else 0)  # dq/dk/dv (+ flash dq accumulator)
        if device == "gpu" and kv != q:
            attn_bwd += 2 * t * q * b  # flash-attn expands dK/dV to the query heads for GQA
    else:
        attn_fwd = 2 * t * q * 4 + t * q * b  # fp32 output accumulator + merge temporaries, block output
        attn_bwd = t * q * 4 + t * (q + 2 * kv) * b  # fp32 dq accumulator + block gradients
    # Document masks: flash-attn (GPU default) runs packed documents as variable-length
    # sequences. The sdpa/eager kernels (CPU, or chosen on GPU) tile a call that has several
    # documents into 1024 x 1024 blocks: fp32 accumulators for out/lse (forward) and dq/dk/dv
    # (backward) plus boolean masks for the tiles a document boundary crosses (about 2 rows of
    # tiles per boundary; a few documents per row assumed) and one additive mask tile.
    masked = document_masking and (device == "cpu" or lay.attention_backend in ("sdpa", "eager"))
    B = lay.micro_batch_size
    tile = 1024
    rows = t // B  # queries of one kernel call
    if lay.cp_impl == "allgather" and cp > 1:
        keys = lay.seq_len
    elif lay.cp_impl in ("ulysses", "hybrid") and cp > 1:
        rows = keys = lay.seq_len // (lay.ulysses_size if lay.cp_impl == "hybrid" else 1)
    else:
        keys = rows
    if masked:
        boundaries = 2
        mask = B * (boundaries * 2 * max(rows, keys) * min(tile, keys) + tile * tile * b)
        attn_fwd += B * rows * Hq * m.head_dim * 4 // (1 if lay.cp_impl != "ulysses" or cp == 1 else cp)
        attn_bwd += t * (q + 2 * kv) * 4
    else:
        mask = 0
    if lay.attention_backend == "eager":  # materialized fp32 scores and probabilities per tile/call
        mask += 2 * B * Hq * (min(rows, tile) * min(keys, tile) if masked else rows * keys) * 4

    # context-parallel communication buffers (per layer, transient)
    comm_fwd = comm_bwd = 0
    if cp > 1:
        kvb = 2 * t * kv * b  # local K and V
        if lay.cp_impl == "ring":
            comm_fwd = 2 * kvb  # stacked K/V being sent + the one received
            comm_bwd = 2 * kvb + 2 * (2 * t * kv * 4)  # K/V and their fp32 dK/dV travel together
        elif lay.cp_impl == "allgather":
            comm_fwd = cp * kvb  # the whole sequence's K/V
            comm_bwd = cp * kvb + cp * 2 * t * kv * 4  # gathered again + fp32 dK/dV before reduce-scatter
        else:  # ulysses / hybrid: all-to-all of q, k, v and the output; hybrid adds a ring of K/V
            comm_fwd = 2 * t * (2 * q + 2 * kv) * b
            comm_bwd = comm_fwd + 2 * t * (q + 2 * kv) * 4
            if lay.cp_impl == "hybrid" and cp // max(1, lay.ulysses_size) > 1:
                comm_bwd += 2 * kvb * lay.ulysses_size
    # chunked cross-entropy: one chunk's fp32 logits (+ the bf16 matmul output), the fp32 head
    # gradient and the hidden-state gradient, all created in the forward
    c = min(lay.loss_chunk_size, t)
    loss_fwd = c * V * 4 + (2 * c * V * b if b == 2 else 0) + V * d * 4 + t * d * b
    loss_bwd = V * d * 4 + t * d * b + V * d * b + t * d * b  # saved grads, scaled copies
    return {"saved": saved, "top": top, "recompute": recompute, "mlp_saved": mlp_saved, "mlp_bwd": mlp_bwd,
            "attn_fwd": attn_fwd, "attn_bwd": attn_bwd, "mask": mask, "comm_fwd": comm_fwd, "comm_bwd": comm_bwd,
            "loss_fwd": loss_fwd, "loss_bwd": loss_bwd, "tokens": t}


def estimate_layout(m, lay: Layout, *, device: str = "gpu", runtime_overhead_gb: Optional[float] = None,
                    document_masking: bool = True) -> MemoryEstimate:
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
    n = parameter_counts(m)
    ms = _model_states(n, lay, device)
    act = _activations(m, lay, device, document_masking)
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
    head_grad = b_model * n["head"] if z <= 1 else 0.0
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
    info = {"parameters_total": n["total"], "tokens_per_rank": act["tokens"], "layout": dataclasses.asdict(lay)}
    return MemoryEstimate(**comp, phase=peak_phase, host=float(ms["host"]), phases=totals, info=info, device=device)


def estimate_memory(cfg: TrainConfig, stage: RunStage, model_cfg: ModelConfig, world_size: int, *,
                    device: str = "gpu", runtime_overhead_gb: Optional[float] = None) -> MemoryEstimate:
    """Per-device peak memory of `stage` of `cfg` on `world_size` processes (see module doc)."""
    return estimate_layout(model_cfg, layout_of(cfg, stage, world_size), device=device,
                           runtime_overhead_gb=runtime_overhead_gb, document_masking=cfg.data.document_masking)


# ------------------------------------------------------------------------------ output
def fmt_bytes(x: float) -> str:
    return f"{x / GiB:8.2f} GiB"


def format_estimate(est: MemoryEstimate, device_bytes: Optional[float] = None) -> str:
    lay = est.info["layout"]
    unit = "GPU" if est.device == "gpu" else "process (CPU RSS)"
    offload = ", ".join(k for k in ("offload_optimizer", "offload_params") if lay[k]) or "no offload"
    lines = [f"  memory per {unit}: ZeRO-{lay['zero_stage']} ({offload}), {lay['dtype']}, "
             f"checkpointing {lay['activation_checkpointing']}, cp {lay['cp_size']} ({lay['cp_impl']}), "
             f"{est.info['tokens_per_rank']:,} tokens/rank/micro-batch; peak in phase '{est.phase}'"]
    labels = {"parameters": "parameters", "gradients": "gradients", "optimizer": "optimizer states",
              "activations": "activations", "attention": "attention workspace", "loss": "loss workspace",
              "communication": "communication buffers", "runtime": "runtime (context, libraries)"}
    for key in COMPONENTS:
        lines.append(f"    {labels[key]:<30}{fmt_bytes(getattr(est, key))}")
    lines.append(f"    {'total (peak)':<30}{fmt_bytes(est.peak)}")
    if est.host:
        lines.append(f"    {'host memory (offloaded)':<30}{fmt_bytes(est.host)}")
    if device_bytes:
        usable = device_bytes * (GPU_USABLE if est.device == "gpu" else 1.0)
        verdict = "fits" if est.fits(device_bytes) else "does NOT fit"
        lines.append(f"    {verdict} in {device_bytes / GiB:.0f} GiB ({usable / GiB:.1f} GiB usable)")
    return "\n".join(lines)


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str, *, what: str = "--gpu-mem") -> float:
    """'80GB', '80G', '80GiB', '141' (GiB) -> bytes. GPU memory is sold in GiB-ish units, so
    GB and GiB both mean 2**30 here (an '80GB' H100 has 79.6 GiB usable by CUDA)."""
    match = _SIZE.match(str(text))
    if not match:
        raise UserError(f"{what}: cannot read {text!r}; use e.g. 80GB, 141GB or 24GiB")
    value, unit = float(match.group(1)), match.group(2).lower()
    scale = {"": GiB, "k": 2**10, "m": 2**20, "g": GiB, "t": 2**40}[unit]
    if value <= 0:
        raise UserError(f"{what}: must be positive, got {text!r}")
    return value * scale


def parse_length(text: str, *, what: str = "--seq-len") -> int:
    s = str(text).strip().lower()
    mult = 1024 if s.endswith("k") else (1024 * 1024 if s.endswith("m") else 1)
    try:
        n = int(float(s.rstrip("km")) * mult)
    except ValueError:
        raise UserError(f"{what}: cannot read {text!r}; use e.g. 131072 or 128k") from None
    if n < 2:
        raise UserError(f"{what}: must be >= 2, got {text!r}")
    return n
