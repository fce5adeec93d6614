"""`longctx export`'s work: a training checkpoint, run directory or HF directory written as a
Hugging Face Llama directory with its tokenizer (the command line is longctx/commands/export.py)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import torch

from longctx import manifest
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.errors import UserError
from longctx.eval.model_io import tokenizer_spec_for, trained_model
from longctx.model.consolidate import DTYPES, load_consolidated, zero_masters
from longctx.model.hf import load_pretrained, read_hf_config, save_hf_weights
from longctx.model.loading import is_checkpoint, is_ds_only_checkpoint, resolve_model_dir


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def check_out_dir(src: Path, out: Path, overwrite: bool) -> None:
    """Everything about --out that can be wrong, before any model is read."""
    src_abs, out_abs = src.resolve(), out.resolve()
    if _inside(out_abs, src_abs) or _inside(src_abs, out_abs):
        raise UserError(f"--out: {out} overlaps the checkpoint {src}; choose a directory outside it")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    if out.is_dir() and not overwrite:
        entries = sorted(p.name for p in out.iterdir())
        if entries:
            raise UserError(f"--out: {out} is not empty ({len(entries)} entries, e.g. {entries[0]!r}); choose a new "
                            "directory, or pass --overwrite to replace only the export's files and keep the rest")


def _fp32_masters(checkpoint: Path):
    """The ZeRO fp32 master weights (verified) of the checkpoint whose model/ is exported, or None."""
    if not is_checkpoint(checkpoint):
        return None
    problem = manifest.verify(checkpoint, under="ds")
    if problem:
        raise UserError(f"{checkpoint}: {problem}; use another checkpoint")
    masters = zero_masters(checkpoint)
    if masters is not None:
        print(f"exporting the fp32 master weights of {checkpoint / 'ds'}")
    return masters


def _tokenizer_spec(model_dir: Path) -> Optional[str]:
    """The tokenizer an HF directory carries (its recorded "byte" or its own files), or None."""
    try:
        return tokenizer_spec_for(model_dir, None)
    except UserError:
        return None  # a model directory without a tokenizer: the export has none either


def run(args: argparse.Namespace) -> int:
    src, out = Path(args.checkpoint), Path(args.out)
    check_out_dir(src, out, args.overwrite)
    model_dir = resolve_model_dir(src)  # a checkpoint must be COMPLETE and match its manifest
    dtype = DTYPES[args.dtype] if args.dtype else None
    if is_ds_only_checkpoint(model_dir):
        trained = trained_model(model_dir)
        tokenizer = TokenizerFiles(trained.tokenizer) if trained.tokenizer else None
        print(f"consolidating the ZeRO shards of {model_dir / 'ds'} (the checkpoint has no model/ export)")
        weights = load_consolidated(model_dir, trained.config).state_dict()
        config, dtype = trained.config, dtype or trained.dtype
    else:
        spec = _tokenizer_spec(model_dir)
        tokenizer = TokenizerFiles(spec) if spec else None
        weights = _fp32_masters(model_dir.parent) if dtype == torch.float32 else None
        if weights is None:
            weights = load_pretrained(model_dir).state_dict()
        config = read_hf_config(model_dir)
    try:
        save_hf_weights(weights, config, out, dtype=dtype, tokenizer=tokenizer)
    except OSError as e:
        raise UserError(f"--out: cannot write {e.filename or out} ({e.strerror})") from None
    print(f"exported {model_dir} -> {out}")
    return 0
