"""Training step: longctx vs Hugging Face transformers on the same model and shapes (CPU).

Both sides: preset bench-44m (4 layers, d512, 8/4 heads, vocab 32000), bf16 parameters,
full activation checkpointing, AdamW, one sequence of T tokens per step, single process.
  ours: Transformer + apply_activation_checkpointing("full") + chunked cross-entropy
        (default: attention kernel outputs kept; `ours-recompute-all` recomputes them too)
  hf:   LlamaForCausalLM(attn_implementation="sdpa") + gradient_checkpointing_enable(),
        model(input_ids, labels=labels).loss  (what a user would run)
Each (impl, T) runs in a fresh subprocess so peak RSS is its own; reported: median step
time over the timed steps, tokens/s, and peak RSS growth over the process baseline after
the model and optimizer exist (peak RSS, VmHWM, - RSS before the first step).

    python benchmarks/bench_train.py --seq-lens 16384,32768,65536 --steps 2 --out docs/bench_train.json

On a GPU (`--device cuda`): the same comparison with peak CUDA memory (max_memory_allocated
after the first step's start) instead of RSS, and TF32 left at torch's defaults; `--preset`
and `--layers` pick a bigger model (e.g. llama3-8b's layer shapes, 4 layers):

    python benchmarks/bench_train.py --device cuda --preset llama3-8b --layers 4 --seq-lens 8192,32768

`--init-from DIR` (a Hugging Face Llama directory, e.g. SmolLM2-135M-Instruct's): both sides load
one checkpoint with its shape and weights (`--random-weights`: its shape, random weights):

    python benchmarks/bench_train.py --init-from /work/models/smollm2-135m-instruct --seq-lens 4096,8192,16384
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_model import add_model_args, check_model_args, model_source, write_checkpoint  # noqa: E402


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(impl: str, seq_len: int, steps: int, warmup: int, device: str = "cpu", preset: str = "bench-44m",
           layers: int = 0, ckpt: str | None = None) -> dict:
    """One (impl, T) measurement; `ckpt`: the HF checkpoint both sides load (else a preset's
    random weights, built by each side)."""
    import torch

    from longctx.model import build_model, get_preset
    from longctx.model.hf import load_pretrained, read_hf_config
    from longctx.train.metrics import peak_rss_bytes

    torch.manual_seed(0)
    if ckpt:
        cfg = read_hf_config(ckpt)
    else:
        cfg = get_preset(preset).replace(max_position_embeddings=max(seq_len, 4096))
        if layers:
            cfg = cfg.replace(num_hidden_layers=layers)
    cuda = device == "cuda"
    if impl in ("ours", "ours-recompute-all"):
        from longctx.parallel.checkpointing import apply_activation_checkpointing

        if ckpt:
            model = load_pretrained(ckpt, dtype=torch.bfloat16, device=device)
        else:
            model = build_model(cfg, seed=0, device=device).to(torch.bfloat16)
        # "ours" keeps attention kernel outputs in checkpointed blocks (the default);
        # "ours-recompute-all" recomputes everything, exactly like HF's checkpointing.
        apply_activation_checkpointing(model, "full", recompute_attention=impl != "ours")

        def step_loss(ids, labels):
            loss_sum, n = model(ids, labels=labels, loss_chunk_size=2048)
            return loss_sum / n
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        from longctx.model.hf import config_to_hf

        if ckpt:
            model = LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, attn_implementation="sdpa").to(device)
        else:
            hf_cfg = config_to_hf(cfg, torch.bfloat16)
            for key in ("architectures", "model_type", "torch_dtype", "rope_scaling", "rope_theta"):
                hf_cfg.pop(key)
            model = LlamaForCausalLM(LlamaConfig(**hf_cfg, attn_implementation="sdpa")).to(device, torch.bfloat16)
        model.gradient_checkpointing_enable()
        model.config.use_cache = False

        def step_loss(ids, labels):
            return model(input_ids=ids, labels=labels).loss
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len)).to(device)
    # HF shifts labels internally; ours takes pre-shifted labels: both see the same targets
    labels = ids.clone() if impl == "hf" else torch.cat([ids[:, 1:], torch.full((1, 1), -100, device=device)], 1)
    base = torch.cuda.memory_allocated() if cuda else _rss_bytes()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(warmup + steps):
        start = time.perf_counter()
        loss = step_loss(ids, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))  # a host sync: the step's kernels have finished
        if i >= warmup:
            times.append(time.perf_counter() - start)
    t = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss_bytes()
    mfu = None
    if cuda:  # model FLOPs (no recomputation counted) over the device's bf16 peak
        from longctx.train.metrics import flops_per_token, peak_flops_per_device

        mfu = flops_per_token(cfg, seq_len) * seq_len / t / peak_flops_per_device(None, torch.bfloat16)[0]
    return {"impl": impl, "seq_len": seq_len, "device": device, "preset": None if ckpt else preset,
            "layers": cfg.num_hidden_layers,
            "step_s": t, "tokens_per_s": seq_len / t,
            "peak_rss_gb": peak / 2**30, "peak_growth_gb": (peak - base) / 2**30,
            "loss": losses[0], "threads": torch.get_num_threads(), "mfu": mfu,
            "gpu": torch.cuda.get_device_name() if cuda else None}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-lens", default="16384,32768,65536")
    ap.add_argument("--impls", default="ours,hf")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--hf-max-len", type=int, default=32768, help="skip HF above this (64k does not fit in 24 GiB)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_model_args(ap)
    ap.add_argument("--worker", nargs=2, metavar=("IMPL", "SEQ_LEN"))
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)  # a worker's checkpoint (written by the parent)
    args = ap.parse_args(argv)
    args.lengths = [int(x) for x in args.seq_lens.split(",")]
    if not args.worker:
        check_model_args(args)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.steps, args.warmup, args.device,
                                args.preset, args.layers, args.ckpt)))
        return
    with tempfile.TemporaryDirectory() as d:
        ckpt = None
        if args.init_from:  # one checkpoint both sides load: the directory's shape (and weights)
            ckpt = os.path.join(d, "hf")
            write_checkpoint(args, ckpt, max(args.lengths))
        rows = run(args, ckpt)
    report(args, rows)


def run(args, ckpt) -> list[dict]:
    rows = []
    for T in args.lengths:
        for impl in args.impls.split(","):
            if impl == "hf" and T > args.hf_max_len:
                rows.append({"impl": impl, "seq_len": T, "skipped": f"> --hf-max-len {args.hf_max_len}"})
                continue
            cmd = [sys.executable, __file__, "--worker", impl, str(T), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--device", args.device, "--preset", args.preset,
                   "--layers", str(args.layers)] + (["--ckpt", ckpt] if ckpt else [])
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                rows.append({"impl": impl, "seq_len": T, "failed": res.stderr.strip().splitlines()[-1:]})
            else:
                rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            rows[-1]["model"] = model_source(args)
            print(json.dumps(rows[-1]), flush=True)
    return rows


def report(args, rows: list[dict]) -> None:
    by = {(r["impl"], r["seq_len"]): r for r in rows if "step_s" in r}
    gpu = args.device == "cuda"
    extra = " ours MFU | HF MFU |" if gpu else ""
    print("\n| T | ours tok/s | HF tok/s | speed ratio | ours peak growth GB | "
          f"HF peak growth GB | memory ratio |{extra}")
    print("|---|---|---|---|---|---|---|" + ("---|---|" if gpu else ""))
    for T in sorted({r["seq_len"] for r in rows}):
        o, h = by.get(("ours", T)), by.get(("hf", T))
        fmt = lambda r, k, f: (f % r[k]) if r else "—"  # noqa: E731
        ratio = f"{o['tokens_per_s'] / h['tokens_per_s']:.2f}x" if o and h else "—"
        mem = f"{o['peak_growth_gb'] / h['peak_growth_gb']:.3f}" if o and h else "—"
        mfu = f" {fmt(o, 'mfu', '%.3f')} | {fmt(h, 'mfu', '%.3f')} |" if gpu else ""
        print(f"| {T} | {fmt(o, 'tokens_per_s', '%.0f')} | {fmt(h, 'tokens_per_s', '%.0f')} | {ratio} | "
              f"{fmt(o, 'peak_growth_gb', '%.2f')} | {fmt(h, 'peak_growth_gb', '%.2f')} | {mem} |{mfu}")
    if ("ours", 32768) in by and ("ours", 65536) in by:
        print("\nours 64k / 32k peak growth: "
              f"{by[('ours', 65536)]['peak_growth_gb'] / by[('ours', 32768)]['peak_growth_gb']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
