"""The bundled recipes: the published long-context recipes (full size), their CPU-sized
versions (cpu/) and evaluation configs (eval/), shipped inside the package.

Any `--config` takes `recipe:NAME` (e.g. `recipe:cpu/yarn-llama2-7b-128k`) from any directory;
`longctx recipes` lists the names and `longctx recipes NAME` prints one to copy and edit. In a
clone the same files are also at configs/ (a link to this directory).
"""
from __future__ import annotations

import difflib
from pathlib import Path

from longctx.base.errors import UserError

PREFIX = "recipe:"
RECIPES_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Every bundled recipe, as its path under this directory without `.yaml`."""
    return sorted(p.relative_to(RECIPES_DIR).with_suffix("").as_posix() for p in RECIPES_DIR.rglob("*.yaml"))


def summary(name: str) -> str:
    """The recipe's first comment line (what it is)."""
    for line in path_of(name).read_text().splitlines():
        if line.startswith("#") and line.strip("# "):
            return line.lstrip("# ").strip()
    return ""


def path_of(name: str) -> Path:
    name = name.removesuffix(".yaml")
    path = RECIPES_DIR / f"{name}.yaml"
    if name not in names():
        close = difflib.get_close_matches(name, names(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"--config: no recipe {name!r}; {hint}valid: {', '.join(names())} "
                        "(`longctx recipes` lists them)")
    return path


def resolve(config: str | None) -> str | None:
    """A `--config` value as a file path: `recipe:NAME` becomes the bundled file, anything else stays."""
    if config is None or not config.startswith(PREFIX):
        return config
    return str(path_of(config[len(PREFIX):]))
