"""scripts/real_model/zero_shot_table.py on a tiny model: every (variant, phase) is a real `longctx eval`
with the variant's overrides recorded, the table and PNG come from the results, a rerun
reuses every finished cell, a run at other lengths adds to the table, and so do a --part
beside a run and the cells of another OUT (--from), one measurement counted once and two
different ones for one cell refused. The script and its evals run in this process (the script's
logic is the point; its one process boundary, `longctx eval`, is tested as a process elsewhere),
and the script once as a process in test_the_script_runs_as_a_process."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import longctx
from longctx.commands import cli
from longctx.model import build_model, get_preset

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_model" / "zero_shot_table.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("zero_shot_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zero_shot_table = _load_script()


def _eval_in_process(cmd: list[str]) -> int:
    """The script's `python -m longctx eval ...`, run as `longctx eval` in this process: the test is
    about the script's cells and tables (test_eval_cells.py runs `longctx eval` as a process)."""
    assert cmd[1:4] == ["-m", "longctx", "eval"], cmd
    return cli.main(cmd[3:])


def script(*argv: str) -> subprocess.CompletedProcess:
    """The script's main() in this process, its evals too, with what it printed and its exit code."""
    stdout, stderr = io.StringIO(), io.StringIO()
    real_call = zero_shot_table.subprocess.call
    zero_shot_table.subprocess.call = _eval_in_process
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = zero_shot_table.main(list(argv))
    finally:
        zero_shot_table.subprocess.call = real_call
    return subprocess.CompletedProcess(["zero_shot_table.py", *argv], code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("zero_shot")
    longctx.save_pretrained(build_model(get_preset("debug-tiny", max_position_embeddings=512), seed=0).eval(),
                            d / "model")
    (d / "heldout.jsonl").write_text("".join(json.dumps({"text": f"document {i}: " + "word salad " * 120}) + "\n"
                                             for i in range(3)))
    return d


def run(inputs: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return script("--model", str(inputs / "model"), "--ppl-data", str(inputs / "heldout.jsonl"),
                  "--out", str(out), "--variants", "shipped,yarn2", "--ppl-lengths", "128,256", "--ppl-windows", "1",
                  "--ruler-lengths", "256", "--tasks", "passkey", "--samples", "1", "--max-positions", "1024",
                  "--pretrained-length", "512", "--quiet", *extra, "--", "--tokenizer", "byte", "--style", "compact",
                  "--max-new-tokens", "4")


def test_each_variant_is_an_eval_with_its_overrides_and_a_rerun_reuses_the_cells(inputs, tmp_path):
    out = tmp_path / "zs"
    res = run(inputs, out)
    assert res.returncode == 0, res.stderr[-3000:]
    yarn = json.loads((out / "yarn2" / "ppl" / "results.json").read_text())
    assert yarn["meta"]["model_overrides"]["rope_parameters"]["rope_type"] == "yarn"
    assert yarn["meta"]["model_overrides"]["rope_parameters"]["factor"] == 2.0
    assert yarn["meta"]["max_position_embeddings"] == 1024
    shipped = json.loads((out / "shipped" / "ppl" / "results.json").read_text())
    assert "rope_parameters" not in shipped["meta"]["model_overrides"]
    ppl = {v: {r["length"]: r["ppl"] for r in json.loads((out / v / "ppl" / "results.json").read_text())["ppl"]["rows"]}
           for v in ("shipped", "yarn2")}
    assert set(ppl["shipped"]) == set(ppl["yarn2"]) == {128, 256} and ppl["shipped"] != ppl["yarn2"]
    table = (out / "table.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| YaRN x2 |") and "." in line)
    assert f"{ppl['yarn2'][128]:.2f}" in row and f"{ppl['yarn2'][256]:.2f}" in row
    assert any(line.startswith("| RULER") for line in table.splitlines())
    assert (out / "zero_shot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = (out / "yarn2" / "ppl" / "results.json").read_bytes()

    again = run(inputs, out)
    assert again.returncode == 0, again.stderr[-3000:]
    for v in ("shipped", "yarn2"):
        for phase in ("ppl", "ruler"):
            timing = json.loads((out / v / phase / "timing.json").read_text())
            assert timing["cells_computed"] == 0 and timing["cells_reused"] >= 1, (v, phase, timing)
    assert (out / "yarn2" / "ppl" / "results.json").read_bytes() == first

    # another length into the same OUT: its results.json holds only 384; the table keeps 128 and 256
    wider = run(inputs, out, "--phases", "ppl", "--ppl-lengths", "384")
    assert wider.returncode == 0, wider.stderr[-3000:]
    rows = json.loads((out / "yarn2" / "ppl" / "results.json").read_text())["ppl"]["rows"]
    assert [r["length"] for r in rows] == [384]
    lines = (out / "table.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| perplexity"))
    assert header.split("|")[2:5] == [" 128 ", " 256 ", " 384 "], header
    row = next(line for line in lines if line.startswith("| YaRN x2 |"))
    assert f"{ppl['yarn2'][128]:.2f}" in row and f"{rows[0]['ppl']:.2f}" in row

    # a report alone reads no documents: no --ppl-data, the same tables, the documents named from the cells
    alone = script("--model", str(inputs / "model"), "--out", str(out), "--report-only", "--pretrained-length", "512")
    assert alone.returncode == 0, alone.stderr[-3000:]
    reported = (out / "table.md").read_text().splitlines()
    assert reported[1:] == lines[1:]
    assert "perplexity on `heldout.jsonl` (windows per length: 1," in reported[0], reported[0]


def test_as_is_runs_the_model_without_overrides(inputs, tmp_path):
    out = tmp_path / "trained"
    res = run(inputs, out, "--variants", "as-is", "--phases", "ppl", "--ppl-lengths", "128")
    assert res.returncode == 0, res.stderr[-3000:]
    meta = json.loads((out / "as-is" / "ppl" / "results.json").read_text())["meta"]
    assert meta["model_overrides"] == {} and meta["max_position_embeddings"] == 512  # the model's own, not 1024
    assert [d.name for d in out.iterdir() if d.is_dir()] == ["as-is"]
    assert any(line.startswith("| as it is (its own RoPE, no model_overrides) | ")
               for line in (out / "table.md").read_text().splitlines())


def report_only(inputs: Path, out: Path, *sources: Path) -> subprocess.CompletedProcess:
    argv = ["--model", str(inputs / "model"), "--out", str(out), "--report-only", "--pretrained-length", "512"]
    for source in sources:
        argv += ["--from", str(source)]
    return script(*argv)


def per_task_row(out: Path, label: str) -> list:
    """The per-task table's cells of the row whose label starts with `label`."""
    lines = (out / "table.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| per task"))
    row = next(line for line in lines[start:] if line.startswith(f"| {label}"))
    return [c.strip() for c in row.split("|")[2:-1]]


