"""The published recipes in configs/ (and their CPU versions in configs/cpu/), the preset that
names each one's architecture, and the cluster shape each states in its `# cluster:` line."""
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
CPU_RECIPES = sorted(p.name for p in (ROOT / "configs" / "cpu").glob("*.yaml"))
PRESET_OF = {"yarn-llama2-7b-128k.yaml": "llama2-7b", "llama3-8b-128k.yaml": "llama3-8b",
             "prolong-llama3-8b-64k.yaml": "llama3-8b", "smollm2-135m-32k.yaml": "smollm2-135m",
             "qwen2.5-7b-128k.yaml": "qwen2.5-7b", "qwen3-8b-128k.yaml": "qwen3-8b",
             "qwen3-30b-a3b-128k.yaml": "qwen3-30b-a3b", "llama3-8b-128k-2gpu.yaml": "llama3-8b",
             "llama3-8b-1m.yaml": "llama3.1-8b", "llama3-8b-128k-lora.yaml": "llama3-8b"}


def cluster(path: Path) -> dict:
    line = re.search(r"^#\s*cluster:\s*(.*)$", path.read_text(), re.MULTILINE).group(1)
    return dict(item.split("=", 1) for item in line.split())


def one_step_per_stage(recipe: Path, directory: Path) -> Path:
    """A copy of the recipe in `directory` with one step per stage (or one step), everything else
    as shipped (its comments, the `# cluster:` line among them, are not copied: read them from
    the recipe)."""
    cfg = yaml.safe_load(recipe.read_text())
    for stage in cfg.get("stages") or []:
        stage["steps"] = 1
    if not cfg.get("stages"):
        cfg.setdefault("train", {})["steps"] = 1
    path = directory / recipe.name
    path.write_text(yaml.safe_dump(cfg))
    return path
