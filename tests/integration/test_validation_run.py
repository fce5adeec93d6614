"""Validation inside the real trainer: validation.jsonl rows, loss by position in the metrics and
TensorBoard, and a SIGTERM during a validation that a resume recovers without a row repeated
or skipped."""
import json
import math
import subprocess

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers.process_hooks import signal_in_validation_env
from helpers.train import TINY, env, metrics, run_train, train_cmd
from longctx.train.signals import PREEMPTED_EXIT_CODE

COMMON = [*TINY, "train.steps=8", "validation.every=2", "validation.rows=3", "optim.lr=3e-3", "log.tensorboard=true"]


def _ok(res):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def _rows(out):
    return [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]


def test_validation_rows_and_a_sigterm_during_validation_then_resume(tmp_path):
    straight = tmp_path / "straight"
    _ok(run_train(1, [f"out_dir={straight}", *COMMON]))
    rows = _rows(straight)
    assert [r["step"] for r in rows] == [2, 4, 6, 8]
    for r in rows:
        assert {"step", "stage", "seq_len", "val_loss", "val_loss_by_position", "val_time_s"} <= set(r)
        assert math.isfinite(r["val_loss"]) and r["seq_len"] == 256 and r["stage"] == 0
        filled = [v for v in r["val_loss_by_position"].values() if v is not None]
        assert len(filled) >= 2 and all(math.isfinite(v) for v in filled)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]  # the held-out loss falls as it trains
    for rec in metrics(straight):
        assert len([v for v in rec["loss_by_position"].values() if v is not None]) >= 2
    acc = EventAccumulator(str(straight / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert [e.step for e in acc.Scalars("val/val_loss")] == [2, 4, 6, 8]
    assert "val/val_loss_by_position/128-256" in tags and "train/loss_by_position/0-2" in tags
    assert (straight / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn at the run's end

    # SIGTERM as the validation of step 4 starts: it stops after its first batch (of 2: rows=3,
    # micro_batch_size=2), checkpoint 4 is written with that validation pending, exit 85
    out = tmp_path / "preempted"
    e = env()
    signal_in_validation_env(tmp_path, e, nth=2)
    res = subprocess.run(train_cmd(1, [f"out_dir={out}", *COMMON]), capture_output=True, text=True, env=e,
                         timeout=600)
    assert res.returncode == PREEMPTED_EXIT_CODE, res.stderr[-3000:]
    assert (out / "PREEMPTED").read_text().strip() == "4"
    assert [r["step"] for r in _rows(out)] == [2]
    # a resume redoes it first; a signal during that redo stops it again, the checkpoint unchanged
    e = env()
    (tmp_path / "again").mkdir()
    signal_in_validation_env(tmp_path / "again", e, nth=1)
    res = subprocess.run(train_cmd(1, [f"out_dir={out}", *COMMON, "checkpoint.resume=auto"]), capture_output=True,
                         text=True, env=e, timeout=600)
    assert res.returncode == PREEMPTED_EXIT_CODE, res.stderr[-3000:]
    assert [r["step"] for r in _rows(out)] == [2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))[-1] == "step_0000004"
    _ok(run_train(1, [f"out_dir={out}", *COMMON, "checkpoint.resume=auto"]))
    resumed = _rows(out)
    assert [r["step"] for r in resumed] == [2, 4, 6, 8]  # none repeated, none skipped
    for a, b in zip(rows, resumed):
        assert abs(a["val_loss"] - b["val_loss"]) <= 1e-6 * a["val_loss"], (a, b)
        for label, v in a["val_loss_by_position"].items():
            assert abs(v - b["val_loss_by_position"][label]) <= 1e-6 * v, (label, a, b)


def test_an_edited_heldout_set_stops_the_resume(tmp_path):
    """The held-out set is part of the run's data identity."""
    out = tmp_path / "run"
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"text": f"held-out document {i} " * 20}) + "\n" for i in range(4)))
    common = [*TINY, "train.steps=2", "validation.every=2", "validation.rows=2",
              f"validation.sources=[{{path: {heldout}}}]"]
    _ok(run_train(1, [f"out_dir={out}", *common]))
    heldout.write_text(heldout.read_text() + json.dumps({"text": "one more"}) + "\n")
    res = run_train(1, [f"out_dir={out}", *common, "train.steps=4", "checkpoint.resume=auto"])
    assert res.returncode == 2, res.stderr[-3000:]
    assert "validation.sources[0] changed since the checkpoint" in res.stderr, res.stderr[-2000:]
    assert [r["step"] for r in _rows(out)] == [2]
