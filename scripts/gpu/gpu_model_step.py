"""The model step alone, on a training config's own shapes and batches: forward + backward of
grad_accum micro-batches and one torch AdamW step, with the config's attention backend,
activation checkpointing and loss chunk; no trainer, no DeepSpeed, one process. Its median step
time is what `longctx train` should come within a few percent of (scripts/gpu/gpu_recipe_speed.sh).

    python scripts/gpu/gpu_model_step.py --config FILE [key=value ...] --steps 8 --warmup 2 --out step.json

Batches come from the config's own data loader (the same documents, so the same attention
work); times are synchronised wall clock per optimizer step, median after --warmup.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from longctx.attention import get_attention
from longctx.base.errors import UserError
from longctx.config import load_config
from longctx.config.run_plan import derive_plan
from longctx.data import load_tokenizer
from longctx.data.loader import ModelInputs
from longctx.parallel.checkpointing import apply_activation_checkpointing
from longctx.train.build import build_plain_model
from longctx.train.mfu import flops_per_token, peak_flops_per_device
from longctx.train.stages import build_stage_loader


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="a training config (default: longctx's defaults)")
    p.add_argument("overrides", nargs="*", help="key=value, as for longctx train")
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first")
    p.add_argument("--out", help="write the result as JSON")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise UserError("--steps: must be >= 1 and --warmup >= 0")
    return args


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    try:
        args = parse(argv)
        cfg = load_config(args.config, args.overrides)
        plan = derive_plan(cfg, 1)
        stage = plan.stages[0]
        tokenizer = load_tokenizer(cfg.data.tokenizer)
        if plan.stages[0].parallel.cp_size != 1:
            raise UserError(f"parallel.cp_size: {plan.stages[0].parallel.cp_size}; the model step is one device: use 1")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    par, model_cfg = stage.parallel, plan.model_configs[0]
    model, weights = build_plain_model(cfg, model_cfg, device)
    model.set_attention(get_attention(par.attention_backend, device))  # cp 1: the local kernel
    apply_activation_checkpointing(model, par.activation_checkpointing, par.checkpoint_every,
                                   recompute_attention=par.recompute_attention)
    model.set_mlp_tiling(par.mlp_tile_tokens)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                            weight_decay=cfg.optim.weight_decay)
    collate = ModelInputs(stage.data.document_masking, cfg.train.answer_loss_weight,
                          trim_multiple=plan.trim_multiple(stage.index))
    batches = iter(build_stage_loader(stage, cfg.train.seed, tokenizer, dp_rank=0, dp_size=1, collate=collate))
    accum, times, tokens = cfg.train.grad_accum, [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(args.warmup + args.steps):
        micro = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in next(batches).items()}
                 for _ in range(accum)]
        sync(device)
        t0 = time.perf_counter()
        for inputs in micro:
            loss_sum, n = model(inputs["input_ids"], position_ids=inputs["position_ids"],
                                segment_ids=inputs.get("segment_ids"), labels=inputs["labels"],
                                loss_chunk_size=cfg.train.loss_chunk_size)
            (loss_sum / (n * accum)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(sum(int(x["real_tokens"].sum()) for x in micro))
    step_s = statistics.median(times)
    seq_len = stage.data.seq_len
    step_tokens = accum * stage.data.micro_batch_size * seq_len
    peak = peak_flops_per_device(None, getattr(torch, cfg.train.dtype))[0] if device.type == "cuda" else None
    result = {"config": args.config, "overrides": args.overrides, "weights": weights, "device": str(device),
              "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
              "attention_backend": par.attention_backend, "grad_accum": accum, "seq_len": seq_len,
              "steps": args.steps, "warmup": args.warmup, "step_s": step_s, "min_step_s": min(times),
              "tokens_per_s": step_tokens / step_s, "real_tokens_per_s": statistics.median(tokens) / step_s,
              "mfu": flops_per_token(model_cfg, seq_len) * step_tokens / step_s / peak if peak else None,
              "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
