"""The short-context regression gate (`longctx eval --compare BASE`): lm-eval tasks paired sample by
sample with the base model's results; a constructed regression fails the gate (exit code 4), the
same scores with noise (flips both ways) pass, groups pair their subtasks as strata, RULER tasks
are reported beside them, and the command writes the comparison into results.json and report.md."""
import json
import random

import pytest

from helpers.lm_eval_tasks import write_model, write_tasks
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.eval import gate

pytestmark = pytest.mark.usefixtures("lm_eval_without_git")  # tests/unit/conftest.py


def _results(tasks: dict, ruler=()) -> dict:
    return {"lm_eval": {"tasks": {t: {"scores": {str(i): v for i, v in enumerate(s)}, "metric": "acc",
                                      "scale": 100.0} for t, s in tasks.items()},
                        "groups": {"short": ["a", "b"]}},
            "samples": [{"task": "niah", "target_length": L, "index": i, "score": v} for L, i, v in ruler]}


def test_a_regression_fails_and_noise_passes():
    rng = random.Random(0)
    base = [100.0 * (rng.random() < 0.7) for _ in range(400)]
    right, wrong = [i for i, v in enumerate(base) if v], [i for i, v in enumerate(base) if not v]
    flips = set(rng.sample(right, 12)) | set(rng.sample(wrong, 12))  # as many lost as gained: noise
    noise = [100.0 - v if i in flips else v for i, v in enumerate(base)]
    worse = [0.0 if v and rng.random() < 0.3 else v for v in base]  # a third of the right answers lost
    ruler = [(L, i, 50.0) for L in (256, 512) for i in range(3)]
    quiet = gate.compare(_results({"a": base, "b": base}, ruler), _results({"a": noise, "b": base}, ruler),
                         threshold=1.0)
    assert quiet["regressed"] == [] and [r["task"] for r in quiet["rows"]] == ["a", "b", "niah"]
    row = quiet["rows"][0]
    assert row["mean"] == 0.0 and row["lo"] < 0 < row["hi"]
    assert quiet["rows"][2]["gated"] is False and quiet["rows"][2]["n"] == 6 and quiet["rows"][2]["mean"] == 0.0
    # a drop beyond the threshold that 20 samples cannot tell from noise passes too
    few = gate.compare(_results({"a": [100.0] * 10 + [0.0] * 10}), _results({"a": [0.0, 0.0] + [100.0] * 8 + [100.0]
                                                                            + [0.0] * 9}), threshold=1.0)
    assert few["rows"][0]["mean"] == -5.0 and few["rows"][0]["lo"] < 0 < few["rows"][0]["hi"] and not few["regressed"]
    bad = gate.compare(_results({"a": base, "b": base}), _results({"a": worse, "b": base}), threshold=1.0)
    assert bad["regressed"] == ["a"] and bad["rows"][0]["hi"] < 0 and bad["rows"][0]["mean"] < -10
    # the same drop under a larger threshold passes; a group pairs its subtasks as strata
    assert gate.compare(_results({"a": base, "b": base}), _results({"a": worse, "b": base}), threshold=50.0,
                        )["regressed"] == []
    grouped = gate.compare(_results({"a": base, "b": base}), _results({"a": worse, "b": base}), threshold=1.0,
                           tasks=["short"])
    assert grouped["rows"][0]["task"] == "short" and grouped["rows"][0]["n"] == 800
    assert grouped["rows"][0]["mean"] == pytest.approx(bad["rows"][0]["mean"] / 2)
    assert "| a | 400 |" in gate.render(bad, "base/results.json") and "**regressed**" in gate.render(bad, "x")
    with pytest.raises(UserError, match="eval.gate_tasks: c has no per-sample scores"):
        gate.compare(_results({"a": base}), _results({"a": base}), threshold=1.0, tasks=["c"])


def test_the_command_exits_4_on_a_regression(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model, include = write_model(tmp_path / "model"), write_tasks(tmp_path / "tasks")
    perfect = tmp_path / "base.json"
    perfect.write_text(json.dumps(_results({"lc_choice": [100.0] * 6})))
    args = ["eval", "--model", str(model), "--suite", "none", "--lm-eval", "lc_choice", "--lm-eval-args",
            f"include_path={include}", "--no-progress", "--compare", str(perfect)]
    assert main(args + ["--out", str(tmp_path / "a")]) == gate.REGRESSED_EXIT_CODE  # 3 of 6 right vs 6 of 6
    out = capsys.readouterr().out
    assert "gate lc_choice: 100.0 -> 50.0" in out and "exit code 4" in out and "eval done: 1 lm-eval task;" in out
    written = json.loads((tmp_path / "a" / "results.json").read_text())
    assert written["compare"]["regressed"] == ["lc_choice"]
    assert "## Against the base model" in (tmp_path / "a" / "report.md").read_text()
    assert main(["eval", "--model", str(model), "--suite", "none", "--lm-eval", "lc_choice", "--compare",
                 str(tmp_path / "missing.json")]) == 2
    assert "error: eval.compare:" in capsys.readouterr().err
