"""Another transformers version beside the venv's own, for the export compatibility check
(helpers/export_compat.py runs a second interpreter with it first on PYTHONPATH): by default the
oldest that pyproject.toml's test extra allows. `./run.sh test` installs that one before the suite:

    .venv/bin/python tests/helpers/transformers_overlay.py          # prints its directory
    .venv/bin/python tests/helpers/transformers_overlay.py 4.56.0   # another version's

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
    """X of the test extra's "transformers>=X" (or "transformers[extras]>=X") in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*?)\]$", text, re.M | re.S)  # the list may span lines
    found = re.search(r'"transformers(?:\[[^]]*\])?>=([0-9][0-9.]*)"', test_extra.group(1) if test_extra else "")
    if not found:
        raise RuntimeError("pyproject.toml: the test extra names no 'transformers>=X' floor")
    return found.group(1)


def full_version(version: str) -> str:
    """"4.56" -> "4.56.0", as transformers spells its own version."""
    parts = version.split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def transformers_overlay(version: Optional[str] = None) -> Path:
    """sys.prefix/transformers-VERSION (inside the venv, so a fresh clone builds it once; default:
    the test extra's floor): a pip --target directory with transformers==VERSION and those of its
    pinned dependencies whose versions in this venv it does not accept (huggingface-hub,
    tokenizers); everything else (torch, safetensors, numpy, ...) the second interpreter takes
    from the venv."""
    version = version or transformers_floor()
    target = Path(sys.prefix) / f"transformers-{version}"
    if (target / ".complete").is_file():
        return target
    print(f"[longctx] installing transformers=={version} into {target} (for the export compatibility test)",
          file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _pip_target(tmp, [f"transformers=={version}"])
        _pip_target(tmp, _unsatisfied_requirements(tmp, "transformers"))
        (tmp / ".complete").write_text(version + "\n")
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
        raise RuntimeError(f"installing {' '.join(requirements)} for the export compatibility check failed "
                           f"(pip needs the package index, as scripts/bootstrap.sh does):\n{run.stderr[-2000:]}")


# extras whose package transformers imports by itself whenever it is installed: a venv's newer
# `kernels` breaks 5.0's import of every model ("Either a revision or a version must be specified")
_IMPORTED_WHEN_PRESENT = ("hub-kernels",)


def _unsatisfied_requirements(target: Path, package: str) -> list[str]:
    """`package`'s requirements (its dist-info in target) that this venv's versions miss: the
    unconditional ones, and those of _IMPORTED_WHEN_PRESENT extras whose package the venv has."""
    from packaging.requirements import Requirement

    dist = next(metadata.distributions(path=[str(target)], name=package))
    missing: dict[str, str] = {}
    for line in dist.requires or []:
        req = Requirement(line)
        core = req.marker is None
        if not core and not any(req.marker.evaluate({"extra": extra}) for extra in _IMPORTED_WHEN_PRESENT):
            continue  # other extras and platform-specific requirements
        installed: Optional[str]
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is None and not core:
            continue  # an optional package this venv does not have: nothing to shadow
        if installed is None or not req.specifier.contains(installed, prereleases=True):
            missing.setdefault(req.name, f"{req.name}{req.specifier}")
    return list(missing.values())


if __name__ == "__main__":
    try:
        print(transformers_overlay(sys.argv[1] if len(sys.argv) > 1 else None))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
