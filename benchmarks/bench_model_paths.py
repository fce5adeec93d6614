"""The transformers path against the native path on the same Llama model: one training step
(forward, chunked loss, backward) of each, interleaved in one process, and each step's peak host
memory above what the process held before it.

    python benchmarks/bench_model_paths.py --lengths 4096,16384 --steps 3 --out docs/results/x.json

Both models hold the same weights (the native model's, under transformers' names): the losses
agree first, then the timing. The ratio is transformers path / native; the issue's bar is
<= 1.3x step time and <= 1.2x peak memory. One CPU process with every core (torch threads), fp32.
"""
from __future__ import annotations

import argparse
import platform
import sys

import torch
from benchlib.memory import peak_rss_bytes, reset_peak, return_freed_memory, rss_bytes
from benchlib.report import write_json
from benchlib.timing import interleaved

from longctx.model import build_model, get_preset
from longctx.model.auto import AutoModelSpec, build_auto_model
from longctx.model.hf import to_hf_key
from longctx.model.hf_config import config_to_hf

GiB = 2**30


def _models(preset: str):
    native = build_model(get_preset(preset), seed=0)
    spec = AutoModelSpec.from_hf(config_to_hf(native.config, torch.float32))  # LlamaForCausalLM's config.json
    auto = build_auto_model(spec, dtype=torch.float32)
    auto.load_state_dict({to_hf_key(k): v for k, v in native.state_dict().items()}, strict=True)
    return native, auto


def _step(model, ids, labels):
    def run():
        model.zero_grad(set_to_none=True)
        loss_sum, n = model(ids, labels=labels, loss_chunk_size=1024)
        (loss_sum / n).backward()
        return (loss_sum / n).item()
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="bench-44m")
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    return_freed_memory()  # freed tensors leave RSS: the peak above the start is the step's working set
    native, auto = _models(args.preset)
    rows = []
    for T in (int(x) for x in args.lengths.split(",")):
        ids = torch.randint(0, native.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
        labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
        contenders = {"native": _step(native, ids, labels), "transformers": _step(auto, ids, labels)}
        losses = {name: fn() for name, fn in contenders.items()}  # also the warm-up
        peaks = {name: 0 for name in contenders}
        start = {}

        def before(name):
            start[name] = rss_bytes()
            reset_peak()

        def after(name):
            peaks[name] = max(peaks[name], peak_rss_bytes() - start[name])

        timing = interleaved(contenders, steps=args.steps, warmup=0, before=before, after=after)
        row = {"seq_len": T, "loss_native": losses["native"], "loss_transformers": losses["transformers"],
               **{f"{n}_median_s": t.median_s for n, t in timing.items()},
               **{f"{n}_min_s": t.min_s for n, t in timing.items()},
               **{f"{n}_peak_step_gib": peaks[n] / GiB for n in peaks},
               "time_ratio": timing["transformers"].median_s / timing["native"].median_s,
               "memory_ratio": peaks["transformers"] / peaks["native"]}
        rows.append(row)
        print(f"T={T}: loss {losses['native']:.6f} / {losses['transformers']:.6f}; step native "
              f"{row['native_median_s']:.2f}s, transformers {row['transformers_median_s']:.2f}s "
              f"({row['time_ratio']:.2f}x); step peak native {row['native_peak_step_gib']:.2f} GiB, transformers "
              f"{row['transformers_peak_step_gib']:.2f} GiB ({row['memory_ratio']:.2f}x)", flush=True)
    if args.out:
        write_json(args.out, {"command": " ".join(["python", *sys.argv]), "preset": args.preset,
                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                              "cpu": platform.processor() or platform.machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
