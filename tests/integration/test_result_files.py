"""Result files (results.json, report.md, PNGs, RULER's jsonl and summary.csv, the demo's
summary.json/report.md, a trained tokenizer.json) are whole or absent: an earlier complete
file survives a SIGKILL during the next write byte for byte, and a full disk is one line."""
import errno
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.train import env
from longctx.base.errors import UserError
from longctx.eval import plots, report, ruler_format

# Writes results.json through report.write_results with a payload of many samples, after
# wrapping the byte write of any temporary sibling of results.json to stop half-way: it writes
# the first half, flushes, announces it and waits to be killed.
DRIVER = textwrap.dedent("""
    import pathlib, sys, time
    from longctx.eval import report

    real_write_bytes = pathlib.Path.write_bytes
    def write_bytes(self, data):
        if not self.name.startswith(".results.json.tmp-"):
            return real_write_bytes(self, data)
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
        print("half written", flush=True)
        time.sleep(600)
    pathlib.Path.write_bytes = write_bytes
    records = [{"task": "passkey", "target_length": 256, "index": i, "prediction": "x" * 1000, "score": 0.0}
               for i in range(2000)]
    report.write_results(pathlib.Path(sys.argv[1]), {"model": "m"}, {"average": 0.0}, records, None, [], [])
""")


def _wait_for(proc, line, timeout=120):
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while sel.select(timeout):
        got = proc.stdout.readline()
        if not got or got.strip() == line:
            if got:
                return
            break
    proc.kill()
    raise AssertionError(f"the writer never reached {line!r}: {proc.stderr.read()[-3000:]}")


def test_an_earlier_results_json_survives_a_sigkill_during_the_next_write(tmp_path, capsys):
    path = tmp_path / "results.json"
    report.write_results(path, {"model": "first"}, {"average": 50.0}, [], None, [], [])
    before = path.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env())
    _wait_for(proc, "half written")
    (temp,) = [p for p in tmp_path.iterdir() if p.name.startswith(".results.json.tmp-")]
    assert temp.stat().st_size > 1_000_000  # the kill lands with a megabyte of the new file on disk
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert path.read_bytes() == before
    report.write_results(path, {"model": "third"}, {}, [], None, [], [])  # the next writer clears the temporary
    assert capsys.readouterr().err == (f"note: removed {temp}, left by pid {proc.pid} on {socket.gethostname()}, "
                                       "which is no longer running\n")
    assert _only(tmp_path) == ["results.json"] and json.loads(path.read_text())["meta"] == {"model": "third"}


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _assert_full_disk_line(info, path):
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cannot write {path}: the disk (or quota) is full"), message


def _only(directory):
    return sorted(p.name for p in directory.iterdir())


def test_results_and_markdown_on_a_full_disk_keep_the_old_files(tmp_path, monkeypatch):
    results, md = tmp_path / "results.json", tmp_path / "report.md"
    report.write_results(results, {"model": "first"}, {}, [], None, [], [])
    report.write_markdown(md, "# first\n")
    monkeypatch.setattr(Path, "write_bytes", _full_disk)
    with pytest.raises(UserError) as info:
        report.write_results(results, {"model": "second"}, {}, [], None, [], [])
    _assert_full_disk_line(info, results)
    with pytest.raises(UserError) as info:
        report.write_markdown(md, "# second\n")
    _assert_full_disk_line(info, md)
    monkeypatch.undo()
    assert json.loads(results.read_text())["meta"] == {"model": "first"} and md.read_text() == "# first\n"
    assert _only(tmp_path) == ["report.md", "results.json"]


def test_figures_are_png_written_whole(tmp_path, monkeypatch):
    summary = {"tasks": {"passkey": {"scores": {"256": 100.0, "512": 50.0}}}, "average_by_length": {"256": 100.0,
               "512": 50.0}, "threshold": 85.0}
    path = plots.score_curves(summary, tmp_path / "scores_vs_length.png", max_position=512)
    first = path.read_bytes()
    assert first.startswith(b"\x89PNG\r\n\x1a\n")
    grid = {"depths": [0.0, 0.5], "lengths": [256, 512], "scores": [[100.0, None], [0.0, 50.0]]}
    assert plots.needle_heatmap(grid, tmp_path / "heatmap.png").read_bytes().startswith(b"\x89PNG")
    ppl = {"rows": [{"length": 256, "ppl": 3.0}, {"length": 512, "ppl": 4.0}]}
    assert plots.ppl_curve(ppl, tmp_path / "ppl.png").read_bytes().startswith(b"\x89PNG")

    import matplotlib.figure

    def half_then_full(self, fname, **kwargs):  # a PNG cut off by a full disk
        Path(fname).write_bytes(b"\x89PNG\r\n\x1a\n partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fname))
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_then_full)
    with pytest.raises(UserError) as info:
        plots.score_curves(summary, path)
    assert "the disk (or quota) is full" in str(info.value)
    assert path.read_bytes() == first and _only(tmp_path) == ["heatmap.png", "ppl.png", "scores_vs_length.png"]


