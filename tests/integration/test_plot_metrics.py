"""scripts/tools/plot_metrics.py: a run's loss curve as a PNG, and its bad-input errors."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tools" / "plot_metrics.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_writes_the_loss_curve_next_to_the_metrics(tmp_path):
    rows = [{"step": s, "loss": 3.0 - 0.1 * s, "tokens_seen": 64 * s} for s in range(1, 6)]
    rows.append({"step": 6, "loss": float("nan"), "skipped": True})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    val = [{"step": s, "stage": 0, "seq_len": 8, "val_loss": 3.0 - 0.1 * s,
            "val_loss_by_position": {"0-4": 3.0 - 0.1 * s, "4-8": None}} for s in (2, 4)]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # loss by position
    assert not (tmp_path / "probe.png").exists()  # no probe in these rows

    for r in val:  # with the probe: its scores against step beside it
        r.update(probe={"passkey": {"8": 10.0 * r["step"]}}, probe_token_accuracy={"passkey": {"8": 50.0}},
                 probe_samples=2)
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / 'probe.png'}" in res.stdout


def test_a_directory_without_metrics_is_one_error_line(tmp_path):
    res = _run(tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: run_dir:") and len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "loss.png").exists()
