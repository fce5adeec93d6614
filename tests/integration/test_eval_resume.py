"""`longctx eval` stopped and rerun gives the bytes of one uninterrupted run: SIGTERM mid-cell
(exit 85, the finished batches kept), SIGKILL right after a cell file, SIGKILL mid-cell, SIGKILL
half-way through results.json, each followed by the same command; under torchrun (dp=2, cp=2)
a signal to one rank stops both after the same batch. Faults come from tests/helpers/eval_faults.py
(a monkeypatched call that signals its own process at the N-th call)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import longctx
from helpers.train import env, free_port
from longctx.model import build_model, get_preset

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "helpers" / "eval_faults.py"
PREEMPTED = 85


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=1024)
    longctx.save_pretrained(build_model(cfg, seed=0).eval(), d)
    config = json.loads((d / "config.json").read_text())
    config["longctx_tokenizer"] = "byte"
    (d / "config.json").write_text(json.dumps(config))
    return d


def _args(model_dir, out):
    # 2 tasks x 2 lengths, 6 samples per cell (3 x 2 depths) in 3 batches of 2; perplexity at both lengths
    return ["eval", "--model", str(model_dir), "--suite", "passkey,ppl", "--tasks", "niah_single_1,passkey",
            "--depths", "0,1", "--lengths", "256,512", "--samples", "3", "--style", "compact", "--max-new-tokens", "4",
            "--batch-size", "2", "--ppl-windows", "1", "--no-progress", "--out", str(out)]


def _eval(model_dir, out, fault="none", n=0, rank=None, nproc=1, extra=()):
    launcher = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-port", str(free_port())]
    cmd = [*launcher, str(DRIVER), fault, str(n), *([str(rank)] if rank is not None else []), "--",
           *_args(model_dir, out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env(), cwd=ROOT)


@pytest.fixture(scope="module")
def one_process(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "out"
    res = _eval(model_dir, out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _outputs(out: Path) -> dict:
    """Every file a user reads (cells/, timing.json and the lock are the machinery)."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).parts[0] != "cells" and p.name != "timing.json"}


def _cells(out: Path) -> dict:
    return {p.relative_to(out / "cells").as_posix(): json.loads(p.read_text())
            for p in sorted((out / "cells").glob("*/*.json"))}


def _lines(res) -> list:
    return [x for x in res.stderr.splitlines() if not x.startswith("[") and "WARNING" not in x]