def test_ruler_predictions_and_summary_csv_are_whole(tmp_path, monkeypatch):
    jsonl = tmp_path / "4096" / "pred" / "niah_single_1.jsonl"
    ruler_format._write_jsonl(jsonl, [{"index": 0, "pred": "é"}])
    assert jsonl.read_text() == '{"index": 0, "pred": "\\u00e9"}\n'  # RULER's json.dumps defaults
    folder = jsonl.parent
    csv_path = ruler_format.write_summary_csv(folder, {"niah_single_1": (100.0, "0/1"), "vt": (50.0, "1/2")})
    assert csv_path.read_text() == "0,1,2\nTasks,niah_single_1,vt\nScore,100.0,50.0\nNulls,0/1,1/2\n"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setattr(Path, "write_bytes", _full_disk)
    with pytest.raises(UserError) as info:
        ruler_format._write_jsonl(jsonl, [{"index": 1}])
    _assert_full_disk_line(info, jsonl)
    monkeypatch.undo()
    import builtins
    real_open = builtins.open

    def open_full(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        if "w" in mode and Path(file).name.startswith(".summary.csv.tmp-"):
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return f
    monkeypatch.setattr(builtins, "open", open_full)
    with pytest.raises(UserError) as info:
        ruler_format.write_summary_csv(folder, {"niah_single_1": (0.0, "1/1"), "vt": (0.0, "2/2")})
    monkeypatch.undo()
    _assert_full_disk_line(info, csv_path)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_trained_tokenizer_json_is_whole(tmp_path, monkeypatch):
    from tokenizers import Tokenizer

    from longctx.data.bpe import train_bpe

    texts = [f"line {i} with some words and 1234567" for i in range(200)]
    path = train_bpe(texts, 300, tmp_path / "tok")
    first = path.read_bytes()
    assert json.loads(first)["model"]["type"] == "BPE" and _only(tmp_path / "tok") == ["tokenizer.json"]

    def save_full(self, file, *a, **k):
        Path(file).write_text('{"trunc')
        raise Exception("No space left on device (os error 28)")  # as the Rust library reports it
    monkeypatch.setattr(Tokenizer, "save", save_full)
    with pytest.raises(UserError) as info:
        train_bpe(texts, 300, tmp_path / "tok")
    _assert_full_disk_line(info, path)
    assert path.read_bytes() == first and _only(tmp_path / "tok") == ["tokenizer.json"]


def test_the_demo_report_files_are_whole(tmp_path, monkeypatch):
    from longctx.demo import report as demo_report
    from longctx.demo.config import EVAL_TASKS, FAST

    table = {task: {L: 50.0 for L in FAST.lengths} for task in [*EVAL_TASKS, "average"]}
    path = demo_report.write_report(tmp_path, FAST, 0, {"a": table, "c": table}, {"train": 1.0},
                                    {"parameters": 1000, "findings": []})
    assert path == tmp_path / "report.md" and path.read_text().startswith("# longctx demo")
    assert _only(tmp_path) == ["accuracy_vs_length.png", "report.md", "summary.json"]
    before = {name: (tmp_path / name).read_bytes() for name in ("report.md", "summary.json")}
    monkeypatch.setattr(Path, "write_bytes", _full_disk)
    with pytest.raises(UserError) as info:
        demo_report.write_report(tmp_path, FAST, 1, {"a": table}, {"train": 2.0}, {"parameters": 1000})
    _assert_full_disk_line(info, tmp_path / "summary.json")
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert (tmp_path / "accuracy_vs_length.png").read_bytes().startswith(b"\x89PNG")  # the new figure, whole
    assert _only(tmp_path) == ["accuracy_vs_length.png", "report.md", "summary.json"]
