"""The command line's own surface: --version, recipes by name, and help and config checks that load no torch."""
import os
import subprocess
import sys

import pytest

from longctx import __version__, recipes
from longctx.base.errors import UserError
from longctx.commands.cli import COMMANDS, main

HELP_PROBE = """
import contextlib, io, sys
from longctx.commands.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    rc = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "deepspeed", "transformers", "numpy") if m in sys.modules)
print(rc, len(out.getvalue()) > 0, ",".join(heavy) or "-")
"""


@pytest.mark.parametrize("argv", [["--help"], ["--version"]] + [[c, "--help"] for c in COMMANDS])
def test_help_and_version_load_no_heavy_module(argv):
    """What makes `--help` fast (a second or more per heavy import on a small machine)."""
    res = subprocess.run([sys.executable, "-c", HELP_PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["0", "True", "-"], res.stdout + res.stderr[-2000:]


CHECK_PROBE = """
import contextlib, io, sys
from longctx.commands.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
    rc = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "deepspeed", "transformers") if m in sys.modules)
print(rc, ",".join(heavy) or "-", err.getvalue().splitlines()[0] if err.getvalue() else "")
"""


@pytest.mark.parametrize("argv, rc, first_line", [
    (["train", "model.preset=nope"], 2, "error: model.preset: unknown 'nope'"),
    (["train", "--config", "recipe:cpu/llama3-8b-128k", "--print-config"], 0, ""),
    (["plan", "parallel.zero_stage=5"], 2, "error: parallel.zero_stage"),
    (["plan", "--config", "recipe:yarn-llama2-7b-128k", "--gpus", "8", "--gpu-mem", "80GB"], 0, ""),
    (["eval", "--model", "m", "--samples", "0"], 2, "error: eval.samples: must be >= 1"),
])
def test_config_checks_and_planning_load_no_torch(argv, rc, first_line):
    """A bad field is reported before torch loads (seconds on a small machine); planning needs no torch."""
    res = subprocess.run([sys.executable, "-c", CHECK_PROBE, *argv], capture_output=True, text=True, timeout=120)
    code, heavy, line = (res.stdout.rstrip("\n").split(" ", 2) + [""])[:3]
    assert (int(code), heavy) == (rc, "-") and line.startswith(first_line), res.stdout + res.stderr[-2000:]


def test_version(capsys):
    assert main(["--version"]) == 0 and capsys.readouterr().out == f"longctx {__version__}\n"


def test_recipes_lists_every_bundled_file_and_prints_one(capsys):
    assert main(["recipes"]) == 0
    listing = capsys.readouterr().out
    assert {"cpu/yarn-llama2-7b-128k", "yarn-llama2-7b-128k", "eval/ruler-128k"} <= set(recipes.names())
    assert all(f"{name} " in listing for name in recipes.names())
    assert main(["recipes", "cpu/yarn-llama2-7b-128k"]) == 0
    assert capsys.readouterr().out == (recipes.RECIPES_DIR / "cpu/yarn-llama2-7b-128k.yaml").read_text()


def test_a_recipe_name_resolves_and_a_wrong_one_is_one_line(capsys):
    assert recipes.resolve("recipe:cpu/yarn-llama2-7b-128k") == str(
        recipes.RECIPES_DIR / "cpu/yarn-llama2-7b-128k.yaml")
    assert recipes.resolve("my/own.yaml") == "my/own.yaml" and recipes.resolve(None) is None
    with pytest.raises(UserError, match=r"^--config: no recipe 'cpu/yarn-llama2-7b-128'; did you mean "
                                        r"'cpu/yarn-llama2-7b-128k'\? valid: "):
        recipes.resolve("recipe:cpu/yarn-llama2-7b-128")
    assert main(["train", "--config", "recipe:nope", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --config: no recipe 'nope'") and err.count("\n") == 1


def test_a_recipe_by_name_is_the_same_config_as_its_path(capsys):
    assert main(["train", "--config", "recipe:cpu/llama3-8b-128k", "--print-config"]) == 0
    by_name = capsys.readouterr().out
    assert main(["train", "--config", str(recipes.RECIPES_DIR / "cpu/llama3-8b-128k.yaml"), "--print-config"]) == 0
    assert capsys.readouterr().out == by_name


def test_export_offers_the_dtypes_it_maps():
    from longctx.checkpoint.model import DTYPES
    from longctx.commands.export import DTYPE_NAMES

    assert DTYPE_NAMES == tuple(sorted(DTYPES))


def test_a_reader_that_stops_early_gets_no_traceback(monkeypatch):
    """`longctx recipes | head -1`: stdout is a pipe whose reader has gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", buffering=1) as closed_pipe:
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        assert main(["recipes"]) == 141  # what a shell reports for a command stopped by SIGPIPE
