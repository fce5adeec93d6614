"""Caches are keyed by content: after an edit that keeps every file's size and modification time
(`cp -p`, `rsync -t`), a new loader reads the new rows (🤗 datasets' cache and data.cache_dir).
A changed source restarts its seeded order on resume; the other sources continue exactly."""
import os

import datasets
import numpy as np
import pytest

from helpers.data import collect, make_texts, write_jsonl
from longctx.base.errors import UserError
from longctx.data import ByteTokenizer, DataConfig, SourceConfig, build_loader
from longctx.data import fingerprint as fp

TOK = ByteTokenizer()


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(fp, "_MEMO", {})


def same_size_same_mtime_copy(src_path, dst_path):
    """`cp -p src dst` over an existing dst: new bytes, dst's size and modification time kept."""
    st = os.stat(dst_path)
    data = open(src_path, "rb").read()
    assert len(data) == st.st_size
    with open(dst_path, "r+b") as f:
        f.write(data)
    os.utime(dst_path, ns=(st.st_atime_ns, st.st_mtime_ns))


def texts_of(batches):
    return b"".join(bytes(b["input_ids"][r][b["input_ids"][r] < 256].astype(np.uint8))
                    for b in batches for r in range(b["input_ids"].shape[0])).decode("utf-8", "replace")


def corpus(tmp_path, tag):
    """A file whose rows all say `tag` (three letters, so every version has the same size)."""
    return write_jsonl(tmp_path / f"{tag}.jsonl", make_texts(40, seed=5, tag=tag))


@pytest.mark.parametrize("cache_dir", [False, True])
def test_an_edit_with_the_same_size_and_mtime_is_read(tmp_path, cache_dir):
    path = corpus(tmp_path, "old")
    new = corpus(tmp_path, "new")
    cfg = DataConfig(sources=[SourceConfig(path=path)], seq_len=64, micro_batch_size=4, prefetch=0,
                     hf_cache_dir=str(tmp_path / "hf"), cache_dir=str(tmp_path / "packed") if cache_dir else None,
                     progress=False)
    before = texts_of(collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0), 3))
    assert "old" in before and "new" not in before
    same_size_same_mtime_copy(new, path)
    after = texts_of(collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0), 3))
    assert "new" in after and "old" not in after


def test_datasets_own_cache_would_serve_the_old_rows(tmp_path):
    """Why the content key exists: 🤗 keys its cache by path and modification time only."""
    path = corpus(tmp_path, "old")
    hf = str(tmp_path / "hf-plain")
    first = datasets.load_dataset("json", data_files=[path], split="train", cache_dir=hf)["text"][0]
    same_size_same_mtime_copy(corpus(tmp_path, "new"), path)
    assert datasets.load_dataset("json", data_files=[path], split="train", cache_dir=hf)["text"][0] == first


def two_source_config(tmp_path, a, b, cached):
    return DataConfig(sources=[SourceConfig(name="a", path=a, weight=1.0), SourceConfig(name="b", path=b, weight=1.0)],
                      seq_len=48, micro_batch_size=3, prefetch=0, hf_cache_dir=str(tmp_path / "hf"), progress=False,
                      cache_dir=str(tmp_path / "packed") if cached else None)


def rows(loader, n):
    out = []
    for _ in range(n):
        i, row = loader.next_row()
        out.append((i, row.input_ids.copy()))
    return out


@pytest.mark.parametrize("cached", [False, True])
def test_a_restarted_source_starts_its_order_over_and_the_others_continue(tmp_path, cached):
    a = write_jsonl(tmp_path / "a.jsonl", make_texts(60, seed=1, tag="aaa"))
    b = corpus(tmp_path, "old")
    cfg = two_source_config(tmp_path, a, b, cached)
    first = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=7)
    collect(first, 4)
    state = first.state_dict()
    uninterrupted = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=7)
    uninterrupted.load_state_dict(state)
    expected = rows(uninterrupted, 30)

    same_size_same_mtime_copy(corpus(tmp_path, "new"), b)
    resumed = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=7)
    resumed.load_state_dict(state, restart_sources={1})
    got = rows(resumed, 30)
    fresh = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=7)
    fresh_b = [r for i, r in rows(fresh, 80) if i == 1]

    assert [i for i, _ in got] == [i for i, _ in expected]  # the mixture continues
    for (i, r), (_, e) in zip(got, expected):
        if i == 0:
            np.testing.assert_array_equal(r, e)  # source a where it was
    got_b = [r for i, r in got if i == 1]
    assert got_b and len(fresh_b) >= len(got_b)
    for r, e in zip(got_b, fresh_b):
        np.testing.assert_array_equal(r, e)  # source b from the start of its seeded order, new content
    assert "new" in texts_of([{"input_ids": np.stack(got_b)}])


def test_without_restart_a_changed_cached_source_is_refused(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_texts(60, seed=1, tag="aaa"))
    b = corpus(tmp_path, "old")
    cfg = two_source_config(tmp_path, a, b, cached=True)
    first = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=7)
    collect(first, 2)
    state = first.state_dict()
    same_size_same_mtime_copy(corpus(tmp_path, "new"), b)
    with pytest.raises(UserError, match=r"data.sources\[1\]: the checkpoint's data came from cache b-"):
        build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=7).load_state_dict(state)


def test_restart_sources_must_name_sources(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_texts(20, seed=1))
    loader = build_loader(DataConfig(sources=[SourceConfig(path=a)], prefetch=0), TOK, dp_rank=0, dp_size=1, seed=0)
    with pytest.raises(ValueError, match=r"restart_sources: \[3\]"):
        loader.load_state_dict(loader.state_dict(), restart_sources={3})
