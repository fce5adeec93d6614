"""The retrieval probe inside training (cp = 2, ZeRO-3) scores what `longctx eval
mode=teacher_forced` scores on the checkpoint saved at that step, with the same task, length,
seed and samples; and the probe's bad inputs are one error line before anything runs."""
import json
import subprocess
import sys

import pytest

from helpers.train import TINY, env, run_train

STEPS = 12
PROBE = ["validation.probe.tasks=[passkey,niah_single_1]", "validation.probe.lengths=[192,256]",
         "validation.probe.samples=3", "validation.probe.seed=5", "validation.probe.style=compact"]


def test_the_probe_equals_teacher_forced_eval_on_the_checkpoint_of_its_step(tmp_path):
    out = tmp_path / "run"
    res = run_train(2, [f"out_dir={out}", *TINY, f"train.steps={STEPS}", "parallel.cp_size=2",
                        "parallel.zero_stage=3", "optim.lr=3e-3", f"validation.every={STEPS}", "validation.rows=2",
                        *PROBE])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [STEPS]
    row = rows[0]
    assert set(row["probe"]) == {"passkey", "niah_single_1"}
    assert set(row["probe"]["passkey"]) == {"192", "256"}
    assert (out / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn at the run's end
    # a model that gets some answer tokens right: the comparison below is not of zeros only
    assert any(v > 0 for cells in row["probe_token_accuracy"].values() for v in cells.values()), row

    eval_out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "longctx", "eval", "--model", str(out / "checkpoints" / f"step_{STEPS:07d}"),
           "--tasks", "passkey,niah_single_1", "--lengths", "192,256", "--samples", "3", "--seed", "5",
           "--style", "compact", "--mode", "teacher_forced", "--dtype", "fp32", "--out", str(eval_out),
           "--no-progress"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env())
    assert res.returncode == 0, res.stderr[-3000:]
    records = json.loads((eval_out / "results.json").read_text())["samples"]
    cells: dict = {}
    for r in records:
        cells.setdefault((r["task"], str(r["target_length"])), []).append(r)
    assert len(cells) == 4 and all(len(c) == 3 for c in cells.values())
    for (task, length), recs in cells.items():
        assert row["probe"][task][length] == pytest.approx(sum(r["score"] for r in recs) / 3, abs=1e-9)
        right = sum(r["answer_tokens_right"] for r in recs) / sum(r["answer_tokens"] for r in recs)
        assert row["probe_token_accuracy"][task][length] == pytest.approx(100 * right, abs=1e-9), (task, length)


@pytest.mark.parametrize("override, message", [
    ("validation.probe.tasks=[nope]", "error: validation.probe.tasks: unknown task 'nope'"),
    ("validation.probe.lengths=[512]", "error: validation.probe.lengths: 512 is beyond the length of stage 0"),
    ("validation.probe.lengths=[128]", "error: validation.probe.lengths: 128 is below the minimum of task"),
    ("validation.probe.samples=0", "error: validation.probe.samples: must be an integer >= 1"),
])
def test_bad_probe_fields_are_one_error_line_before_anything_runs(tmp_path, override, message):
    out = tmp_path / "run"
    res = run_train(1, [f"out_dir={out}", *TINY, "train.steps=2", "validation.every=2", *PROBE[:1], *PROBE[2:],
                        "validation.probe.style=compact", override])
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), res.stderr[-2000:]
    assert not (out / "metrics.jsonl").exists()
