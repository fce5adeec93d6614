"""`longctx demo`: the built-in default job.

Until the full pipeline lands this is the smallest real end-to-end run: build the tiny model,
train it for a few steps on built-in text, save it in Hugging Face format, load it back and
greedily continue a prompt.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

_TEXT = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
         "One of the special magic numbers for long-context is: 4096. ") * 4


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from longctx.errors import UserError
    from longctx.model import build_model, count_parameters, get_preset
    from longctx.model.generate import generate
    from longctx.model.hf import save_pretrained
    from longctx.model.loading import load_any

    if args.steps <= 0:
        raise UserError(f"--steps: must be a positive integer, got {args.steps}")
    torch.manual_seed(args.seed)
    cfg = get_preset("debug-tiny")
    model = build_model(cfg, seed=args.seed)
    print(f"model debug-tiny: {count_parameters(model):,} parameters, rope {cfg.rope_type}")
    data = torch.tensor(list(_TEXT.encode()), dtype=torch.long)[None]  # (1, T) bytes as tokens
    inputs, labels = data[:, :-1], data[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = time.time()
    bar = tqdm(range(args.steps), desc="train", unit="step")
    for _ in bar:
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    tokens = args.steps * inputs.numel()
    print(f"trained {args.steps} steps, final loss {loss.item():.3f}, {tokens / (time.time() - start):,.0f} tokens/s")
    out = Path(args.out)
    save_pretrained(model, out / "hf")
    reloaded = load_any(out / "hf").eval()
    prompt = "One of the special magic numbers for long-context is: "
    new = generate(reloaded, [list(prompt.encode())], max_new_tokens=12)[0]
    print(f"saved {out / 'hf'}; greedy continuation of {prompt!r}: {bytes(t for t in new if t < 256).decode(errors='replace')!r}")
    return 0
