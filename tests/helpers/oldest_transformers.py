"""The oldest transformers that pyproject.toml's test extra allows, installed beside the venv's
own for the export compatibility check (helpers/export_compat.py runs a second interpreter with
it first on PYTHONPATH). `./run.sh test` installs it before the suite:

    .venv/bin/python tests/helpers/oldest_transformers.py     # prints its directory

Standard library and `packaging` only (no torch), so the install step stays cheap."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]


def transformers_floor() -> str:
    """X of the test extra's "transformers>=X" in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*)\]$", text, re.M)
    found = re.search(r'"transformers>=([0-9][0-9.]*)"', test_extra.group(1) if test_extra else "")
    if not found:
        raise RuntimeError("pyproject.toml: the test extra names no 'transformers>=X' floor")
    return found.group(1)


def full_version(version: str) -> str:
    """"4.56" -> "4.56.0", as transformers spells its own version."""
    parts = version.split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def oldest_transformers() -> Path:
    """sys.prefix/transformers-FLOOR (inside the venv, so a fresh clone builds it once): a pip
    --target directory with transformers==FLOOR and those of its pinned dependencies whose
    versions in this venv it does not accept (huggingface-hub, tokenizers); everything else
    (torch, safetensors, numpy, ...) the second interpreter takes from the venv."""
    floor = transformers_floor()
    target = Path(sys.prefix) / f"transformers-{floor}"
    if (target / ".complete").is_file():
        return target
    print(f"[longctx] installing transformers=={floor} into {target} (the export compatibility test's oldest "
          "transformers)", file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _pip_target(tmp, [f"transformers=={floor}"])
        _pip_target(tmp, _unsatisfied_requirements(tmp, "transformers"))
        (tmp / ".complete").write_text(floor + "\n")
        try:
            tmp.rename(target)
        except OSError:  # another run installed it meanwhile
            if not (target / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _pip_target(target: Path, requirements: list[str]) -> None:
    if not requirements:
        return
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--no-compile", "--target", str(target), *requirements]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"installing {' '.join(requirements)} for the oldest-transformers check failed "
                           f"(pip needs the package index, as scripts/bootstrap.sh does):\n{run.stderr[-2000:]}")


def _unsatisfied_requirements(target: Path, package: str) -> list[str]:
    """`package`'s unconditional requirements (its dist-info in target) that this venv's versions miss."""
    from packaging.requirements import Requirement

    dist = next(metadata.distributions(path=[str(target)], name=package))
    missing = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None:
            continue  # extras and platform-specific requirements
        installed: Optional[str]
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is None or not req.specifier.contains(installed, prereleases=True):
            missing.append(str(req))
    return missing


if __name__ == "__main__":
    try:
        print(oldest_transformers())
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
