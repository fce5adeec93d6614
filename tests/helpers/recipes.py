"""The published recipes in configs/ (and their CPU versions in configs/cpu/), the cluster shape
each states in its `# cluster:` line, and a stand-in checkpoint that --dry-run can read."""
import json
import re
from pathlib import Path

from longctx.model import get_preset
from longctx.model.hf import config_to_hf

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
CPU_RECIPES = sorted(p.name for p in (ROOT / "configs" / "cpu").glob("*.yaml"))
PRESET_OF = {"yarn-llama2-7b-128k.yaml": "llama2-7b", "llama3-8b-128k.yaml": "llama3-8b",
             "prolong-llama3-8b-64k.yaml": "llama3-8b"}


def cluster(path: Path) -> dict:
    line = re.search(r"^#\s*cluster:\s*(.*)$", path.read_text(), re.MULTILINE).group(1)
    return dict(item.split("=", 1) for item in line.split())


def fake_checkpoint(tmp_path: Path, preset: str) -> Path:
    """An HF model directory holding only what --dry-run reads: config.json (the real
    architecture) and a tokenizer file name (the tokenizer is not loaded)."""
    d = tmp_path / preset
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config_to_hf(get_preset(preset), "bfloat16")))
    (d / "tokenizer_config.json").write_text("{}")
    return d
