"""The layout a memory estimate varies (everything of a config that changes memory), and the
relative step time of a layout (to rank the ones that fit)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx.base.errors import UserError
from longctx.config import RunStage, TrainConfig, load_deepspeed_json
from longctx.parallel.heads import HeadShards, auto_ulysses_size
from longctx.parallel.layout import ulysses_degree
from longctx.plan.adapter import AdapterSpec, adapter_spec

BUCKET = int(5e8)  # DeepSpeed reduce_bucket_size / allreduce bucket (elements), our config leaves the default
PREFETCH = int(5e7)  # stage3_prefetch_bucket_size (elements)
MAX_LIVE = int(1e9)  # stage3_max_live_parameters: gathered parameters kept at most
# Offload links and the compute they hide behind (stated, changeable with `longctx plan` flags):
# pinned host <-> GPU copies of PCIe 5 x16 run 40-55 GB/s; 25 GB/s leaves room for the node's other
# traffic. One NVMe drive per GPU reads/writes ~3-6 GB/s sequentially: 3 GB/s. An H100 trains at
# ~40% of its 989 dense bf16 TFLOPS.
PCIE_BYTES_PER_S = 25e9
NVME_BYTES_PER_S = 3e9
DEVICE_FLOPS = 400e12


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
    mlp_tile_tokens: int = 0
    offload_activations: str = "none"  # none | host | disk: checkpointed block inputs (parallel/activation_offload.py)
    offload_params_device: str = "cpu"  # cpu | nvme, with offload_params
    # the links offloaded bytes cross (bytes/s per GPU), and the GPU's sustained training rate
    pcie_bytes_per_s: float = PCIE_BYTES_PER_S
    nvme_bytes_per_s: float = NVME_BYTES_PER_S
    device_flops: float = DEVICE_FLOPS
    # DeepSpeed buffer sizes (elements): its defaults, or a parallel.deepspeed_config's values
    reduce_bucket_size: int = BUCKET
    prefetch_bucket_size: int = PREFETCH
    max_live_parameters: int = MAX_LIVE
    adapter: Optional[AdapterSpec] = None  # train.adapter: only its parameters get gradients and optimizer states


def planned_deepspeed(path: Optional[str]) -> Optional[dict]:
    """A user DeepSpeed JSON for planning a job that may run elsewhere: config.load_deepspeed_json's
    dict, None when it is not set or not readable here (the planner then assumes DeepSpeed's defaults)."""
    if not path:
        return None
    try:
        return load_deepspeed_json(path)
    except UserError:
        return None


def _deepspeed_knobs(user: Optional[dict]) -> dict:
    """Bucket sizes from a user DeepSpeed JSON (parsed), where it sets them."""
    zero = (user or {}).get("zero_optimization") or {}
    keys = {"reduce_bucket_size": "reduce_bucket_size", "stage3_prefetch_bucket_size": "prefetch_bucket_size",
            "stage3_max_live_parameters": "max_live_parameters"}
    return {ours: int(float(zero[theirs])) for theirs, ours in keys.items() if theirs in zero}


def layout_of(cfg: TrainConfig, stage: RunStage, world_size: int, deepspeed: Optional[dict] = None) -> Layout:
    """The layout of one resolved stage of `cfg` (its train section: dtype, batch, loss chunks);
    `deepspeed`: its parallel.deepspeed_config parsed (RunPlan.deepspeed), read here when not given."""
    par, tr = stage.parallel, cfg.train
    if deepspeed is None:
        deepspeed = planned_deepspeed(par.deepspeed_config)
    return Layout(**_deepspeed_knobs(deepspeed), seq_len=stage.seq_len, world_size=world_size,
                  cp_size=par.cp_size, cp_impl=par.cp_impl, ulysses_size=par.ulysses_size, zero_stage=par.zero_stage,
                  offload_optimizer=par.offload_optimizer, offload_params=par.offload_params,
                  activation_checkpointing=par.activation_checkpointing, checkpoint_every=par.checkpoint_every,
                  recompute_attention=par.recompute_attention, micro_batch_size=stage.data.micro_batch_size,
                  grad_accum=tr.grad_accum, dtype=tr.dtype, loss_chunk_size=tr.loss_chunk_size,
                  attention_backend=par.attention_backend, mlp_tile_tokens=par.mlp_tile_tokens,
                  adapter=adapter_spec(tr.adapter), offload_activations=par.offload_activations,
                  offload_params_device=par.offload_params_device)


def head_shards(m, lay: Layout) -> Optional[HeadShards]:
    """The head split of the layout's Ulysses groups (None without an all-to-all); an automatic
    hybrid degree (ulysses_size 0) is resolved as the trainer resolves it."""
    if lay.cp_size == 1:
        return None
    U = ulysses_degree(lay.cp_impl, lay.cp_size, lay.ulysses_size)
    if U == 0:
        U = auto_ulysses_size(lay.cp_size, m.num_attention_heads, m.num_key_value_heads)
    return HeadShards(m.num_attention_heads, m.num_key_value_heads, U) if U and U > 1 else None


def uneven_factors(m, lay: Layout) -> tuple[float, float]:
    """(query, kv) size of a Ulysses member's head-sharded tensors over an even split's: the
    busiest member's ceil(Hq/U) query heads and the kv heads they use (shared kv heads sent to
    two members). (1.0, 1.0) for even splits and layouts without an all-to-all."""
    s = head_shards(m, lay)
    if s is None or s.even:
        return 1.0, 1.0
    return s.waste, s.degree * s.max_kv_heads / s.num_kv_heads


# ------------------------------------------------------------------------ step time
ZERO3_GATHER_COST = 1.05  # parameter all-gathers in forward and backward, mostly overlapped
OFFLOAD_COST = 1.25  # the optimizer step on the host (CPU Adam) and its PCIe copies


def relative_time_per_token(m, lay: Layout) -> float:
    """Predicted training time per token of a layout, relative to the same model with no
    recomputation, ZeRO <= 2 and no offload (1.0); used to rank layouts that fit, not to
    predict seconds. Compute per token is the same for every cp size; activation
    checkpointing re-runs the forward of checkpointed blocks (without the attention kernel
    unless recompute_attention), a tiled MLP (mlp_tile_tokens) runs its forward once more in
    the backward, ZeRO-3 and optimizer offload pay the constants above. Uneven Ulysses head
    shards pay their busiest member's attention (U * ceil(Hq/U) / Hq of an even split's)."""
    c = parameter_counts(m)
    n = m.num_hidden_layers * (c["attn"] + c["mlp"]) + c["head"]  # parameters in matmuls
    attention = m.num_hidden_layers * m.num_attention_heads * m.head_dim * lay.seq_len  # causal: 6 x this
    share = {"none": 0.0, "full": 1.0, "selective": 1.0 / max(1, lay.checkpoint_every)}[lay.activation_checkpointing]
    tiled = 0 < lay.mlp_tile_tokens < lay.micro_batch_size * lay.seq_len // lay.cp_size
    retiled = 2 * m.num_hidden_layers * c["mlp"] if tiled else 0

    def factor_of(attn):  # step time over a step without recomputation at `attn`
        step = 6 * n + 6 * attn
        recomputed = 2 * n + (2 * attn if lay.recompute_attention else 0)
        return 1.0 + (share * recomputed + retiled) / step

    factor = factor_of(attention)
    waste = uneven_factors(m, lay)[0]
    if waste != 1.0:  # the slowest member sets the pace: relative to the even split's step
        factor = factor_of(attention * waste) * (6 * n + 6 * attention * waste) / (6 * n + 6 * attention)
    if lay.zero_stage == 3:
        factor *= ZERO3_GATHER_COST
    if lay.offload_optimizer:
        factor *= OFFLOAD_COST
    return factor * offload_transfer(m, lay)["factor"]


def offload_transfer(m, lay: Layout) -> dict:
    """Seconds per micro-batch the offloads add on their links, and the step-time factor they cost.

    Activations: each checkpointed block's input (t x d x b bytes) goes out in the forward and
    back in the backward (disk: over NVMe, the slower link); the copy of one block hides behind
    that block's compute (its forward, recomputation and backward), only the excess shows.
    Parameters (ZeRO-3 offload_params): each rank's partition crosses the link in the forward
    and again in the backward (nvme: NVMe), overlapped with the step's compute the same way."""
    b = 2 if lay.dtype == "bfloat16" else 4
    t = lay.micro_batch_size * lay.seq_len // lay.cp_size
    L = m.num_hidden_layers
    c = parameter_counts(m)
    flops_layer = 8 * (c["attn"] + c["mlp"]) * t + 8 * m.num_attention_heads * m.head_dim * t * lay.seq_len / 2
    compute_layer = flops_layer / lay.device_flops  # forward + recomputation + backward of one block
    out = {"activations_s": 0.0, "params_s": 0.0, "compute_s": L * compute_layer, "factor": 1.0}
    wrapped = {"none": 0, "full": L, "selective": -(-L // max(1, lay.checkpoint_every))}[lay.activation_checkpointing]
    exposed = 0.0
    if lay.offload_activations != "none" and wrapped:
        link = lay.pcie_bytes_per_s if lay.offload_activations == "host" else lay.nvme_bytes_per_s
        per_block = 2 * t * m.hidden_size * b / link
        out["activations_s"] = wrapped * per_block
        exposed += wrapped * max(0.0, per_block - compute_layer)
    if lay.offload_params and lay.zero_stage == 3:
        link = lay.pcie_bytes_per_s if lay.offload_params_device == "cpu" else lay.nvme_bytes_per_s
        out["params_s"] = 2 * b * c["total"] / lay.world_size / link
        exposed += max(0.0, out["params_s"] - out["compute_s"])
    out["factor"] = 1.0 + exposed / out["compute_s"]
    return out


# ----------------------------------------------------------------------------- counting
def parameter_counts(m) -> dict:
    """Exact parameter counts of longctx's Transformer for a ModelConfig (no model built); of
    transformers' own class for a transformers-path model (built on the meta device)."""
    if hasattr(m, "hf"):  # AutoModelSpec
        from longctx.model.auto.counts import parameter_counts as auto_counts

        return auto_counts(m)
    d, f, D = m.hidden_size, m.intermediate_size, m.head_dim
    q, kv = m.num_attention_heads * D, m.num_key_value_heads * D
    attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv + d) if m.attention_bias else 0)
    attn += (q + 2 * kv) if getattr(m, "qkv_bias", False) and not m.attention_bias else 0  # Qwen2
    attn += 2 * D if getattr(m, "qk_norm", False) else 0  # Qwen3's q_norm and k_norm weights
    mlp = 3 * d * f + ((2 * f + d) if m.mlp_bias else 0)
    layer = attn + mlp + 2 * d
    embed = m.vocab_size * d
    head = 0 if m.tie_word_embeddings else m.vocab_size * d
    total = m.num_hidden_layers * layer + embed + head + d
    return {"total": total, "layer": layer, "embed": embed, "head": head or embed, "mlp": mlp, "attn": attn}
