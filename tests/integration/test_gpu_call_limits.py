"""A device call's script on CPU (scripts/gpu/gpu_env.sh, through a stand-in call): each step stops
at its limit, a CUDA step is skipped without CUDA, the budget is shared, and the summary is printed
from disk. Moved from tests/unit/test_gpu_calls.py: it runs bash and Python processes."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
