"""Resume with edited data: stopped naming the file, or continued when the user says so."""
import os

from helpers.data import make_texts, write_jsonl
from helpers.train import TINY, metrics, run_train


def test_a_same_size_same_mtime_edit_stops_the_resume_unless_allowed(tmp_path):
    data = tmp_path / "docs.jsonl"
    write_jsonl(data, make_texts(60, seed=1, min_words=20, max_words=80))
    out = tmp_path / "run"
    common = [*TINY, f"out_dir={out}", "data.seq_len=128", f"data.sources=[{{path: {data}}}]", "checkpoint.every=2"]
    first = run_train(1, [*common, "train.steps=2"])
    assert first.returncode == 0, first.stderr[-3000:]
    stat = os.stat(data)
    text = data.read_text()
    data.write_text(text.replace("a", "b"))  # every row changed, same size
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as cp -p / rsync -t leave it
    assert os.stat(data).st_size == stat.st_size
    refused = run_train(1, [*common, "train.steps=4", "checkpoint.resume=auto"])
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "changed since the checkpoint" in lines[0], lines
    assert "data.allow_changed_sources=true" in lines[0]
    assert [r["step"] for r in metrics(out)] == [1, 2]
    allowed = run_train(1, [*common, "train.steps=4", "checkpoint.resume=auto", "data.allow_changed_sources=true"])
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "its order restarts from the beginning" in allowed.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]
