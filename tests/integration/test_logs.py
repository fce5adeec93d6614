"""What a person reads in a log: train and eval with their output piped (not a terminal) print
plain progress lines and a closing summary, no carriage returns; a 2-rank run prints each
third-party warning once; the rank filters drop third-party warnings only, on ranks > 0 only."""
import json
import re
import subprocess
import sys
from collections import Counter

import torch

import longctx
from helpers.train import env, metrics, run_train
from longctx.model import build_model, get_preset

PIPED_TRAIN = ["data.micro_batch_size=2", "data.shuffle=false", "data.seq_len=256", "log.tensorboard=false",
               "checkpoint.save_hf=false"]
PROGRESS_LINE = re.compile(r"^train: step (\d+)/(\d+) \(\d+%\) \| loss (\d+\.\d{4}) \| lr \S+ \| tok/s [\d,]+ "
                           r"\| mem \d+\.\d\d GiB \| elapsed \d+:\d\d \| eta \d+:\d\d$")
ACCELERATOR_NOTICE = "Setting accelerator to CPU"


def _ok(res):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_piped_training_prints_progress_lines_and_a_summary(tmp_path):
    out = tmp_path / "run"
    res = run_train(1, [f"out_dir={out}", "train.steps=4", *PIPED_TRAIN])
    _ok(res)
    text = res.stdout + res.stderr
    assert "\r" not in text
    progress = [PROGRESS_LINE.match(line) for line in res.stderr.splitlines() if line.startswith("train: step")]
    assert progress and all(progress), res.stderr
    assert [int(m[1]) for m in progress] == [1, 2, 3, 4] and {m[2] for m in progress} == {"4"}  # 10% of 4: each
    final_loss = metrics(out)[-1]["loss"]
    assert progress[-1][3] == f"{final_loss:.4f}"
    summary = res.stderr[res.stderr.index("train done:"):].splitlines()
    assert summary[0].startswith(f"train done: 4 steps, final loss {final_loss:.4f}, wall ")
    assert "tokens/s)" in summary[0]
    checkpoint = out / "checkpoints" / "step_0000004"
    assert summary[1] == f"  last checkpoint: {checkpoint}" and (checkpoint / "COMPLETE").exists()
    assert summary[2] == f"  hf export:       {out / 'hf'}" and (out / "hf" / "config.json").exists()
    assert summary[3].startswith(f"  metrics:         {out / 'metrics.jsonl'}")


def _third_party_warnings(text: str) -> list[str]:
    """DeepSpeed's logger lines ("[time] [WARNING] [file:line:func] message", the time cut) and
    Python's warning lines ("file:line: SomethingWarning: message")."""
    found = []
    for line in text.splitlines():
        if "[WARNING]" in line:
            found.append(line[line.index("[WARNING]"):])
        elif re.search(r"\w+Warning: ", line):
            found.append(line)
    return found


def test_two_ranks_print_each_third_party_warning_once(tmp_path):
    out = tmp_path / "run"
    res = run_train(2, [f"out_dir={out}", "train.steps=2", "parallel.cp_size=1", "parallel.zero_stage=0",
                        "checkpoint.export_hf=false", *PIPED_TRAIN])
    _ok(res)
    text = res.stdout + res.stderr
    repeated = {w: n for w, n in Counter(_third_party_warnings(text)).items() if n > 1}
    assert not repeated, repeated
    if not torch.cuda.is_available():  # DeepSpeed's CPU fallback notice: printed, by one rank
        assert text.count(ACCELERATOR_NOTICE) == 1, text
    assert text.count("train done:") == 1 and "\r" not in text
    assert (out / "logs" / "rank_00001.log").exists()


QUIET_PROBE = r"""
import logging, sys, warnings
from longctx.runtime.third_party_logs import quiet_other_ranks
quiet_other_ranks()  # as the command line does (longctx/commands/cli.py main) before any command loads
import torch.utils.cpp_extension as cpp
cpp._find_cuda_home()  # with CUDA_HOME set and no CUDA runtime: torch's 'No CUDA runtime' notice
logging.getLogger("DeepSpeed").addHandler(logging.StreamHandler(sys.stderr))
logging.getLogger("DeepSpeed").warning("ds warning")
logging.getLogger("DeepSpeed").error("ds error")
logging.getLogger("longctx.train").warning("own logged warning")
warnings.warn_explicit("third-party python warning", UserWarning, "lib.py", 1, module="somelib")
warnings.warn_explicit("own python warning", UserWarning, "x.py", 1, module="longctx.eval.ppl")
"""


def _probe(rank: int, tmp_path) -> str:
    e = dict(env(), RANK=str(rank), WORLD_SIZE="2", CUDA_HOME=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", QUIET_PROBE], capture_output=True, text=True, env=e, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stderr


def test_other_ranks_drop_third_party_warnings_only(tmp_path):
    everything = ["No CUDA runtime is found", "ds warning", "ds error", "own logged warning",
                  "third-party python warning", "own python warning"]
    rank0 = _probe(0, tmp_path)
    assert all(m in rank0 for m in everything), rank0
    rank1 = _probe(1, tmp_path)
    assert [m for m in everything if m in rank1] == ["ds error", "own logged warning", "own python warning"], rank1


def test_piped_eval_prints_clean_warnings_progress_and_a_summary(tmp_path):
    model_dir = tmp_path / "model"
    longctx.save_pretrained(build_model(get_preset("debug-tiny", max_position_embeddings=512), seed=0), model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["longctx_tokenizer"] = "byte"
    (model_dir / "config.json").write_text(json.dumps(cfg))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"A short document number {i}."}) + "\n" for i in range(2)))
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "longctx", "eval", "--model", str(model_dir), "--tasks", "passkey", "--suite", "ppl",
           "--lengths", "256", "--samples", "2", "--style", "compact", "--ppl-windows", "2", "--ppl-data", str(docs),
           "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600)
    _ok(res)
    text = res.stdout + res.stderr
    assert "\r" not in text and "UserWarning" not in text and "warnings.warn" not in text
    note = "ppl at 256: 0 of 2 documents reach 256 tokens, 2 windows wanted; windows are cut from the concatenated"
    assert [line for line in res.stderr.splitlines() if "ppl at 256" in line] == [
        f"warning: {note} stream (repeated text)"]
    assert any(w.startswith(note) for w in json.loads((out / "results.json").read_text())["warnings"])
    assert re.search(r"^eval: sample 2/2 \(100%\) \| elapsed \d+:\d\d \| eta 0:00$", res.stderr,
                     re.MULTILINE), res.stderr
    assert re.search(r"^ppl: window 2/2 \(100%\) \| elapsed \d+:\d\d \| eta 0:00$", res.stderr,
                     re.MULTILINE), res.stderr
    summary = res.stdout[res.stdout.index("eval done:"):].splitlines()
    assert re.match(r"eval done: 1 task x 1 length \(256\), 2 samples, mean score \d+\.\d; ppl at 256; wall \d+:\d\d$",
                    summary[0]), summary
    assert summary[1] == f"  results: {out / 'results.json'}, {out / 'report.md'}"
    assert summary[2].startswith("  figures: ") and str(out / "ppl_vs_length.png") in summary[2]
    assert summary[3] == f"  RULER predictions: {out / 'ruler'}/<length>/pred/ (1 length)"
