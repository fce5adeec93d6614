"""`longctx recipes [NAME]`: list the bundled recipes, or print one.

Any `--config` takes `recipe:NAME`, e.g. `longctx train --config recipe:cpu/yarn-llama2-7b-128k`;
`longctx recipes NAME > my.yaml` copies one to edit.
"""
from __future__ import annotations

import argparse

from longctx import recipes


def add_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument("name", nargs="?", default=None, help="print this recipe's YAML (default: list them all)")


def run(args: argparse.Namespace) -> int:
    if args.name is not None:
        print(recipes.path_of(args.name).read_text(), end="")
        return 0
    width = max(len(n) for n in recipes.names())
    for name in recipes.names():
        print(f"{name:<{width}}  {recipes.summary(name)}")
    print(f"\nuse one as --config {recipes.PREFIX}NAME; files in {recipes.RECIPES_DIR}")
    return 0
