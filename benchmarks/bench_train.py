"""Training step: longctx vs Hugging Face transformers on the same model and shapes (CPU).

Both sides: preset bench-44m (4 layers, d512, 8/4 heads, vocab 32000), bf16 parameters,
full activation checkpointing, AdamW, one sequence of T tokens per step, single process.
  ours: Transformer + apply_activation_checkpointing("full") + chunked cross-entropy
        (default: attention kernel outputs kept; `ours-recompute-all` recomputes them too)
  hf:   LlamaForCausalLM(attn_implementation="sdpa") + gradient_checkpointing_enable(),
        model(input_ids, labels=labels).loss  (what a user would run)
Each (impl, T) lives in a subprocess of its own so peak RSS is its own; the parent steps them
interleaved (benchlib.timing: `--warmup` untimed steps, then `--steps` timed rounds, each process
resident while the other steps). Reported: median and min step time, tokens/s at the median,
and peak RSS growth over the process baseline after the model and optimizer exist (peak RSS,
VmHWM, - RSS before the first step), with big blocks mmapped so freed tensors leave RSS.

    python benchmarks/bench_train.py --seq-lens 16384,32768,65536 --out docs/results/bench_train.json

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
import sys
import tempfile

from benchlib.memory import mmap_env, peak_rss_bytes, rss_bytes
from benchlib.model import add_model_args, check_model_args, model_source, write_checkpoint
from benchlib.report import timing_fields, write_json
from benchlib.timing import DEFAULT_STEPS, DEFAULT_WARMUP, interleaved
from benchlib.worker import StepProcess, serve_steps


class TrainStep:
    """One contender (impl) at one length: the model, its optimizer and the batch; `step()` is one
    training step. `ckpt`: the HF checkpoint both sides load (else a preset's random weights)."""

    def __init__(self, impl: str, seq_len: int, device: str = "cpu", preset: str = "bench-44m", layers: int = 0,
                 ckpt: str | None = None):
        import torch

        from longctx.model import build_model, get_preset
        from longctx.model.hf import load_pretrained, read_hf_config

        torch.manual_seed(0)
        if ckpt:
            cfg = read_hf_config(ckpt)
        else:
            cfg = get_preset(preset).replace(max_position_embeddings=max(seq_len, 4096))
            if layers:
                cfg = cfg.replace(num_hidden_layers=layers)
        self.impl, self.seq_len, self.device, self.cfg = impl, seq_len, device, cfg
        self.preset = None if ckpt else preset
        self.cuda = device == "cuda"
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
                model = LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16,
                                                         attn_implementation="sdpa").to(device)
            else:  # the config.json our export writes, read as from_pretrained reads it
                hf_cfg = LlamaConfig.from_dict(json.loads(json.dumps(config_to_hf(cfg, torch.bfloat16))))
                hf_cfg._attn_implementation = "sdpa"
                model = LlamaForCausalLM(hf_cfg).to(device, torch.bfloat16)
            model.gradient_checkpointing_enable()
            model.config.use_cache = False

            def step_loss(ids, labels):
                return model(input_ids=ids, labels=labels).loss
        model.train()
        self.step_loss = step_loss
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.ids = torch.randint(0, cfg.vocab_size, (1, seq_len)).to(device)
        # HF shifts labels internally; ours takes pre-shifted labels: both see the same targets
        self.labels = (self.ids.clone() if impl == "hf"
                       else torch.cat([self.ids[:, 1:], torch.full((1, 1), -100, device=device)], 1))
        self.base = torch.cuda.memory_allocated() if self.cuda else rss_bytes()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.losses: list[float] = []

    def step(self) -> dict:
        loss = self.step_loss(self.ids, self.labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(float(loss.detach()))  # a host sync: the step's kernels have finished
        return {"loss": self.losses[-1]}

    def summary(self) -> dict:
        """The process's memory and what the parent needs for MFU (model FLOPs of a step, no
        recomputation counted, and the device's bf16 peak)."""
        import torch

        from longctx.train.mfu import flops_per_token, peak_flops_per_device

        peak = torch.cuda.max_memory_allocated() if self.cuda else peak_rss_bytes()
        return {"impl": self.impl, "seq_len": self.seq_len, "device": self.device, "preset": self.preset,
                "layers": self.cfg.num_hidden_layers,
                "peak_rss_gb": peak / 2**30, "peak_growth_gb": (peak - self.base) / 2**30,
                "loss": self.losses[0] if self.losses else None, "threads": torch.get_num_threads(),
                "step_flops": flops_per_token(self.cfg, self.seq_len) * self.seq_len,
                "peak_flops": peak_flops_per_device(None, torch.bfloat16)[0] if self.cuda else None,
                "gpu": torch.cuda.get_device_name() if self.cuda else None}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-lens", default="16384,32768,65536")
    ap.add_argument("--impls", default="ours,hf")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="timed steps per contender and length")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps per contender first")
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
        contender = TrainStep(args.worker[0], int(args.worker[1]), args.device, args.preset, args.layers, args.ckpt)
        serve_steps(contender.step, contender.summary)
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
        procs, failed = {}, {}
        for impl in args.impls.split(","):
            if impl == "hf" and T > args.hf_max_len:
                failed[impl] = {"skipped": f"> --hf-max-len {args.hf_max_len}"}
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, str(T), "--device", args.device,
                   "--preset", args.preset, "--layers", str(args.layers)] + (["--ckpt", ckpt] if ckpt else [])
            try:
                procs[impl] = StepProcess(cmd, env=mmap_env())
            except RuntimeError as e:
                failed[impl] = {"failed": [str(e)]}

        def stepper(impl):
            def step():  # a contender that dies mid-run becomes a failed row; the others go on
                if impl in procs:
                    try:
                        procs[impl].step()
                    except (RuntimeError, OSError) as e:
                        procs.pop(impl).kill()
                        failed[impl] = {"failed": [str(e)]}
            return step

        timings = interleaved({impl: stepper(impl) for impl in list(procs)}, steps=args.steps, warmup=args.warmup)
        for impl in args.impls.split(","):
            if impl in procs:
                row = procs[impl].finish()
                t = timings[impl]
                peak_flops = row.pop("peak_flops")
                row.update(step_s=t.median_s, tokens_per_s=T / t.median_s, **timing_fields(t),
                           mfu=row["step_flops"] / t.median_s / peak_flops if peak_flops else None)
            else:
                row = {"impl": impl, "seq_len": T, **failed[impl]}
            row["model"] = model_source(args)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # every finished row is on disk: a run stopped at a time limit keeps them
                write_json(args.out, rows, indent=2)
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
    timed = [r for r in rows if "steps" in r]
    if timed:
        print(f"\n{timed[0]['warmup']} warm-up + {timed[0]['steps']} timed steps per contender, interleaved; "
              "tok/s at the median step")
    if args.out:
        write_json(args.out, rows, indent=2)


if __name__ == "__main__":
    main()
