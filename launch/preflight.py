#!/usr/bin/env python3
"""Checks a training command before any process group exists (used by launch/torchrun.sh and
slurm/train.sbatch), so a job that cannot run stops with one `error:` line and exit code 2
instead of hanging in a rendezvous or failing on one rank of many.

    python launch/preflight.py --world-size 16 [--gpu-mem 80GB] -- [train] --config configs/x.yaml [key=value ...]
    python launch/preflight.py --world-size 2 -- eval --model DIR [eval options]

Checks, in order:
  1. the config loads (file exists, keys and types are valid);
  2. a recipe's `# cluster: nodes=N gpus_per_node=G` line: fewer GPUs than it was written for
     is an error (its global batch and cp layout would silently change), unless
     LONGCTX_ALLOW_FEWER_GPUS=1; more is fine;
  3. every stage's cp fits in the world size, then the trainer's own validation for this world
     size (cp divides it, lengths divide 2*cp, out_dir writable, data paths, init_from, ...),
     and a parallel.deepspeed_config JSON agrees with parallel.zero_stage;
  4. with --gpu-mem (or on a GPU node): the memory planner's peak per GPU, a warning if a stage
     does not fit.
With `--command eval` it checks `longctx eval` options instead (every option, --cp against the
world size, the model directory and its tokenizer; no weights are read) and prints the absolute --out.
On success it prints the absolute out_dir (the SLURM script reads the PREEMPTED marker there);
with --startup-limit, a second line: the command's start-up limit in whole seconds
(parallel.startup_timeout_s, or an eval's startup_timeout_s), which launch/torchrun.sh gives
the rendezvous as its join timeout.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def global_batch(cfg, world: int, stage) -> int:
    cp = stage.parallel.cp_size
    return (world // cp) * cfg.data.micro_batch_size * cfg.train.grad_accum


def _keep_batch(cfg, stage, world: int, rows: int) -> str:
    """The train.grad_accum that keeps a global batch of `rows` at this job's data-parallel size."""
    rows_per_accum = global_batch(cfg, world, stage) // cfg.train.grad_accum  # rows per accumulation step
    if rows_per_accum and rows % rows_per_accum == 0:
        return f"train.grad_accum={rows // rows_per_accum} keeps the global batch of {rows} rows"
    return "raise train.grad_accum to keep the global batch"


def check(world: int, config: str | None, overrides: list[str], gpu_mem: str | None, weights: bool = True) -> str:
    return check_train(world, config, overrides, gpu_mem, weights)[0]


def check_train(world: int, config: str | None, overrides: list[str], gpu_mem: str | None,
                weights: bool = True) -> tuple[str, float]:
    """`check`, and the run's start-up limit (parallel.startup_timeout_s)."""
    from longctx.base.errors import UserError
    from longctx.config import load_config, resolve_stages, validate_config
    from longctx.plan.target import cluster_line

    cfg = load_config(config, overrides)
    stages = resolve_stages(cfg)
    shape = cluster_line(config)
    if shape:
        try:
            wanted = int(shape.get("nodes", 1)) * int(shape["gpus_per_node"])
        except (KeyError, ValueError):
            raise UserError(f"{config}: cannot read its '# cluster:' line {shape} "
                            "(expected e.g. '# cluster: nodes=8 gpus_per_node=8')") from None
        if world < wanted and os.environ.get("LONGCTX_ALLOW_FEWER_GPUS") != "1":
            recipe = load_config(config, [])  # the recipe's own batch, not the one the overrides make
            theirs = global_batch(recipe, wanted, resolve_stages(recipe)[0])
            raise UserError(
                f"{config} is written for {wanted} GPUs (nodes={shape.get('nodes', 1)} x gpus_per_node="
                f"{shape['gpus_per_node']}, global batch {theirs} rows) but this job has {world}; submit with "
                f"--nodes={shape.get('nodes', 1)} --gpus-per-node={shape['gpus_per_node']}, or set "
                f"LONGCTX_ALLOW_FEWER_GPUS=1 to run it smaller ({_keep_batch(cfg, stages[0], world, theirs)})")
    for stage in stages:
        cp = stage.parallel.cp_size
        if cp > world:
            where = stage.field_names["cp_size"]
            raise UserError(f"{where}: {cp} needs at least {cp} GPUs (one sequence is split over {cp}), "
                            f"this job has {world}")
    validate_config(cfg, world, weights=weights)  # also a parallel.deepspeed_config JSON against parallel.zero_stage
    _memory_warning(cfg, stages, world, gpu_mem)
    return str(Path(cfg.out_dir).absolute()), float(cfg.parallel.startup_timeout_s)


