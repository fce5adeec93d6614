"""benchmarks/bench_doc_attention.py: every document-attention kernel that runs here against an
fp32 reference, the ones that cannot run named, `auto`'s choice and its ratio to the fastest."""
from __future__ import annotations

import json

import bench_doc_attention
import pytest

ON_CPU = ("dense mask", "document runs", "per document", "auto")


def run(tmp_path, *argv) -> dict:
    out = tmp_path / "doc.json"
    assert bench_doc_attention.main(["--device", "cpu", "--dtype", "float32", "--repeats", "1", "--warmup", "0",
                                     "--out", str(out), *argv]) == 0
    return json.loads(out.read_text())


def test_rows_are_exact_and_cover_every_case_and_shape(tmp_path, capsys):
    report = run(tmp_path, "--cases", "64:1/5,96:3", "--shapes", "4/2x16,2/1x8", "--batch", "2")
    rows = report["rows"]
    assert [(r["heads"], r["head_dim"], r["tokens"], r["docs"]) for r in rows] == [
        ([4, 2], 16, 64, 1), ([4, 2], 16, 64, 5), ([4, 2], 16, 96, 3),
        ([2, 1], 8, 64, 1), ([2, 1], 8, 64, 5), ([2, 1], 8, 96, 3)]
    for r in rows:
        m = r["methods"]
        for name in ON_CPU:  # fp32: every path computes the reference's attention
            assert m[name]["err_out"] < 1e-5 and m[name]["err_grad"] < 1e-5 and m[name]["ms"] > 0, name
        for name in ("torch varlen", "flash-attn 2", "FA4", "flex"):
            assert m[name] == {"error": "unavailable: no CUDA device"}
        floor = m["causal floor"]
        assert floor["exact"] == (r["docs"] == 1)
        if r["docs"] > 1:  # the floor ignores the documents: far from the reference
            assert floor["err_out"] > 1e-2
        assert r["auto_method"] == "sdpa"
        others = [m[name]["ms"] for name in ("dense mask", "document runs", "per document")]
        if r["docs"] == 1:
            others.append(floor["ms"])
        assert r["auto_over_fastest"] == pytest.approx(m["auto"]["ms"] / min(others))
    assert report["device"] == "cpu" and "machine" in report
    table = capsys.readouterr().out.split("\n| heads × dim |")[1]  # the table comes last
    assert "| 2/1×8 | 96 | 3 |" in table and "| sdpa |" in table


def test_dense_mask_is_skipped_above_its_limit_and_a_failing_kernel_is_a_row_entry(tmp_path, monkeypatch):
    real = bench_doc_attention.contenders

    def with_a_broken_kernel(ids, device, dense_max_len):
        found = real(ids, device, dense_max_len)
        found["flex"] = lambda q, k, v: (_ for _ in ()).throw(RuntimeError("out of memory\nmore lines"))
        return found

    monkeypatch.setattr(bench_doc_attention, "contenders", with_a_broken_kernel)
    rows = run(tmp_path, "--lengths", "48,80", "--docs", "2", "--dense-max-len", "64")["rows"]
    assert "ms" in rows[0]["methods"]["dense mask"]
    assert rows[1]["methods"]["dense mask"] == {"error": "skipped: T > --dense-max-len 64"}
    assert all(r["methods"]["flex"] == {"error": "RuntimeError: out of memory"} for r in rows)
    assert all("auto_over_fastest" in r for r in rows)


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
    (["--warmup", "-1"], "error: --warmup: must be >= 0"),
    (["--cases", "32768"], "error: --cases: '32768'; use TOKENS:DOCS/DOCS,... e.g. 32768:1/16/64,131072:16"),
    (["--shapes", "9/2x64"], "error: --shapes: '9/2x64'; use QUERY/KVxDIM,... with KV dividing QUERY, "
                             "e.g. 9/3x64,32/8x128"),
])
def test_bad_input_is_one_error_line(argv, message, capsys):
    assert bench_doc_attention.main(["--device", "cpu", *argv]) == 2
    assert capsys.readouterr().err.strip() == message
