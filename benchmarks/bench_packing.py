"""Packing on the demo's extension corpus: padding of `pad` vs `fit`, and the step cost of
masking trailing padding vs folding it into the last document (`fold_trailing_padding`).

    .venv/bin/python benchmarks/bench_packing.py [--rows 400] [--steps 6]

  * padding share of 1024-token rows (the demo's extension data: 1/4 to 1 row documents),
    `pad` (the baseline) and `fit` with lookahead 4 / 16 / 64, and the real tokens per row;
  * forward + backward of the demo's 3-layer model (random init, bf16, one thread, 2 rows of
    1024, SDPA on CPU) on the same `pad` batches with the segment ids as packed (the baseline)
    and folded: `--warmup` untimed steps each (default 1), then `--steps` timed rounds interleaved
    (benchlib.timing), median and min; the loss of both is printed to show it is the same.
Prints a markdown table (docs/data.md quotes it).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
from benchlib.report import markdown_table, timing_fields, write_json
from benchlib.timing import DEFAULT_WARMUP, interleaved

from longctx.attention import get_attention
from longctx.data import DataConfig, build_loader, load_tokenizer
from longctx.data.packing import fold_trailing_padding
from longctx.demo import jobs
from longctx.demo.config import FULL
from longctx.model import build_model, get_preset


def extension_config(packing: str, lookahead: int = 16, rows: int = 2) -> DataConfig:
    src = dataclasses.replace(jobs.extend_synthetic(FULL), packing=packing)
    return DataConfig(seq_len=FULL.extend_len, micro_batch_size=rows, prefetch=0, emit_answer_mask=True,
                      fit_lookahead=lookahead, sources=[src])


def padding_share(cfg: DataConfig, tok, n_rows: int) -> float:
    it = iter(build_loader(cfg, tok, dp_rank=0, dp_size=1, seed=0))
    real = total = 0
    while total < n_rows * cfg.seq_len:
        b = next(it)
        # padding: a row's last segment when none of its labels is scored
        seg, lab = b["segment_ids"], b["labels"]
        in_last = seg == seg[:, -1:]
        padded = ((lab != -100) & in_last).sum(1) == 0
        real += int(lab.numel() - (in_last & padded[:, None]).sum())
        total += b["labels"].numel()
    return 1 - real / total


def step(model, b, seg):
    w = 1.0 + 9.0 * b["answer_mask"].float()
    model.zero_grad(set_to_none=True)
    loss, _ = model(b["input_ids"], position_ids=b["position_ids"], segment_ids=seg, labels=b["labels"],
                    loss_weights=w)
    loss.backward()
    return float(loss.detach())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps per variant first")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = load_tokenizer("byte")

    print("| packing | padding share | real tokens per row (x pad) |\n|---|---:|---:|")
    base = padding_share(extension_config("pad"), tok, args.rows)
    shares = {"pad": base}
    print(f"| pad (baseline) | {base:.3f} | 1.00 |")
    for la in (4, 16, 64):
        p = padding_share(extension_config("fit", la), tok, args.rows)
        shares[f"fit, lookahead {la}"] = p
        print(f"| fit, lookahead {la} | {p:.3f} | {(1 - p) / (1 - base):.2f} |")

    overrides = FULL.model_overrides(tok)
    cfg = get_preset("debug-tiny").replace(**overrides, max_position_embeddings=FULL.extend_len)
    model = build_model(cfg, seed=0).to(torch.bfloat16)
    model.set_attention(get_attention("sdpa", "cpu"))
    it = iter(build_loader(extension_config("pad"), tok, dp_rank=0, dp_size=1, seed=0))
    batches = [next(it) for _ in range(args.warmup + args.steps)]  # call k of a variant takes batch k
    losses = {"as packed": [], "folded": []}

    def variant(name):
        def run():
            b = batches[len(losses[name]) % len(batches)]
            seg = b["segment_ids"] if name == "as packed" else fold_trailing_padding(b["segment_ids"], b["labels"])
            losses[name].append(step(model, b, seg))
        return run

    timings = interleaved({name: variant(name) for name in losses}, steps=args.steps, warmup=args.warmup)
    ref = timings["as packed"].median_s
    rows = []
    for name, t in timings.items():
        timed_losses = losses[name][t.warmup:]
        rows.append([f"{name}{' (baseline)' if name == 'as packed' else ''}", f"{t.median_s:.3f}", f"{t.min_s:.3f}",
                     f"{t.median_s / ref:.2f}", f"{statistics.mean(timed_losses):.3f}"])
    print()
    print(markdown_table(["segment ids", "fwd+bwd s (median)", "min s", "x as packed", "mean loss sum"], rows,
                         "lrrrr"))
    if args.json:
        write_json(args.json, {"padding_share": shares, "steps": [{"segment_ids": name, **timing_fields(t)}
                                                                  for name, t in timings.items()]})


if __name__ == "__main__":
    main()
