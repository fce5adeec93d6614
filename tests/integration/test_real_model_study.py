"""scripts/real_model/real_model_study.py on the debug-tiny model: grid, tasks and fixed-target perplexity
for two variants on the same samples, a report with paired differences, JSON and heatmaps, and a
rerun of the same command that starts no evaluation."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import longctx
from longctx.model import build_model, get_preset

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_model" / "real_model_study.py"


def test_study_writes_a_paired_report_and_a_rerun_computes_nothing(tmp_path):
    longctx.save_pretrained(build_model(get_preset("debug-tiny", max_position_embeddings=512), seed=0).eval(),
                            tmp_path / "model")
    (tmp_path / "heldout.jsonl").write_text("".join(
        json.dumps({"text": f"document {i}: " + "word salad " * 60, "kind": "prose" if i == 2 else "code"}) + "\n"
        for i in range(3)))
    out, report = tmp_path / "out", tmp_path / "docs" / "real-model.md"
    cmd = [sys.executable, str(SCRIPT), "--model", str(tmp_path / "model"), "--out", str(out), "--report", str(report),
           "--variants", "shipped,yarn4", "--lengths", "256", "--tasks", "niah_single_2", "--samples", "2",
           "--depths", "0,1", "--grid-samples", "1", "--ppl-data", str(tmp_path / "heldout.jsonl"),
           "--ppl-lengths", "128,256", "--ppl-target", "32", "--ppl-positions", "3", "--tokenizer", "byte",
           "--max-positions", "1024", "--resamples", "200",
           "--", "--tokenizer", "byte", "--style", "compact", "--max-new-tokens", "4"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    text = report.read_text()
    for heading in ("## Retrieval on the depth x length grid", "## RULER tasks", "### code", "### prose",
                    "## dtype per cell"):
        assert heading in text, heading
    assert "yarn4 - shipped" in text and "tasks 256 fp32" in text
    res = json.loads(report.with_suffix(".json").read_text())
    assert res["tasks"]["shipped"]["256"]["niah_single_2"]["n"] == 2
    assert res["grid"]["yarn4"]["256"]["mean"]["n"] == 2  # 2 depths x 1 sample
    assert res["diffs"]["grid"]["yarn4 - shipped"]["256"]["unpaired"] == 0
    for name in ("real-model-grid-shipped.png", "real-model-grid-yarn4.png", "real-model-grid-diff-yarn4.png"):
        assert (report.parent / name).read_bytes()[:4] == b"\x89PNG"
    # the same target tokens at both window lengths, for both variants
    cells = [json.loads(p.read_text()) for p in sorted(out.glob("*/ppl/code-*/*.json"))]
    assert len(cells) == 4 and len({tuple((w["doc"], w["end"], w["tokens"]) for w in c["windows"]) for c in cells}) == 1
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.json") if "ppl" in p.parts}

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "longctx eval exited" not in again.stdout and again.stdout.count("done before") == 4, again.stdout
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    assert report.read_text() == text
