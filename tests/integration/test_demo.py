"""`longctx demo`: the --fast pipeline end to end (train -> eval -> extend under torchrun with
cp=2 + ZeRO-3 -> re-eval -> the same extension training only an adapter -> eval -> report), its
run directory, and its error handling.

Accuracy is not asserted for --fast (a few steps cannot learn retrieval; nor that adapters
retrieve well on a tiny model); the measured numbers of the full demo are in docs/demo.md.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.demo.config import EVAL_TASKS, FAST, FULL, HEATMAP_TASK

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _demo(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "longctx", "demo", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=ROOT)


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    proc = _demo("--fast", "--out", str(out), "--seed", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, proc


@pytest.mark.slow  # the fast demo: trains, extends and evaluates (minutes)
def test_fast_demo_completes_with_a_wellformed_report(fast_run):
    out, proc = fast_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["plan"] == "fast" and summary["seed"] == 3
    assert summary["lengths"] == [256, 512, 1024, 2048] == [m * 256 for m in summary["multipliers"]]
    assert set(summary["variants"]) == {"a", "c", "e"}
    for key, variant in summary["variants"].items():
        scores = variant["scores"]
        assert set(scores) == set(EVAL_TASKS) | {"average"}
        for task, row in scores.items():
            assert set(row) == {str(L) for L in summary["lengths"]}
            for L, v in row.items():
                if task == "niah_multivalue" and L == "256":
                    assert v is None  # the compact multivalue prompt needs ~389 tokens
                else:
                    assert v is not None and 0.0 <= v <= 100.0, (key, task, L, v)
    for step in ("1 train base", "2 eval base", "3 extend (cp=2, ZeRO-3)", "4 eval extended",
                 "5 extend with adapter (cp=2, ZeRO-3)", "6 eval adapter", "demo total"):
        assert summary["timings_s"][step] > 0

    report = (out / "report.md").read_text()
    assert "## Retrieval accuracy" in report and "## Before → after extension" in report
    assert "- corpora (synthetic task mix): base " + ", ".join(f"{t} {w:g}" for t, w in FAST.tasks.items()) in report
    assert "extension " + ", ".join(f"{t} {w:g}" for t, w in FAST.extend_tasks.items()) in report
    for L, m in zip(summary["lengths"], summary["multipliers"]):
        assert f"| {L} ({m}x) |" in report  # one before/after row per length
    acc_rows = [line for line in report.splitlines() if re.match(r"\| \([ace]\) [^|]+ \| \d+\.\d ± ", line)]
    assert len(acc_rows) == 3 and all(len(re.findall(r"\d+\.\d ± \d+\.\d", r)) == 4 for r in acc_rows)
    for variant in summary["variants"].values():  # the averages' standard errors (eval samples)
        assert {str(L) for L in summary["lengths"]} == set(variant["average_stderr"])
        assert all(v >= 0.0 for v in variant["average_stderr"].values())
    # validation while the extension trained: loss by position and the probe, with both pictures
    assert "## While the extension trained (validation)" in report
    assert "![loss by position](extend/validation.png)" in report and "![probe](extend/probe.png)" in report
    for picture in ("validation.png", "probe.png"):
        assert (out / "extend" / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    val = [json.loads(line) for line in (out / "extend" / "validation.jsonl").read_text().splitlines()]
    assert [r["step"] for r in val] == [2, 4]
    assert set(val[-1]["probe"]) == set(FAST.probe_tasks)
    assert set(val[-1]["probe"]["niah_multivalue"]) == {str(n) for n in FAST.probe_lengths} == {"512", "1024"}
    probe_rows = [line for line in report.splitlines() if re.match(r"\| [24] \| ", line)]
    assert len(probe_rows) == 2  # the probe at every validation, one row each
    assert "FutureWarning" not in proc.stderr  # third-party noise stays in the logs
    assert "retrieval score before -> after extension" in proc.stderr


@pytest.mark.slow  # the fast demo: trains, extends and evaluates (minutes)
def test_fast_demo_reports_the_adapter_run_beside_the_full_one(fast_run):
    """One row per extension run (full, adapter): retrieval at 4x, trained parameters, peak memory
    per rank, wall time and tokens/s, in summary.json, report.md and on the console."""
    out, proc = fast_run
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["runs"]
    assert list(runs) == ["full", "adapter"]
    full, lora = runs["full"], runs["adapter"]
    assert (full["variant"], full["run_dir"], full["adapter"]) == ("c", "extend", None)
    assert (lora["variant"], lora["run_dir"]) == ("e", "extend_adapter")
    assert lora["adapter"] == {"type": "lora", "r": FAST.adapter_r, "alpha": FAST.adapter_alpha,
                               "target_modules": FAST.adapter_targets, "trainable": FAST.adapter_trainable}
    for key, run in runs.items():
        score = run["retrieval_at_extend_len"]
        assert isinstance(score, float) and 0.0 <= score <= 100.0, (key, score)  # the demo's 0-100 scale
        assert score == summary["variants"][run["variant"]]["scores"]["average"]["1024"]
        assert run["steps"] == FAST.extend_steps
        assert run["peak_memory_gb_per_rank"] > 0 and run["wall_seconds"] > 0 and run["tokens_per_s"] > 0, key
        assert 0 < run["trained_parameters"] <= run["model_parameters"]
    assert full["trained_parameters"] == full["model_parameters"] == summary["parameters"]
    assert lora["trained_parameters"] < full["trained_parameters"]
    assert lora["model_parameters"] > full["model_parameters"]  # the LoRA factors, counted as the trainer does
    train_log = (out / "extend_adapter" / "train.log").read_text()
    assert f"training {lora['trained_parameters']:,} of {lora['model_parameters']:,} parameters" in train_log

    report = (out / "report.md").read_text()
    assert "## What each extension cost" in report
    # run | trained (share) | retrieval ± se | peak GiB | wall s | tokens/s
    row = r"\| \([ce]\) [^|]+ \| [\d,]+ \(\d+\.\d%\) \| \d+\.\d ± \d+\.\d \| \d+\.\d\d \| \d+ \| [\d,]+ \|$"
    rows = [line for line in report.splitlines() if re.match(row, line)]
    assert [r.split(" | ")[0] for r in rows] == ["| (c) scaling + continued pretraining", "| (e) scaling + adapter"]
    assert "- `base/`, `extend/`, `extend_adapter/`" in report
    assert "| run | trained parameters | retrieval at 4x (1024) |" in proc.stderr  # the table on the console too


@pytest.mark.slow  # the fast demo: trains, extends and evaluates (minutes)
def test_fast_demo_run_directory_is_self_contained(fast_run):
    out, _ = fast_run
    for name in ("demo.json", "report.md", "summary.json", "accuracy_vs_length.png",
                 "configs/base.yaml", "configs/extend.yaml"):
        assert (out / name).is_file(), name
    for run in ("base", "extend"):
        for name in ("resolved_config.yaml", "metrics.jsonl", "train.log", "hf/config.json", "hf/model.safetensors"):
            assert (out / run / name).is_file(), f"{run}/{name}"
        assert any((out / run / "tb").iterdir())
        ckpts = sorted((out / run / "checkpoints").glob("step_*"))
        assert ckpts and all((c / "COMPLETE").is_file() for c in ckpts)
    for variant in ("a_base", "c_extended", "e_adapter"):
        d = out / "eval" / variant
        for name in ("results.json", "report.md", "scores_vs_length.png", f"heatmap_{HEATMAP_TASK}.png"):
            assert (d / name).is_file(), f"{variant}/{name}"
        records = json.loads((d / "results.json").read_text())["samples"]
        assert {r["target_length"] for r in records} == {256, 512, 1024, 2048}
        assert {r["task"] for r in records} == set(EVAL_TASKS)

    # base: the curriculum, one process
    base = [json.loads(line) for line in (out / "base" / "metrics.jsonl").read_text().splitlines()]
    assert [r["seq_len"] for r in base][-1] == FAST.train_len
    assert sorted({r["seq_len"] for r in base}) == sorted(s.seq_len for s in FAST.base_stages)
    assert len(base) == sum(s.steps for s in FAST.base_stages)
    # extension: 2 ranks as cp=2 (dp=1), ZeRO-3, at 4x, from the base export, YaRN x4
    ext = [json.loads(line) for line in (out / "extend" / "metrics.jsonl").read_text().splitlines()]
    assert len(ext) == FAST.extend_steps
    assert all(r["cp_size"] == 2 and r["dp_size"] == 1 and r["seq_len"] == 4 * FAST.train_len for r in ext)
    assert all(r["loss"] == r["loss"] and r["loss"] > 0 for r in ext)  # finite
    resolved = (out / "extend" / "resolved_config.yaml").read_text()
    assert "zero_stage: 3" in resolved and "cp_size: 2" in resolved and str(out / "base" / "hf") in resolved
    assert (out / "extend" / "logs" / "rank_00001.log").is_file()  # really two processes
    hf = json.loads((out / "extend" / "hf" / "config.json").read_text())
    rope = hf.get("rope_parameters") or hf.get("rope_scaling")
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert hf["max_position_embeddings"] == 4 * FAST.train_len
    base_hf = json.loads((out / "base" / "hf" / "config.json").read_text())
    assert base_hf["max_position_embeddings"] == FAST.train_len
    # the adapter extension: the same job with train.adapter; its hf/ is the merged model, adapter/ PEFT's
    lora = out / "extend_adapter"
    for name in ("resolved_config.yaml", "metrics.jsonl", "train.log", "hf/config.json", "hf/model.safetensors",
                 "adapter/adapter_config.json", "adapter/adapter_model.safetensors"):
        assert (lora / name).is_file(), f"extend_adapter/{name}"
    assert (out / "configs" / "extend_adapter.yaml").is_file()
    lora_metrics = [json.loads(line) for line in (lora / "metrics.jsonl").read_text().splitlines()]
    assert len(lora_metrics) == FAST.extend_steps
    assert all(r["cp_size"] == 2 and r["seq_len"] == 4 * FAST.train_len and r["loss"] > 0 for r in lora_metrics)
    resolved = (lora / "resolved_config.yaml").read_text()
    assert "zero_stage: 3" in resolved and "cp_size: 2" in resolved and "r: 16" in resolved
    assert json.loads((lora / "hf" / "config.json").read_text())["max_position_embeddings"] == 4 * FAST.train_len


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                if text in (proc_dir / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc_dir.name))
            except OSError:  # exited meanwhile
                pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_sigterm_stops_the_running_training_job(tmp_path):
    """Killing the demo (SIGTERM: `kill`, a scheduler) must not leave its torchrun/trainer behind."""
    import signal
    import time

    out = tmp_path / "run"
    demo = subprocess.Popen([sys.executable, "-m", "longctx", "demo", "--fast", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), cwd=ROOT)
    job = str(out / "configs" / "base.yaml")
    try:
        deadline = time.time() + 120
        while not _processes_mentioning(job) and time.time() < deadline and demo.poll() is None:
            time.sleep(0.2)
        assert _processes_mentioning(job), "the base training job never started"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=120) == 128 + signal.SIGTERM
        deadline = time.time() + 30
        while _processes_mentioning(job) and time.time() < deadline:
            time.sleep(0.2)
        assert not _processes_mentioning(job), "the training job outlived the demo"
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in _processes_mentioning(job):
            os.kill(pid, signal.SIGKILL)


def test_bad_flags_are_one_line_errors(tmp_path):
    for args in (["--bogus"], ["--seed", "x"], ["--seed", "-1"], ["stray"], ["--no-adapter=yes"]):
        proc = _demo(*args, "--out", str(tmp_path / "never"), timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert not (tmp_path / "never").exists()


def test_adapter_run_without_peft_is_a_one_line_error_before_any_work(tmp_path, monkeypatch):
    """In process: `peft` made unimportable; the demo refuses before its run directory exists,
    naming the extra to install and --no-adapter."""
    import argparse

    from longctx.base.errors import UserError
    from longctx.commands import demo

    monkeypatch.setitem(sys.modules, "peft", None)  # importlib.util.find_spec("peft") -> None
    args = argparse.Namespace(out=str(tmp_path / "never"), seed=0, fast=True, ablation=False, adapter=True)
    with pytest.raises(UserError, match=r"longctx\[adapters\].*--no-adapter"):
        demo.run(args)
    assert not (tmp_path / "never").exists()


def test_cost_rates_are_the_trainers_numbers_without_the_warmup_step(tmp_path):
    """Peak memory is the largest step's; tokens/s is row positions over step time of the steps
    after the first (a one-step run keeps it); records without step times do not count."""
    from longctx.demo.costs import step_rates

    def rec(mem, slots, t):
        return json.dumps({"peak_memory_gb": mem, "slots": slots, "step_time_s": t, "step": 1})

    (tmp_path / "metrics.jsonl").write_text("\n".join(
        [rec(0.5, 2048, 10.0), rec(0.75, 2048, 1.0), '{"note": "no step"}', rec(0.7, 2048, 3.0)]) + "\n")
    assert step_rates(tmp_path) == {"steps": 3, "peak_memory_gb": 0.75, "tokens_per_s": 4096 / 4.0}
    (tmp_path / "metrics.jsonl").write_text(rec(0.5, 1024, 2.0) + "\n")
    assert step_rates(tmp_path) == {"steps": 1, "peak_memory_gb": 0.5, "tokens_per_s": 512.0}


def test_refuses_a_foreign_nonempty_out_dir(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    proc = _demo("--fast", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --out:")
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_plans_match_the_issue():
    # full demo: 1x..8x of 256, extension x4 at 1024 on 2 processes with cp=2 and ZeRO-3
    for plan in (FULL, FAST):
        assert plan.lengths == [256, 512, 1024, 2048]
        assert (plan.extend_len, plan.nproc, plan.cp_size, plan.zero_stage) == (1024, 2, 2, 3)
        assert plan.scaled_rope()["original_max_position_embeddings"] == plan.train_len
    assert [s.seq_len for s in FULL.base_stages] == [128, 192, 256]


def test_findings_state_only_what_the_table_shows():
    from longctx.demo.pipeline import findings

    def table(avg):
        return {"average": dict(zip(FULL.lengths, avg))}

    tables = {"a": table([95.0, 60.0, 10.0, 0.0]), "b": table([93.0, 70.0, 40.0, 5.0]),
              "c": table([97.0, 96.0, 90.0, 30.0]), "d": table([96.0, 95.0, 88.0, 12.0])}
    text = "\n".join(findings(FULL, tables))
    assert "scores 10 at 4x" in text and "90 at 4x" in text
    assert "256: no measurable difference, 512: +10 points, 1024: +30 points, 2048: no measurable difference" in text
    assert "1024: no measurable difference, 2048: +18 points" in text
    # with standard errors a difference must exceed two of them (of the difference)
    for t, s in zip(tables.values(), ([2.0, 4.0, 3.0, 1.0], [2.0, 4.0, 3.0, 2.0], [1.0, 2.0, 3.0, 5.0],
                                      [1.0, 3.0, 3.0, 6.0])):
        t["average_se"] = dict(zip(FULL.lengths, s))
    text = "\n".join(findings(FULL, tables))
    assert "90 ± 3 at 4x" in text
    # the adapter run beside the full one: its share of trained parameters, its score against (c)'s
    tables["e"] = table([96.0, 90.0, 80.0, 20.0])
    tables["e"]["average_se"] = dict(zip(FULL.lengths, [1.0, 2.0, 3.0, 4.0]))
    runs = {"full": {"trained_parameters": 2_000_000, "model_parameters": 2_000_000, "peak_memory_gb_per_rank": 1.5,
                     "tokens_per_s": 1000.0},
            "adapter": {"trained_parameters": 150_000, "model_parameters": 2_100_000,
                        "peak_memory_gb_per_rank": 1.25, "tokens_per_s": 1200.0}}
    line = [f for f in findings(FULL, tables, runs=runs) if f.startswith("The adapter run (e)")]
    assert line == ["The adapter run (e) trains 150,000 of 2,100,000 parameters (7.1%) and scores 80 ± 3 at 4x "
                    "against the full run's 90 ± 3 (-10 points); rank 0's peak memory 1.25 against 1.50 GiB, "
                    "1,200 against 1,000 tokens/s."]  # -10 beyond 2 * hypot(3, 3) = 8.5
    del tables["e"]
    # b - a at 512: +10 > 2 * hypot(4, 4) = 11.3 fails; at 1024 +30 > 8.5 holds
    assert "256: no measurable difference, 512: no measurable difference, 1024: +30 points" in text
    assert "2048: +18 points" in text  # 18 > 2 * hypot(5, 6) = 15.6


def test_training_configs_carry_the_measured_recipe(tmp_path):
    """The written YAMLs are what the trainer validates and runs: base documents near-full
    (a distractor in every 256-token niah document), extension documents 1x..4x."""
    from longctx.config import load_config
    from longctx.data import load_tokenizer
    from longctx.demo import jobs

    byte = load_tokenizer("byte")
    base = jobs.write_config(jobs.base_config(FULL, tmp_path / "base", 0, byte), tmp_path / "base.yaml")
    ext = jobs.write_config(jobs.extend_config(FULL, tmp_path / "ext", tmp_path / "base" / "hf", 0,
                                                   FULL.scaled_rope(), byte), tmp_path / "ext.yaml")
    b, e = load_config(str(base)), load_config(str(ext))
    b_syn, e_syn = b.data.sources[0].synthetic, e.data.sources[0].synthetic
    assert b.optim.lr == 1e-3 and b_syn.length_min_ratio == 0.95 and b_syn.filler == "noise"
    assert [(s.seq_len, s.steps) for s in b.stages] == [(128, 100), (192, 150), (256, 1200)]  # the curriculum
    assert e_syn.length_min_ratio == 0.25 and e_syn.num_keys == 12 and b_syn.num_keys == 4
    assert e_syn.queries == 8 and b_syn.queries == 1  # no room for 2 questions at 256
    assert e.data.seq_len == 1024 and e.parallel.cp_size == 2 and e.parallel.zero_stage == 3
    # recall documents drill key matching in both corpora; multi-valued keys only in the extension
    assert dict(b_syn.tasks) == {"niah": 0.35, "recall": 0.45, "passkey": 0.2} and b_syn.recall_multivalue == 0
    assert dict(e_syn.tasks) == {"niah": 0.35, "multivalue": 0.25, "passkey": 0.15, "recall": 0.25}
    assert e_syn.recall_multivalue == 0.3
    assert [dict(s.sources[0].synthetic.tasks) for s in b.stages[:2]] == [{"passkey": 1.0}] * 2  # copying first
    # half the extension's niah/multivalue/passkey documents put needles on lines of their own
    assert e_syn.line_breaks == 0.5 and b_syn.line_breaks == 0
    assert b.data.micro_batch_size == 8 and e.data.micro_batch_size == 4  # 16 rows over 2 ranks; 4 rows shared by cp
    assert e.train.adapter is None
    # (e): the extension's job, training only LoRA on the attention projections + embeddings and norms
    lora = load_config(str(jobs.write_config(
        jobs.extend_config(FULL, tmp_path / "lora", tmp_path / "base" / "hf", 0, FULL.scaled_rope(), byte,
                           adapter=FULL.adapter()), tmp_path / "lora.yaml")))
    a = lora.train.adapter
    assert (a.type, a.r, a.alpha, a.dropout) == ("lora", 16, 32.0, 0.0)
    assert list(a.target_modules) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert list(a.trainable) == ["embed_tokens", "norm"]
    for section in ("model", "data", "parallel", "optim", "validation", "checkpoint"):  # the same job
        assert getattr(lora, section) == getattr(e, section), section
    assert lora.train.steps == e.train.steps and lora.train.seed == e.train.seed


def test_eval_threads_follow_the_cores_other_processes_leave_free():
    """The demo's evals use the cores left free now, not the minute-long load average (which
    still counts the training job that just ended and used to leave the eval on one thread)."""
    from longctx.demo.evaluation import busy_cores, eval_threads

    cpus = os.cpu_count() or 1
    assert eval_threads(0.0) == cpus
    assert eval_threads(float(cpus)) == 1 and eval_threads(10.0 * cpus) == 1
    assert eval_threads(cpus - 1.0) == 1
    busy = busy_cores(0.05)
    if os.path.exists("/proc/stat"):
        assert busy is not None and 0.0 <= busy <= cpus + 1e-6
