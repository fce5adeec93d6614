"""benchmarks/bench_doc_attention.py: dense-mask SDPA against one SDPA call per document, with
the two paths' agreement stated on every row."""
from __future__ import annotations

import json

import bench_doc_attention
import pytest


def test_rows_agree_and_cover_every_length_and_document_count(tmp_path, capsys):
    out = tmp_path / "doc.json"
    assert bench_doc_attention.main(["--device", "cpu", "--dtype", "float32", "--lengths", "64,96",
                                     "--docs", "1,5", "--batch", "2", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [(r["tokens"], r["docs"]) for r in rows] == [(64, 1), (64, 5), (96, 1), (96, 5)]
    for r in rows:
        assert r["max_abs_diff"] < 1e-5  # fp32: the two paths compute the same attention
        assert r["dense mask s"] > 0 and r["document runs s"] > 0
        assert r["speedup"] == r["dense mask s"] / r["document runs s"]
    assert report["device"] == "cpu" and "machine" in report
    assert "| 96 | 5 |" in capsys.readouterr().out


def test_document_ids_are_contiguous_runs():
    ids = bench_doc_attention.document_ids(3, 50, 7, seed=1)
    for row in ids:
        assert row[0] == 0 and row[-1] == 6
        assert bool(((row[1:] - row[:-1]) >= 0).all()) and int((row[1:] != row[:-1]).sum()) == 6


@pytest.mark.parametrize("argv, message", [
    (["--docs", "0"], "error: --docs: '0'; use comma-separated integers >= 1"),
    (["--lengths", "1"], "error: --lengths: '1'; use comma-separated integers >= 2"),
    (["--heads", "9,2"], "error: --heads: '9,2'; use QUERY,KV with KV dividing QUERY, e.g. 9,3"),
    (["--lengths", "8", "--docs", "9"], "error: --docs: 9 documents do not fit in 8 tokens"),
    (["--repeats", "0"], "error: --batch, --head-dim, --repeats: must be >= 1"),
])
def test_bad_input_is_one_error_line(argv, message, capsys):
    assert bench_doc_attention.main(["--device", "cpu", *argv]) == 2
    assert capsys.readouterr().err.strip() == message
