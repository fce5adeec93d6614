"""`longctx export --checkpoint DIR --out HF_DIR [--dtype D] [--overwrite]`.

With --adapter, an adapter run's PEFT adapter directory (adapter_config.json,
adapter_model.safetensors, and config.json: the architecture and RoPE the base loads with);
without it, an adapter run exports as the merged model (each LoRA update folded in).

DIR: an HF directory, a training checkpoint (its model/, or without one its ZeRO shards
consolidated in this process with the model config the checkpoint records) or a run directory.
The tokenizer travels with the weights (data/hf_tokenizer.py), so transformers' AutoTokenizer
loads the export.

The export is built in a temporary sibling of --out and moved into place; with --overwrite
the whole directory is swapped in one step (a reader sees the old export or the new one),
the files an export writes (config.json, weights, tokenizer files) replaced and every other
file kept. An existing, non-empty --out is refused without --overwrite. One export at a time
writes an --out (a lock beside it, `.OUT.lock`); a second one exits 2 naming the first.
Temporaries a killed export left beside --out are removed by the next one, with a notice.
The work is longctx/checkpoint/export.py (torch), loaded when the command runs.
"""
from __future__ import annotations

import argparse

DTYPE_NAMES = ("bfloat16", "float16", "float32")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a training checkpoint, run directory or HF directory")
    p.add_argument("--out", required=True, help="output Hugging Face directory (new or empty)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None,
                   help="cast weights (default: keep; a checkpoint without model/: its training dtype); float32 "
                        "from a ZeRO checkpoint exports its fp32 master weights")
    p.add_argument("--adapter", action="store_true",
                   help="an adapter run (train.adapter): write its PEFT adapter directory instead of the merged model")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out: replace the export's own files, keep the rest (one atomic swap)")


def run(args: argparse.Namespace) -> int:
    from longctx.checkpoint import export  # torch and the model: loaded when the command runs, not for --help

    return export.run(args)
