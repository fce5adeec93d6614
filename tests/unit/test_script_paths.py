"""Every `scripts/...` path the checkout writes down (docs, results pages, README, tests, recipes,
launch/slurm/benchmarks and the scripts' own usage lines) names a file or folder that exists, so
moving a script cannot leave a documented command pointing at nothing."""
import re

from helpers.recipes import ROOT

SCANNED = ["README.md", "run.sh", "pyproject.toml", ".ci", "docs", "tests", "scripts", "configs", "launch", "slurm",
           "benchmarks", "longctx"]
SUFFIXES = {".md", ".py", ".sh", ".sbatch", ".yaml", ".yml", ".json", ".toml", ""}
# a path starting at scripts/ (not inside another path, such as RULER/scripts/...)
SCRIPT_PATH = re.compile(r"(?<![\w/.-])scripts/[\w./-]*")
# NVIDIA/RULER's own scripts/ folders, quoted where longctx follows RULER (docs/eval.md, the RULER tests)
RULER_FOLDERS = ("scripts/eval/", "scripts/data/")


def mentioned_paths() -> dict[str, list[str]]:
    """path -> the files (relative to the checkout) that mention it."""
    found: dict[str, list[str]] = {}
    files = []
    for name in SCANNED:
        top = ROOT / name
        files += [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
    for path in files:
        if path.suffix not in SUFFIXES or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for match in SCRIPT_PATH.findall(text):
            mention = match.rstrip(".")
            if not mention.startswith(RULER_FOLDERS):
                found.setdefault(mention, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_mentioned_script_path_exists():
    found = mentioned_paths()
    assert "scripts/bootstrap.sh" in found  # the scan reads the files that name scripts
    missing = {path: sorted(set(where)) for path, where in found.items() if not (ROOT / path).exists()}
    assert not missing, missing
