"""The planner's advice: for a model and a layout, the options (cp, ZeRO, checkpointing, offloads)
that fit a device, the one to recommend, and the longest sequence a layout takes, with offloads or
without (longctx/plan/command.py prints them as `longctx plan`'s report).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from longctx.base.errors import UserError
from longctx.model.config import ModelConfig
from longctx.parallel.layout import ulysses_degree, validate_cp
from longctx.plan import (
    GPU_USABLE,
    Layout,
    estimate_layout,
    relative_time_per_token,
)
from longctx.plan.layout import offload_transfer

CHECKPOINTING_ORDER = ("none", "selective", "full")
HOST_USABLE = 0.9  # of a node's host memory, for offloads (the rest: the OS, data loaders, page cache)
DEFAULT_HOST_MEM = "2TB"  # a DGX H100 node's
MLP_TILE = 8192  # parallel.mlp_tile_tokens the offload tier proposes with ZeRO-2


def _valid_cp(cp: int, layout: Layout, model_cfg: ModelConfig) -> bool:
    """Whether the trainer accepts this cp size for the layout (longctx.parallel.layout's checks)."""
    try:
        validate_cp(layout.world_size, cp, layout.cp_impl, ulysses_degree(layout.cp_impl, cp, layout.ulysses_size),
                    model_cfg.num_attention_heads, model_cfg.num_key_value_heads, layout.seq_len)
    except UserError:
        return False
    return True


def _option_tiers(device: str) -> list[list[dict]]:
    """The layouts advice tries, in tiers: a later tier only when nothing of the earlier ones fits.
    1: ZeRO 0-3 x checkpointing; 2: + optimizer offload; 3: + the checkpointed block inputs
    offloaded (host memory, or a per-rank file) and the parameters (ZeRO-3: host memory or NVMe),
    with the attention kernel recomputed (the block keeps nothing but its input). On CPU the host
    is the device: only the file and NVMe offloads save memory there."""
    plain = [dict(zero_stage=z, activation_checkpointing=ac) for z in (0, 1, 2, 3) for ac in CHECKPOINTING_ORDER]
    optimizer = [dict(zero_stage=z, activation_checkpointing="full", offload_optimizer=True) for z in (2, 3)]
    acts = ("host", "disk") if device == "gpu" else ("disk",)
    params = ((False, "cpu"), (True, "cpu"), (True, "nvme")) if device == "gpu" else ((False, "cpu"), (True, "nvme"))
    everything = [dict(zero_stage=3, activation_checkpointing="full", offload_optimizer=True, offload_activations=a,
                       offload_params=p, offload_params_device=pd, recompute_attention=ra)
                  for a in acts for p, pd in params for ra in (False, True)]
    # ZeRO-2 instead: the MLP may run in sequence tiles there (refused under ZeRO-3), which
    # takes the widest per-block activations (4 x intermediate per token) off the device
    tiled = [dict(zero_stage=2, activation_checkpointing="full", offload_optimizer=True, offload_activations=a,
                  recompute_attention=ra, mlp_tile_tokens=MLP_TILE) for a in acts for ra in (False, True)]
    return [plain, optimizer, everything + tiled]




def largest_term(est) -> str:
    """'activations 48.3 GiB': the biggest component of an estimate."""
    name, value = max(est.components().items(), key=lambda kv: kv[1])
    return f"{name} {value / 2**30:.1f} GiB"


def advise(model_cfg, layout, device_bytes: float, *, device: str, runtime_gb: Optional[float],
           document_masking: bool = True, host_bytes: Optional[float] = None) -> list[dict]:
    """For each valid cp size (ascending): of the options that fit (_option_tiers: the first
    tier with a fitting option), the one with the lowest predicted time per token (ties: the
    lower ZeRO stage, less checkpointing). `host_bytes`: host memory per process, which the
    host-offloaded bytes (optimizer, parameters, activations) must fit (None: not checked)."""
    rows = []
    world = layout.world_size
    for cp in range(1, world + 1):
        if not _valid_cp(cp, layout, model_cfg):
            continue
        found = None
        smallest = None
        for tier, options in enumerate(_option_tiers(device)):
            for option in options:
                lay = _with(layout, cp, option)
                est = estimate_layout(model_cfg, lay, device=device, runtime_overhead_gb=runtime_gb,
                                      document_masking=document_masking)
                if smallest is None or est.peak < smallest[1].peak:
                    smallest = (lay, est, tier)
                time = relative_time_per_token(model_cfg, lay)
                fits = est.fits(device_bytes) and (host_bytes is None or est.host <= host_bytes)
                if fits and (found is None or time < found[3] - 1e-9):
                    found = (lay, est, tier, time)
            if found:
                break
        lay, est, tier = found[:3] if found else smallest
        transfer = offload_transfer(model_cfg, lay)
        row = {"cp_size": cp, "dp_size": world // cp, "fits": found is not None, "zero_stage": lay.zero_stage,
               "activation_checkpointing": lay.activation_checkpointing,
               "offload_optimizer": lay.offload_optimizer, "offload_activations": lay.offload_activations,
               "offload_params": lay.offload_params_device if lay.offload_params else "none",
               "recompute_attention": lay.recompute_attention, "mlp_tile_tokens": lay.mlp_tile_tokens,
               "offload_tier": tier,
               "peak_gib": round(est.peak_gb, 2), "host_gib": round(est.host / 2**30, 2),
               "disk_gib": round(est.disk / 2**30, 2),
               "transfer_s": round(transfer["activations_s"] + transfer["params_s"], 3),
               "compute_s": round(transfer["compute_s"], 3),
               "tokens_per_rank": lay.micro_batch_size * lay.seq_len // cp,
               "micro_batch_size": lay.micro_batch_size,
               "relative_time_per_token": round(relative_time_per_token(model_cfg, lay), 3)}
        if found is None:
            over = est.peak - device_bytes * (GPU_USABLE if device == "gpu" else 1.0)
            row["stopped_by"] = (f"{over / 2**30:.1f} GiB over the device ({largest_term(est)})" if over > 0 else
                                 f"host memory: {est.host / 2**30:.1f} GiB per process > {host_bytes / 2**30:.1f}")
        rows.append(row)
    return rows


def recommend(rows: list[dict]) -> Optional[dict]:
    """The fitting row with the lowest predicted time per token; offload only if nothing
    else fits (the lowest offload tier first); ties: the smaller cp (less communication)."""
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        return None
    tier = min(r.get("offload_tier", 1 if r["offload_optimizer"] else 0) for r in fitting)
    lowest = [r for r in fitting if r.get("offload_tier", 1 if r["offload_optimizer"] else 0) == tier]
    return min(lowest, key=lambda r: (r["relative_time_per_token"], r["cp_size"]))


def longest_with_offload(model_cfg, layout, device_bytes: float, *, device: str, runtime_gb: Optional[float],
                         document_masking: bool = True, host_bytes: Optional[float] = None) -> dict:
    """The longest sequence any advised option takes, at the largest valid cp size (the fewest
    tokens per rank; ZeRO shards over the world whatever the cp), with the advice row there and
    at twice that length, whose `stopped_by` names the term that stops it:
    {'seq_len', 'row', 'next'}."""
    cps = [cp for cp in range(layout.world_size, 0, -1)
           if _valid_cp(cp, dataclasses.replace(layout, seq_len=2 * cp * 64), model_cfg)]
    if not cps:
        return {"seq_len": 0, "row": None, "next": None}
    cp, best = cps[0], (0, None)
    at = dict(device=device, runtime_gb=runtime_gb, document_masking=document_masking, host_bytes=host_bytes)
    for options in _option_tiers(device):
        for option in options:
            lay = _with(layout, cp, option)
            n = max_length(model_cfg, lay, device_bytes, **at)
            if n > best[0]:
                best = (n, lay)
    n = best[0]
    if n == 0:
        return {"seq_len": 0, "row": None, "next": None}
    return {"seq_len": n, "row": _row_at(model_cfg, layout, cp, n, device_bytes, **at),
            "next": _row_at(model_cfg, layout, cp, 2 * n, device_bytes, **at)}


def _row_at(model_cfg, layout, cp: int, seq_len: int, device_bytes, **kw) -> Optional[dict]:
    """The advice row of cp size `cp` at `seq_len` (None when that cp is not valid there)."""
    rows = advise(model_cfg, dataclasses.replace(layout, seq_len=seq_len), device_bytes, **kw)
    return next((r for r in rows if r["cp_size"] == cp), None)


def _with(layout, cp: int, option: dict):
    """`layout` at cp size `cp` with an advice option's settings; ZeRO-3 runs no MLP tiles (the
    config refuses them there)."""
    base = {"offload_optimizer": False, "offload_params": False, "offload_activations": "none"}
    if option.get("zero_stage") == 3:
        base["mlp_tile_tokens"] = 0
    return dataclasses.replace(layout, cp_size=cp, **{**base, **option})




def max_length(model_cfg, layout, device_bytes: float, *, device: str, runtime_gb: Optional[float],
               document_masking: bool = True, host_bytes: Optional[float] = None) -> int:
    """Longest sequence (a multiple of 2 x cp x 64) that fits with this exact layout (and its
    host-offloaded bytes in `host_bytes`, when given)."""
    unit = 2 * layout.cp_size * 64

    def fits(n: int) -> bool:
        lay = dataclasses.replace(layout, seq_len=n * unit)
        est = estimate_layout(model_cfg, lay, device=device, runtime_overhead_gb=runtime_gb,
                              document_masking=document_masking)
        return est.fits(device_bytes) and (host_bytes is None or est.host <= host_bytes)

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi) and hi < 2**24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * unit
