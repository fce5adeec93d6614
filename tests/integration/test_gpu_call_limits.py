"""The device calls where they start processes (moved from tests/unit/test_gpu_calls.py): the plan's
check, which lists the carried files with `git ls-files`, and a call's script on CPU
(scripts/gpu/gpu_env.sh, through a stand-in call): each step stops at its limit, a CUDA step is
skipped without CUDA, the budget is shared, and the summary is printed from disk."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_calls():
    spec = importlib.util.spec_from_file_location("gpu_calls", ROOT / "scripts" / "gpu" / "gpu_calls.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_calls"] = module
    spec.loader.exec_module(module)
    return module


def test_every_call_and_session_meets_every_rule(capsys):
    calls = _load_calls()
    assert calls.main(["check"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "all rules met" in out and "FAIL" not in out
    for name in calls.CALLS:
        assert f"\n{name}: bash scripts/gpu/" in out


SCRIPT = """set -uo pipefail
out=$1
budget_s=40
keep="kept.json"
summary() { echo "table from disk: $(cat "$out/kept.json" 2>/dev/null || echo none)"; }
source scripts/gpu/gpu_env.sh
write() { echo '{"row": 1}' > "$out/kept.json"; sleep 30; }
step writes 2 write
cuda_step on_gpu 5 true
step late 30 sleep 30
step spent 30 true
"""


def test_a_call_stops_its_steps_at_their_limits_and_prints_its_table_from_disk(tmp_path):
    script = tmp_path / "call.sh"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(tmp_path / "no-wheels"),
           "SITE": str(tmp_path / "site"), "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "OUT" / "c"
    res = subprocess.run(["bash", str(script), str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    assert rows[0][0] == "writes" and "stopped at its 2 s limit" in rows[0][3], res.stdout
    assert rows[1] == ["on_gpu", "5", "0", "skipped: no CUDA"]
    assert rows[3] == ["spent", "30", "0", "skipped: budget spent"]  # `late` ate what was left
    assert "table from disk: {\"row\": 1}" in res.stdout
    assert sorted(p.name for p in out.iterdir()) == ["kept.json", "rest.tar.gz", "steps.tsv", "summary.md"]
    assert "| writes | 2 |" in (out / "summary.md").read_text()
