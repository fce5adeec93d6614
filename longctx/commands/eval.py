"""`longctx eval`: RULER tasks, needle grids, passkey and perplexity vs length.

    longctx eval --model RUN_OR_HF_DIR --suite ruler --lengths 4k,8k,16k --samples 50 --out eval/
    torchrun --nproc-per-node 4 -m longctx eval --model DIR --suite niah --lengths 128k --cp 4 --out eval/
    longctx eval --config eval.yaml samples=5 style=compact       # like `longctx train`
    longctx eval --model DIR --lengths 32k 'model_overrides.rope_parameters={rope_type: yarn, factor: 4.0}'

Every finished (task, length) cell is kept in OUT/cells/; the same command rerun continues from
them, and SIGTERM / SIGUSR1 stop after the batch in flight (exit code 85). Cells of another
evaluation in OUT are refused unless --overwrite.

The options are EvalConfig's fields (longctx/eval/fields.py), read like the training config:
defaults < --config FILE < key=value overrides < flags (every field but the model_overrides
mapping is a flag too, e.g. model_overrides.max_position_embeddings=32768). The parser
needs only the fields; the evaluation (longctx/eval/command.py, torch) loads when it runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing

from longctx.eval.fields import EvalFields


def add_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument("--config", default=None, help="YAML file of EvalConfig fields (default: the built-in defaults)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. samples=5 lengths=4k,8k")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the cells in --out that another evaluation wrote (default: refuse; the same "
                        "evaluation rerun always continues from its finished cells)")
    hints = typing.get_type_hints(EvalFields)
    for f in dataclasses.fields(EvalFields):
        if typing.get_origin(hints[f.name]) is dict:
            continue  # a mapping is set as key=value (model_overrides.rope_parameters={...}), not a flag
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else ",".join(f.default_factory())
        help_text = f.metadata["help"] + (f" (default {default})" if default not in (None, False) else "")
        kind = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
        if kind[0] is bool:
            p.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            p.add_argument(flag, type=kind[0] if kind[0] in (int, float) else str, default=None, help=help_text)


def config_from_args(args: argparse.Namespace):
    """The EvalConfig of the command line: defaults < --config < key=value overrides < flags."""
    from longctx.config import load_structured  # the config layer (no torch): when the command runs
    from longctx.eval.config import EvalConfig

    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(EvalConfig)
             if getattr(args, f.name, None) is not None}
    return load_structured(EvalConfig, args.config, args.overrides, flags, prefix="eval.")


def run(args: argparse.Namespace) -> int:
    from longctx.runtime.launch_env import read_env

    cfg = config_from_args(args)
    cfg.validate(read_env().world_size)  # every bad field before torch, the model and the tasks load
    from longctx.eval import command

    return command.run(cfg, overwrite=bool(args.overwrite))
