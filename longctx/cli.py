"""`longctx <command>`: train | eval | plan | export | demo | recipes | setup.

Each command lives in its own module (`add_parser(parser)`, `run(args) -> exit code`); only the
module of the command given is imported, so `longctx --help` and `--version` load no torch. A
`--config recipe:NAME` becomes the bundled recipe's path here, for every command. A UserError
anywhere becomes one `error: ...` line and exit code 2; other exceptions are bugs and keep tracebacks.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from typing import NoReturn, Optional

from longctx import __version__, recipes, startup
from longctx.errors import UserError
from longctx.third_party_logs import quiet_other_ranks

# command -> help; its module is longctx.commands.<command>
COMMANDS = {
    "train": "train or continue pretraining (torchrun/SLURM/DeepSpeed)",
    "eval": "long-context evaluation (RULER, needle, passkey, ppl)",
    "plan": "per-GPU memory estimate and the smallest cp / ZeRO stage that fits",
    "export": "export a checkpoint as a Hugging Face Llama directory",
    "demo": "run the built-in end-to-end default job",
    "recipes": "list the bundled recipes (use one as --config recipe:NAME), or print one",
    "setup": "prepare this environment once: build DeepSpeed's JIT op, report what is installed",
}


_INVALID_CHOICE = re.compile(r"^argument (?P<arg>[^:]+): invalid choice: '(?P<value>.*)' "
                             r"\(choose from (?P<choices>.*)\)$")
_ARGUMENT = re.compile(r"^argument (?P<arg>[^:]+): (?P<rest>.*)$")
_REQUIRED = re.compile(r"^the following arguments are required: (?P<args>.*)$")
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (?P<args>.*)$")


def _split_choices(text: str) -> list[str]:
    return [c.strip().strip("'\"") for c in text.split(",") if c.strip()]


def one_line_error(prog: str, message: str) -> str:
    """argparse's message as `<argument>: <what is wrong; what is valid>` (one line)."""
    message = " ".join(message.split())
    m = _INVALID_CHOICE.match(message)
    if m:
        arg, value, choices = m["arg"], m["value"], _split_choices(m["choices"])
        close = difflib.get_close_matches(value, choices, n=1)
        what = "unknown command" if arg in ("command", "COMMAND") else "invalid choice"
        name = prog if what == "unknown command" else arg
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{name}: {what} {value!r}{hint} (valid: {', '.join(choices)})"
    m = _ARGUMENT.match(message)
    if m:
        return f"{m['arg']}: {m['rest']} (see `{prog} --help`)"
    m = _REQUIRED.match(message)
    if m and m["args"] in ("command", "COMMAND"):
        return f"{prog}: a command is required (see `{prog} --help`)"
    if m:
        return f"{m['args']}: required by {prog} (see `{prog} --help`)"
    m = _UNRECOGNIZED.match(message)
    if m:
        return f"{m['args']}: unrecognized argument(s) for {prog} (see `{prog} --help`)"
    return f"{prog}: {message} (see `{prog} --help`)"


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one `error: <argument>: <message>` line and exit code 2
    (argparse itself prints the whole usage first). Used by every longctx command line."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        print(f"error: {one_line_error(self.prog, message)}", file=sys.stderr)
        self.exit(2)


def command_module(name: str):
    return importlib.import_module(f"longctx.commands.{name}")


def chosen_command(argv: list[str]) -> Optional[str]:
    """The command named on the command line: its first argument that is not an option."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser, with the options of `command` (None: every command's)."""
    parser = OneLineParser(prog="longctx", description="Extend LLaMA-style models to long context.")
    parser.add_argument("--version", action="version", version=f"longctx {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name, help_text in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if command in (None, name):
            command_module(name).add_parser(command_parser)
    parser.set_defaults(_command_parsers=sub.choices)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    if argv is None:  # the process's entry point (not a call from Python): see longctx/startup.py
        startup.begin(sys.argv[1:])
        try:
            return _main(None)
        finally:
            startup.end()
    return _main(argv)


def _main(argv: Optional[list[str]]) -> int:
    quiet_other_ranks()  # third-party warnings on rank 0 only: before a command module imports torch or DeepSpeed
    argv = sys.argv[1:] if argv is None else argv
    command = chosen_command(argv)
    parser = build_parser(command) if command else build_parser(command="")  # no command: list them only
    try:
        args, extra = parser.parse_known_args(argv)
        if hasattr(args, "overrides"):  # key=value after a flag (`train --dry-run a.b=1`) is an override too
            args.overrides += [e for e in extra if not e.startswith("-")]
            extra = [e for e in extra if e.startswith("-")]
        if extra:  # name the command whose flags these are not
            args._command_parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help (0) or a one-line argparse error (2)
        return e.code if isinstance(e.code, int) else 2
    try:
        if getattr(args, "config", None) is not None:
            args.config = recipes.resolve(args.config)
        return int(command_module(args.command).run(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped early (`longctx recipes | head`): stop quietly, as on SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141


if __name__ == "__main__":
    sys.exit(main())
