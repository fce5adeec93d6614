"""`longctx <command>`: train | eval | export | plan | demo.

Each command lives in its own module and registers its parser here. A UserError anywhere
becomes one `error: ...` line and exit code 2; other exceptions are bugs and keep tracebacks.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Optional

from longctx.errors import UserError

# command -> (module, register function, run function, help)
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "train": ("longctx.commands.train", "add_parser", "run", "train or continue pretraining (torchrun/SLURM/DeepSpeed)"),
    "eval": ("longctx.eval.cli", "add_eval_parser", "run_eval", "long-context evaluation (RULER, needle, passkey, ppl)"),
    "plan": ("longctx.commands.plan", "add_parser", "run", "per-GPU memory estimate and the smallest cp / ZeRO stage that fits"),
    "export": ("longctx.commands.export", "add_parser", "run", "export a checkpoint as a Hugging Face Llama directory"),
    "demo": ("longctx.commands.demo", "add_parser", "run", "run the built-in end-to-end default job"),
}


def optional_command(name: str, module: str, register: str, run: str, help_text: str) -> None:
    COMMANDS[name] = (module, register, run, help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longctx", description="Extend LLaMA-style models to long context.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, register, _run, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("longctx"):
                continue  # command not part of this build yet
            raise
        getattr(mod, register)(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module, _register, run, _help = COMMANDS[args.command]
    runner: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), run)
    try:
        return int(runner(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