def test_a_part_and_another_out_join_the_table(inputs, tmp_path):
    out, other = tmp_path / "zs", tmp_path / "other"
    ruler = ("--phases", "ruler")
    assert run(inputs, out, *ruler, "--variants", "yarn2").returncode == 0
    # a second yarn2 process beside the first: its own directory and lock, the same table
    part = run(inputs, out, *ruler, "--variants", "yarn2", "--ruler-lengths", "384", "--part", "b")
    assert part.returncode == 0, part.stderr[-3000:]
    assert (out / "yarn2" / "ruler.b" / "cells" / "384" / "passkey.json").is_file()
    assert not (out / "yarn2" / "ruler" / "cells" / "384").exists()
    header = next(line for line in (out / "table.md").read_text().splitlines() if line.startswith("| per task"))
    assert "passkey 256" in header and "passkey 384" in header, header
    assert "-" not in per_task_row(out, "YaRN x2")

    # another OUT's cells join a report, which writes nothing there
    assert run(inputs, other, *ruler, "--variants", "shipped").returncode == 0
    before = sorted(str(p) for p in other.rglob("*"))
    joined = report_only(inputs, out, other)
    assert joined.returncode == 0, joined.stderr[-3000:]
    assert per_task_row(out, "as shipped")[0] != "-"
    assert sorted(str(p) for p in other.rglob("*")) == before

    # the same measurement in two places counts once
    copy = tmp_path / "copy"
    shutil.copytree(out / "yarn2", copy / "yarn2")
    assert report_only(inputs, out, other, copy).returncode == 0
    assert "(samples per task and length: 1)" in (out / "table.md").read_text()

    # two different measurements of one cell (2 samples, not 1): one error line, the table kept
    twice = tmp_path / "twice"
    assert run(inputs, twice, *ruler, "--variants", "yarn2", "--samples", "2").returncode == 0
    table = (out / "table.md").read_bytes()
    refused = report_only(inputs, out, twice)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: --from/--part: yarn2's passkey at 256 is in ") \
        and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (out / "table.md").read_bytes() == table
    # ... and refused before an evaluation runs
    again = run(inputs, out, *ruler, "--variants", "yarn2", "--from", str(twice))
    assert again.returncode == 2 and "[yarn2 ruler]" not in again.stdout, again.stdout


def test_bad_arguments_are_one_line_before_any_eval(inputs, tmp_path):
    for extra, needle in ((["--variants", "yarn9"], "error: --variants: unknown yarn9"),
                          (["--phases", "ppl,train"], "error: --phases"),
                          (["--part", "a/b"], "error: --part: 'a/b'"),
                          (["--from", str(tmp_path / "nowhere")], "error: --from: ")):
        res = run(inputs, tmp_path / "bad", *extra)
        assert res.returncode == 2 and res.stderr.strip().startswith(needle), res.stderr
        assert not (tmp_path / "bad").exists()


def test_the_script_runs_as_a_process(inputs, tmp_path):
    """The script as a user starts it: its own process, each eval a `python -m longctx eval`."""
    out = tmp_path / "zs"
    res = subprocess.run([sys.executable, str(SCRIPT), "--model", str(inputs / "model"), "--out", str(out),
                          "--variants", "as-is", "--phases", "ruler", "--ruler-lengths", "256", "--tasks", "passkey",
                          "--samples", "1", "--pretrained-length", "512", "--quiet", "--", "--tokenizer", "byte",
                          "--style", "compact", "--max-new-tokens", "4"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[as-is ruler] -m longctx eval" in res.stdout
    assert (out / "as-is" / "ruler" / "cells" / "256" / "passkey.json").is_file()