def test_killed_at_four_points_and_rerun_gives_the_uninterrupted_bytes(model_dir, one_process, tmp_path):
    reference = _outputs(one_process)
    assert {"results.json", "report.md", "scores_vs_length.png", "heatmap_passkey.png", "ppl_vs_length.png",
            "ruler/512/pred/passkey.jsonl"} <= set(reference)
    assert "wall_seconds" not in reference["results.json"].decode() and (one_process / "timing.json").is_file()
    out = tmp_path / "resumed"

    # 1. SIGTERM as the 2nd batch starts: that batch finishes, the first cell keeps 4 of its 6 samples
    res = _eval(model_dir, out, "term-batch", 2)
    assert res.returncode == PREEMPTED, res.stderr[-3000:]
    assert (f"preempted (SIGTERM): 0 of 6 cells done in {out} (and 4 of 6 samples of niah_single_1 at 256); "
            f"exit code 85; run the same command again to continue") in res.stderr
    assert "Traceback" not in res.stderr
    cells = _cells(out)
    assert list(cells) == ["256/niah_single_1.json"] and not cells["256/niah_single_1.json"]["complete"]
    assert len(cells["256/niah_single_1.json"]["records"]) == 4
    assert (out / "PREEMPTED").read_text() == "0 of 6 cells\n" and not (out / "results.json").exists()
    assert not (out / ".longctx-eval.lock").exists()

    # 2. SIGKILL right after the first cell file of the rerun (the partial cell, now complete)
    res = _eval(model_dir, out, "kill-cell", 1)
    assert res.returncode == -9
    assert ("resuming: 0 of 6 cells already done in" in res.stderr
            and "(and 4 of 6 samples of niah_single_1 at 256)" in res.stderr)
    assert _cells(out)["256/niah_single_1.json"]["complete"]
    assert not (out / "PREEMPTED").exists()

    # 3. SIGKILL as the 2nd batch of the next cell starts: its first batch is lost with it
    res = _eval(model_dir, out, "kill-batch", 2)
    assert res.returncode == -9
    assert f"resuming: 1 of 6 cells already done in {out}" in res.stderr
    assert list(_cells(out)) == ["256/niah_single_1.json"]

    # 4. SIGKILL half-way through results.json: every cell is done, results.json is absent
    res = _eval(model_dir, out, "kill-final", 0)
    assert res.returncode == -9
    assert "taking over" in res.stderr and "it is no longer running" in res.stderr  # the lock of run 3
    assert len(_cells(out)) == 6 and all(c["complete"] for c in _cells(out).values())
    assert not (out / "results.json").exists()
    (temp,) = [p for p in out.iterdir() if p.name.startswith(".results.json.tmp-")]

    # 5. the same command: nothing is computed again, the final files are built from the cells
    res = _eval(model_dir, out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming: 6 of 6 cells already done in {out}" in res.stderr
    assert f"note: removed {temp}" in res.stderr
    assert json.loads((out / "timing.json").read_text())["cells_computed"] == 0
    assert _outputs(out) == reference  # results.json, report.md, figures, RULER's files: byte for byte
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_another_evaluation_into_the_same_out_is_refused_unless_overwrite(model_dir, tmp_path):
    out = tmp_path / "o"
    assert _eval(model_dir, out).returncode == 0
    before = _outputs(out)
    args = _args(model_dir, out)
    seed = subprocess.run([sys.executable, "-m", "longctx", *args, "--seed", "1"], capture_output=True, text=True,
                          timeout=600, env=env(), cwd=ROOT)
    assert seed.returncode == 2
    (line,) = [x for x in _lines(seed) if x.startswith("error:")]
    assert line == (f"error: eval.out: {out} holds results of another evaluation: cells/256/niah_single_1.json "
                     "(and 3 more cells): its samples differ (seed, samples, style, chat template, prompts or haystack "
                     "data); choose another --out, or pass --overwrite to replace them")
    assert "Traceback" not in seed.stderr and _outputs(out) == before
    over = subprocess.run([sys.executable, "-m", "longctx", *args, "--seed", "1", "--overwrite"], capture_output=True,
                          text=True, timeout=600, env=env(), cwd=ROOT)
    assert over.returncode == 0, over.stderr[-3000:]
    assert f"note: --overwrite: removed 4 cells of another evaluation from {out / 'cells'}" in over.stderr
    assert "resuming: 2 of 6 cells already done" in over.stderr  # perplexity does not depend on the seed
    assert json.loads((out / "results.json").read_text())["meta"]["seed"] == 1


@pytest.mark.parametrize("cp,done", [(1, 4), (2, 2)], ids=["dp2", "cp2"])
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_batch(model_dir, one_process, tmp_path, cp, done):
    out = tmp_path / "out"
    # rank 1 is signalled as its first batch starts: every rank finishes that round (dp=2: the
    # cell's batches 1 and 2; cp=2: batch 1, which both ranks run)
    res = _eval(model_dir, out, "term-batch", 1, rank=1, nproc=2, extra=["--cp", str(cp)])
    assert res.returncode != 0 and (out / "PREEMPTED").is_file(), res.stderr[-3000:]
    assert "preempted (SIGTERM): 0 of 6 cells done" in res.stderr  # rank 0 says so, naming rank 1's signal
    assert f"(and {done} of 6 samples of niah_single_1 at 256)" in res.stderr
    cell = _cells(out)["256/niah_single_1.json"]
    assert len(cell["records"]) == done and cell["computed_with"][0]["dp"] == 2 // cp
    res = _eval(model_dir, out, nproc=2, extra=["--cp", str(cp)])
    assert res.returncode == 0, res.stderr[-3000:]
    assert (f"resuming: 0 of 6 cells already done in {out} (and {done} of 6 samples of niah_single_1 at 256)"
            in res.stderr)
    if cp == 1:  # the batches do not depend on dp: the bytes of one process
        assert _outputs(out) == _outputs(one_process)
    else:  # the cp prefill decodes the same tokens
        ours = json.loads((out / "results.json").read_text())["samples"]
        theirs = json.loads((one_process / "results.json").read_text())["samples"]
        assert [r["generated_ids"] for r in ours] == [r["generated_ids"] for r in theirs]
