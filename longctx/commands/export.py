"""`longctx export --checkpoint DIR --out HF_DIR`."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from longctx.errors import UserError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a training checkpoint, run directory or HF directory")
    p.add_argument("--out", required=True, help="output Hugging Face directory")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="cast weights (default: keep)")


def run(args: argparse.Namespace) -> int:
    import json

    from longctx.model.hf import save_pretrained
    from longctx.model.loading import load_any, resolve_model_dir

    src, out = Path(args.checkpoint), Path(args.out)
    if out.resolve() == src.resolve():
        raise UserError(f"--out: {out} is the checkpoint itself; choose another directory")
    model_dir = resolve_model_dir(src)
    model = load_any(model_dir)
    recorded = json.loads((model_dir / "config.json").read_text()).get("longctx_tokenizer")
    tokenizer = recorded or (str(model_dir) if (model_dir / "tokenizer.json").is_file() else None)
    save_pretrained(model, out, dtype=_DTYPES[args.dtype] if args.dtype else None, tokenizer=tokenizer)
    print(f"exported {src} -> {out}")
    return 0
