"""Sources through 🤗 datasets: local jsonl / parquet / text / csv / arrow (save_to_disk) /
directory, streaming and not; filtering by token length; up-sampling by length bucket."""
import csv
from collections import Counter

import datasets
import pytest

from helpers.data import make_texts, rebuild_documents, rows_by_source, write_jsonl, write_parquet
from longctx.data import ByteTokenizer, DataConfig, SourceConfig, UpsampleBucket, build_loader
from longctx.data.documents import DocFraming, DocumentStream, StreamOrder
from longctx.data.sources import open_table

TOK = ByteTokenizer()
TEXTS = make_texts(40, seed=21, min_words=2, max_words=50)


def docs_of(cfg, dp_size=1):
    out = Counter()
    for rank in range(dp_size):
        for rows in rows_by_source(build_loader(cfg, TOK, dp_rank=rank, dp_size=dp_size, seed=0)).values():
            out.update(rebuild_documents(rows, TOK.bos_id, TOK.pad_id))
    return out


def want(texts):
    return Counter(tuple(TOK.encode(t, add_bos=True, add_eos=True)) for t in texts)


def cfg_for(src: SourceConfig, **kw):
    return DataConfig(sources=[src], seq_len=48, micro_batch_size=2, epochs=1, prefetch=0, **kw)


@pytest.mark.parametrize("streaming", [False, True])
def test_jsonl_and_parquet_load_through_datasets(tmp_path, streaming):
    jl = write_jsonl(tmp_path / "a.jsonl", TEXTS[:20], field="content")
    pq = write_parquet(tmp_path / "b.parquet", TEXTS[20:])
    cfg = DataConfig(sources=[SourceConfig(path=jl, text_field="content"), SourceConfig(path=pq)],
                     seq_len=48, micro_batch_size=2, epochs=1, prefetch=0, streaming=streaming)
    table = open_table(cfg.sources[1], 1, cfg, TOK)
    assert table.streaming == streaming
    if not streaming:  # really a 🤗 Dataset underneath (Arrow, memory-mapped)
        assert len(table) == 20
    assert isinstance(datasets.load_dataset("parquet", data_files=pq, split="train"), datasets.Dataset)
    assert docs_of(cfg) == want(TEXTS)


def test_text_csv_and_globs(tmp_path):
    for k, t in enumerate(TEXTS[:6]):
        (tmp_path / f"doc{k}.txt").write_text(t + "\nsecond line\n")
    with open(tmp_path / "c.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["body", "n"])
        for t in TEXTS[6:12]:
            w.writerow([t, 1])
    cfg = DataConfig(sources=[SourceConfig(path=str(tmp_path / "doc*.txt"), sample_by="document"),
                              SourceConfig(path=str(tmp_path / "c.csv"), text_field="body")],
                     seq_len=48, micro_batch_size=2, epochs=1, prefetch=0)
    expect = [t + "\nsecond line\n" for t in TEXTS[:6]] + TEXTS[6:12]
    assert docs_of(cfg) == want(expect)
    cfg.sources[0].sample_by = "line"  # one row per line
    lines = [t for t in TEXTS[:6]] + ["second line"] * 6 + TEXTS[6:12]
    assert docs_of(cfg) == want(lines)


@pytest.mark.parametrize("streaming", [False, True])
def test_save_to_disk_and_directory_sources(tmp_path, streaming):
    datasets.Dataset.from_dict({"text": TEXTS[:15]}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "folder").mkdir()
    write_jsonl(tmp_path / "folder" / "part-0.jsonl", TEXTS[15:25])
    write_jsonl(tmp_path / "folder" / "part-1.jsonl", TEXTS[25:])
    cfg = DataConfig(sources=[SourceConfig(path=str(tmp_path / "saved")), SourceConfig(path=str(tmp_path / "folder"))],
                     seq_len=48, micro_batch_size=2, epochs=1, prefetch=0, streaming=streaming)
    assert docs_of(cfg, dp_size=2) == want(TEXTS)
    cfg.sources[1].kind = "json"  # explicit kind on a directory: its files of that format
    assert docs_of(cfg) == want(TEXTS)


def test_filter_by_token_length(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    src = SourceConfig(path=path, min_tokens=60, max_tokens=200)
    kept = [t for t in TEXTS if 60 <= len(t.encode()) + 2 <= 200]
    assert 5 < len(kept) < len(TEXTS)
    assert docs_of(cfg_for(src)) == want(kept)
    src.streaming = True
    assert docs_of(cfg_for(src)) == want(kept)


def test_upsampling_by_length_bucket(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    src = SourceConfig(path=path, upsample=[UpsampleBucket(min_tokens=0, max_tokens=100, factor=0.0),
                                            UpsampleBucket(min_tokens=100, max_tokens=200, factor=1.0),
                                            UpsampleBucket(min_tokens=200, factor=3.0)])
    got = docs_of(cfg_for(src, shuffle_window=64))
    for t in TEXTS:
        n = len(t.encode()) + 2
        assert got[tuple(TOK.encode(t, add_bos=True, add_eos=True))] == (0 if n < 100 else 1 if n < 200 else 3)


def test_fractional_upsampling_is_seeded_and_close_to_the_factor(tmp_path):
    texts = make_texts(400, seed=5, min_words=2, max_words=4)
    path = write_jsonl(tmp_path / "a.jsonl", texts)
    src = SourceConfig(path=path, upsample=[UpsampleBucket(factor=1.5)])
    a, b = docs_of(cfg_for(src)), docs_of(cfg_for(src))
    assert a == b
    total = sum(a.values())
    assert 540 <= total <= 660  # 400 * 1.5 = 600
    assert set(a.values()) == {1, 2}


def test_document_stream_windows_shuffle_within_and_reproduce(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    cfg = cfg_for(SourceConfig(path=path), shuffle_window=10)
    table = open_table(cfg.sources[0], 0, cfg, TOK)

    def stream(shuffle):
        return DocumentStream(table, cfg.sources[0], 0, TOK,
                              StreamOrder(seed=1, dp_rank=0, dp_size=1, window=10, shuffle=shuffle, epochs=2),
                              DocFraming(add_bos=True, add_eos=True, answer_mask=False))

    s = stream(False)
    first = [TOK.decode(s.next_doc().tokens) for _ in range(40)]
    assert first == TEXTS  # no shuffle: file order
    second = [TOK.decode(s.next_doc().tokens) for _ in range(40)]
    assert second == TEXTS and s.next_doc() is None  # finite: two epochs then the end
    s = stream(True)
    ep0 = [TOK.decode(s.next_doc().tokens) for _ in range(40)]
    ep1 = [TOK.decode(s.next_doc().tokens) for _ in range(40)]
    assert sorted(ep0) == sorted(TEXTS) == sorted(ep1) and ep0 != TEXTS and ep0 != ep1
