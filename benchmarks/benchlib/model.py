"""The model a benchmark trains: a preset's shape with random weights, or (`--init-from DIR`) the
shape of a Hugging Face Llama directory, with its weights or (`--random-weights`) random ones of
that shape. Every contender then loads the one HF checkpoint this module writes, so ours,
transformers and ALST train the same weights at the same shape.

The written checkpoint keeps the source's config except `max_position_embeddings`, raised to
the longest length the run asks for (plain RoPE does not depend on it; the models refuse
positions past it), and `--layers`, which keeps the first N blocks.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from longctx.base.errors import UserError
from longctx.model import build_model, get_preset
from longctx.model.config import ModelConfig
from longctx.model.hf import _weight_files as weight_files
from longctx.model.hf import load_pretrained, read_hf_config, save_hf_weights, save_pretrained


def add_model_args(p: argparse.ArgumentParser, preset: str = "bench-44m") -> None:
    p.add_argument("--preset", default=preset, help="model preset (longctx.model.PRESETS); ignored with --init-from")
    p.add_argument("--layers", type=int, default=0, help="keep this many layers (0: all)")
    p.add_argument("--init-from", metavar="DIR",
                   help="a Hugging Face Llama directory: its shape and weights "
                        "(e.g. /work/models/smollm2-135m-instruct)")
    p.add_argument("--random-weights", action="store_true",
                   help="with --init-from: the directory's shape, random weights (seed 0)")


def check_model_args(args) -> None:
    """One `error:` line and exit 2 for a bad --init-from / --layers, before any work."""
    try:
        cfg = base_config(args)
    except UserError as e:
        sys.exit(_error(f"--init-from: {e}"))
    if args.layers < 0 or args.layers > cfg.num_hidden_layers:
        sys.exit(_error(f"--layers: {args.layers} is not in 0..{cfg.num_hidden_layers} (the model's layers)"))
    if args.random_weights and not args.init_from:
        sys.exit(_error("--random-weights: only with --init-from DIR (a preset's weights are random already)"))
    if args.init_from and not args.random_weights:
        try:
            weight_files(Path(args.init_from))
        except UserError as e:
            sys.exit(_error(f"--init-from: {e} (or add --random-weights for its shape alone)"))


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def base_config(args) -> ModelConfig:
    return read_hf_config(args.init_from) if args.init_from else get_preset(args.preset)


def model_config(args, max_len: int) -> ModelConfig:
    """The benchmarked shape: the source's, with --layers and room for max_len positions."""
    cfg = base_config(args)
    changes = {"max_position_embeddings": max(cfg.max_position_embeddings, max_len, 4096)}
    if args.layers:
        changes["num_hidden_layers"] = args.layers
    return cfg.replace(**changes)


def model_source(args) -> str:
    """What the rows were measured on, for the JSON output."""
    if not args.init_from:
        return f"preset:{args.preset}"
    return f"{'shape' if args.random_weights else 'weights'}:{args.init_from}"


def write_checkpoint(args, path: str, max_len: int) -> ModelConfig:
    """The benchmark's HF checkpoint (fp32) at `path`; returns its config."""
    cfg = model_config(args, max_len)
    if not args.init_from or args.random_weights:
        save_pretrained(build_model(cfg, seed=0), path, dtype=torch.float32)
        return cfg
    state = load_pretrained(args.init_from, dtype=torch.float32).state_dict()
    keep = {k: v for k, v in state.items() if _layer(k) is None or _layer(k) < cfg.num_hidden_layers}
    save_hf_weights(keep, cfg, path, dtype=torch.float32)
    return cfg


def _layer(key: str):
    m = re.match(r"layers\.(\d+)\.", key)
    return int(m.group(1)) if m else None
