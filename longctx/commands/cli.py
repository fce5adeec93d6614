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
import sys
from typing import NoReturn, Optional

from longctx import __version__, recipes
from longctx.base.errors import UserError
from longctx.runtime import startup
from longctx.runtime.third_party_logs import quiet_other_ranks

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


class InvalidChoice(argparse.ArgumentError):
    """A value outside an argument's choices, with the value and the choices themselves."""

    def __init__(self, action: argparse.Action, value):
        super().__init__(action, f"invalid choice {value!r}")
        self.action, self.value = action, value


def _action_name(action: argparse.Action) -> str:
    """How an error names an argument: its flags, else its metavar, else its dest (as argparse does)."""
    if action.option_strings:
        return "/".join(action.option_strings)
    return str(action.metavar if action.metavar not in (None, argparse.SUPPRESS) else action.dest)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one `error: <argument>: <what is wrong; what is valid>` line and
    exit code 2 (argparse itself prints the whole usage first). Used by every longctx command line.

    The line is built from what argparse knows, not from its English text: an ArgumentError
    (exit_on_error=False lets it reach us) names the argument and says what is wrong; a value
    outside the choices is our InvalidChoice (the `_check_value` hook), with the choices to list
    and the closest to suggest; a missing required argument is one whose action was never taken
    (the `_get_values` hook records those that were); unrecognized arguments are the ones
    parse_known_args leaves over."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)
        self._taken: set[argparse.Action] = set()  # the actions the current parse has taken
        self._reading_option: Optional[str] = None  # the option string argparse is classifying

    def parse_known_args(self, args=None, namespace=None):
        self._taken, self._reading_option = set(), None
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as e:
            self._fail(self._argument_line(e) if e.argument_name is not None else self._parser_line(e.message))

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.unrecognized(extra)
        return parsed

    def unrecognized(self, extra: list[str]) -> NoReturn:
        """`<arguments>: unrecognized argument(s) for <prog>`: the arguments no option of this parser takes."""
        self._fail(f"{' '.join(extra)}: unrecognized argument(s) for {self.prog} ({self._see_help})")

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        """What argparse reports without an ArgumentError (a missing required argument, an
        ambiguous option), as one line."""
        self._fail(self._parser_line(message))

    # argparse's hooks: the actions taken, the choices checked, the option strings read
    def _get_values(self, action, arg_strings):
        self._taken.add(action)
        return super()._get_values(action, arg_strings)

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            raise InvalidChoice(action, value)

    def _parse_optional(self, arg_string):
        self._reading_option = arg_string  # left set when argparse fails on it (an ambiguous option)
        result = super()._parse_optional(arg_string)
        self._reading_option = None
        return result

    @property
    def _see_help(self) -> str:
        return f"see `{self.prog} --help`"

    def _argument_line(self, e: argparse.ArgumentError) -> str:
        if isinstance(e, InvalidChoice):
            choices = [str(c) for c in e.action.choices]
            close = difflib.get_close_matches(str(e.value), choices, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if e.action.nargs == argparse.PARSER:  # the command word
                return f"{self.prog}: unknown command {e.value!r}{hint} (valid: {', '.join(choices)})"
            return f"{e.argument_name}: invalid choice {e.value!r}{hint} (valid: {', '.join(choices)})"
        return f"{e.argument_name}: {' '.join(e.message.split())} ({self._see_help})"

    def _parser_line(self, message: str) -> str:
        missing = [a for a in self._actions if a.required and a not in self._taken]
        if self._reading_option is None and missing:
            if any(a.nargs == argparse.PARSER for a in missing):
                return f"{self.prog}: a command is required ({self._see_help})"
            return f"{', '.join(_action_name(a) for a in missing)}: required by {self.prog} ({self._see_help})"
        return f"{self.prog}: {' '.join(message.split())} ({self._see_help})"

    def _fail(self, line: str) -> NoReturn:
        print(f"error: {line}", file=sys.stderr)
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
    if argv is None:  # the process's entry point (not a call from Python): see longctx/runtime/startup.py
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
            args._command_parsers[args.command].unrecognized(extra)
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