def _memory_warning(cfg, stages, world: int, gpu_mem: str | None) -> None:
    from longctx.config import stage_model_config
    from longctx.plan import estimate_memory, parse_size

    if gpu_mem is None:
        try:
            import torch

            if not torch.cuda.is_available():
                return
            device_bytes = float(torch.cuda.get_device_properties(0).total_memory)
        except Exception:  # noqa: BLE001 - a warning only
            return
    else:
        device_bytes = parse_size(gpu_mem)
    for i, stage in enumerate(stages):
        est = estimate_memory(cfg, stage, stage_model_config(stage), world)
        if not est.fits(device_bytes):
            print(f"warning: stage {i} ({stage.name}) is estimated at {est.peak_gb:.1f} GiB per GPU, "
                  f"more than {device_bytes / 2**30:.0f} GiB; see `longctx plan` for a layout that fits",
                  file=sys.stderr)


def check_eval(world: int, argv: list[str]) -> str:
    """`longctx eval` options for `world` processes, before any starts: every option, the model
    directory and its tokenizer (the weights are not read). Returns the absolute --out ("" for
    out=null, an eval that writes nothing)."""
    return check_eval_limit(world, argv)[0]


def check_eval_limit(world: int, argv: list[str]) -> tuple[str, float]:
    """`check_eval`, and the evaluation's start-up limit."""
    from longctx import recipes
    from longctx.commands import eval as eval_command
    from longctx.commands.cli import OneLineParser
    from longctx.eval import command as eval_run

    parser = OneLineParser(prog="longctx eval")
    eval_command.add_parser(parser)
    args = parser.parse_args(argv)
    args.config = recipes.resolve(args.config)
    cfg = eval_command.config_from_args(args)
    eval_run.check(cfg, world)
    return (str(Path(cfg.out).absolute()) if cfg.out else ""), float(cfg.startup_timeout_s)


def _train_args(rest: list[str]) -> tuple[str | None, list[str], int | None]:
    """(--config, overrides, --world-size) of a train command line; other train flags change
    nothing checked but whether the weights must exist (see `inspects_only`)."""
    config, overrides, world, i = None, [], None, 0
    while i < len(rest):
        if rest[i] in ("--config", "--world-size") and i + 1 < len(rest):
            if rest[i] == "--config":
                config = rest[i + 1]
            elif rest[i + 1].isdigit():
                world = int(rest[i + 1])
            i += 2
        elif rest[i].startswith("--config="):
            config, i = rest[i].split("=", 1)[1], i + 1
        elif rest[i].startswith("-"):
            i += 1  # other train flags (--dry-run, ...) do not change what is checked
        else:
            overrides.append(rest[i])
            i += 1
    return config, overrides, world


def inspects_only(rest: list[str]) -> bool:
    """A dry run or --print-config reads no weights (the trainer accepts a missing init_from then)."""
    return any(a in ("--dry-run", "--print-config") for a in rest)


def main(argv: list[str] | None = None) -> int:
    from longctx import recipes
    from longctx.base.errors import UserError
    from longctx.commands.cli import OneLineParser

    ap = OneLineParser(prog="launch/preflight.py", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--gpu-mem", default=None, help="e.g. 80GB: warn when a stage will not fit")
    ap.add_argument("--command", choices=("train", "eval"), default="train",
                    help="the longctx command whose arguments follow (default train)")
    ap.add_argument("--startup-limit", action="store_true",
                    help="print the command's start-up limit in seconds on a second line")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- [--config FILE] [key=value ...]")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) or a one-line argparse error (2)
        return e.code if isinstance(e.code, int) else 2
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if rest[:1] in (["train"], ["eval"]):  # `-- train ...` as the docs write it: the command word
        args.command, rest = rest[0], rest[1:]
    try:
        if args.world_size < 1:
            raise UserError(f"--world-size: must be >= 1, got {args.world_size}")
        if args.command == "eval":
            out, startup_s = check_eval_limit(args.world_size, rest)
        else:
            config, overrides, dry_run_world = _train_args(rest)
            inspecting = inspects_only(rest)
            world = dry_run_world if inspecting and dry_run_world else args.world_size  # the world it validates for
            out, startup_s = check_train(world, recipes.resolve(config), overrides, args.gpu_mem,
                                         weights=not inspecting)
        print(out)
        if args.startup_limit:
            print(math.ceil(startup_s))  # whole seconds: torchrun's rendezvous settings are integers
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # eval's own argparse error, already printed as one line
        return e.code if isinstance(e.code, int) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
