"""Does a model's niah_multikey_2 score depend on where the queried needle sits?

Takes the prompts an eval saved (`longctx eval ... --tasks niah_multikey_2 --save-inputs`),
swaps the queried needle's line with the first, middle or last needle line (the haystack is
otherwise unchanged: same needles, same length), greedily decodes each variant and prints the
accuracy per placement:

    python scripts/tools/probe_needle_position.py --model runs/demo/extend/hf --results EVAL/results.json

A model that matches keys scores the same everywhere; one that guesses by position does not
(docs/demo.md, "How the recipe was found").
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

import longctx
from longctx.data.tokenizer import load_tokenizer
from longctx.model.generate import generate

NEEDLE = re.compile(r"One of the special magic numbers for [\w-]+ is: \d+\.")
PLACEMENTS = ("as generated", "first", "middle", "last")


def variant(prompt: str, value: str, placement: str) -> str:
    """The prompt with the needle holding `value` moved to `placement` (swapped lines)."""
    lines = prompt.split("\n")
    needles = [i for i, line in enumerate(lines) if NEEDLE.fullmatch(line.strip())]
    if placement == "as generated":
        return prompt
    target = next(i for i in needles if value in lines[i])
    other = {"first": needles[0], "middle": needles[len(needles) // 2], "last": needles[-1]}[placement]
    lines[target], lines[other] = lines[other], lines[target]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="an HF export or longctx checkpoint directory")
    ap.add_argument("--results", required=True, help="results.json of an eval run with --save-inputs")
    ap.add_argument("--batch", type=int, default=20)
    args = ap.parse_args(argv)
    for flag, path in (("--model", args.model), ("--results", args.results)):
        if not Path(path).exists():
            print(f"error: {flag}: {path} does not exist", file=sys.stderr)
            return 2
    samples = [s for s in json.load(open(args.results))["samples"] if s["task"] == "niah_multikey_2"]
    if not samples or "prompt" not in samples[0]:
        print(f"error: --results: {args.results} has no niah_multikey_2 prompts (run the eval with --save-inputs)",
              file=sys.stderr)
        return 2
    tok = load_tokenizer("byte")
    model = longctx.load_pretrained(args.model).eval().to(torch.bfloat16)
    for placement in PLACEMENTS:
        hits = 0
        for i in range(0, len(samples), args.batch):
            chunk = samples[i:i + args.batch]
            prompts = [tok.encode(variant(s["prompt"], s["outputs"][0], placement), add_bos=True) for s in chunk]
            with torch.no_grad():
                outs = generate(model, prompts, 10, eos_id=tok.eos_id)
            hits += sum(s["outputs"][0] in tok.decode(o) for s, o in zip(chunk, outs))
        print(f"queried needle {placement:>12}: {hits}/{len(samples)} = {100 * hits / len(samples):.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
