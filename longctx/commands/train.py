"""`longctx train --config FILE [key=value ...] [--print-config] [--dry-run]`.

The config, the trainer and torch are imported when the command runs, so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import math
import sys

from longctx.base.errors import UserError


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML file (default: the built-in defaults)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. train.steps=100 parallel.cp_size=2")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="build everything on the meta device, print parameters and a memory estimate, exit")
    p.add_argument("--world-size", type=int, default=None,
                   help="with --dry-run/--print-config: validate for this many processes (default: the launcher's, "
                        "else the smallest world the config's cp sizes imply)")


def implied_world_size(stages) -> int:
    """The smallest world every resolved stage's cp size divides (dp = 1 for the largest)."""
    return math.lcm(*[stage.parallel.cp_size for stage in stages])


def run(args: argparse.Namespace) -> int:
    from longctx.config import (  # see the top
        load_config,
        missing_data_note,
        missing_weights_note,
        resolve_stages,
        to_yaml,
        validate_config,
    )
    from longctx.runtime.launch_env import read_env

    cfg = load_config(args.config, args.overrides)
    stages = resolve_stages(cfg)  # the one resolution: validate_config takes these
    if args.world_size is not None and args.world_size < 1:
        raise UserError(f"--world-size: must be >= 1, got {args.world_size}")
    inspect_only = args.print_config or args.dry_run
    world = args.world_size or read_env().world_size
    if inspect_only and args.world_size is None and read_env().world_size == 1:
        world = implied_world_size(stages)  # inspecting a cluster config on one machine
        if world > 1:
            print(f"note: checked for world size {world}, the smallest its cp sizes imply "
                  "(--world-size N for another)", file=sys.stderr)
    # every bad input, before the trainer is even imported; inspecting needs no weights
    plan = validate_config(cfg, world, weights=not inspect_only, stages=stages)
    notes = [missing_weights_note(cfg.model), missing_data_note(plan.stages)] if inspect_only else []
    for note in filter(None, notes):
        print(f"note: {note}", file=sys.stderr)
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    from longctx.train.dry_run import dry_run  # torch and the trainer: only for a config that passed
    from longctx.train.entry import train

    if args.dry_run:
        print(dry_run(cfg, world, args.config, plan=plan))
        return 0
    return train(cfg, plan)
