"""Source fingerprints: every edit is seen (also one that keeps size and modification time), an
unchanged file is not hashed again, and a comparison names the file and what changed."""
import json
import os
import shutil

import pytest

from helpers.data import make_texts, write_jsonl
from longctx.base.errors import UserError
from longctx.data import DataConfig, SourceConfig, SyntheticConfig
from longctx.data import fingerprint as fp
from longctx.data.fingerprint import changed_sources, compare_sources, fingerprint_sources
from longctx.storage.atomic import human_size

TEXTS = make_texts(50, seed=3)


@pytest.fixture(autouse=True)
def private_memo(tmp_path, monkeypatch):
    """Digests remembered under this test's own cache home, and none from earlier tests."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(fp, "_MEMO", {})


def edit_in_place(path, old: bytes, new: bytes):
    """Replace bytes with as many others and put the modification time back (as `cp -p` does)."""
    st = os.stat(path)
    data = open(path, "rb").read()
    assert len(old) == len(new) and old in data
    with open(path, "r+b") as f:
        f.write(data.replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def count_full_hashes(monkeypatch):
    calls = []
    real = fp._full_digest

    def spy(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(fp, "_full_digest", spy)
    return calls


def test_same_size_same_mtime_edit_changes_the_digest(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    before = fp.file_digest(path)
    edit_in_place(path, b"doc7:", b"DOC7:")
    assert fp.file_digest(path) != before
    fp._MEMO.clear()  # as a new process would see it
    assert fp.file_digest(path) != before


def test_an_unchanged_file_is_hashed_once_across_processes(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    calls = count_full_hashes(monkeypatch)
    first = fp.file_digest(path)
    fp._MEMO.clear()  # a new process: only the remembered digest on disk
    assert fp.file_digest(path) == first and len(calls) == 1
    os.utime(path)  # touch: the status-change time moves, the content is the same
    assert fp.file_digest(path) == first and len(calls) == 2


def test_a_remembered_digest_is_checked_against_sampled_blocks(tmp_path, monkeypatch):
    """A file system that keeps no faithful status-change time (nor inode or mtime): the memo
    alone would return the old digest; the sampled blocks differ, so the file is hashed again."""
    monkeypatch.setattr(fp, "_identity", lambda st: (st.st_size,))
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    calls = count_full_hashes(monkeypatch)
    first = fp.file_digest(path)
    fp._MEMO.clear()
    assert fp.file_digest(path) == first and len(calls) == 1  # remembered
    edit_in_place(path, b"doc0:", b"DOC0:")  # the first block, always sampled
    assert fp.file_digest(path) != first and len(calls) == 2


def test_fingerprints_are_json_and_stable(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    cfg = DataConfig(sources=[SourceConfig(path=path), SourceConfig(kind="synthetic"),
                              SourceConfig(hub_name="org/name", hub_config="en")])
    fps = fingerprint_sources(cfg)
    assert json.loads(json.dumps(fps)) == fps == fingerprint_sources(cfg)
    (f,) = fps[0]["files"]
    assert f["path"] == os.path.abspath(path) and f["size"] == os.path.getsize(path)
    assert len(f["sha256"]) == 64 and fps[2]["hub"] == {"name": "org/name", "config": "en", "split": "train"}
    assert compare_sources(fps, fingerprint_sources(cfg), allow_changed=False) == []


def changed_message(saved, current):
    with pytest.raises(UserError) as e:
        compare_sources(saved, current, allow_changed=False)
    msg = str(e.value)
    assert "\n" not in msg and "data.allow_changed_sources=true" in msg
    return msg


def test_each_kind_of_change_is_named(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    cfg = DataConfig(sources=[SourceConfig(kind="synthetic"), SourceConfig(path=path)])
    saved = fingerprint_sources(cfg)
    size = os.path.getsize(path)

    edit_in_place(path, b"doc9:", b"DOC9:")
    msg = changed_message(saved, fingerprint_sources(cfg))
    assert msg.startswith(f"data.sources[1] changed since the checkpoint: {os.path.abspath(path)}: content changed "
                          "(same size and modification time)")

    write_jsonl(path, TEXTS[:-1])  # truncated
    msg = changed_message(saved, fingerprint_sources(cfg))
    assert f"{os.path.abspath(path)}: size {human_size(size)} -> {human_size(os.path.getsize(path))}" in msg

    write_jsonl(path, TEXTS)
    with open(path, "a") as f:  # one byte more: the same size when rounded, so in bytes
        f.write("\n")
    assert f"size {size} bytes -> {size + 1} bytes" in changed_message(saved, fingerprint_sources(cfg))

    os.remove(path)
    cfg_missing = DataConfig(sources=[SourceConfig(kind="synthetic"), SourceConfig(path=str(tmp_path / "*.jsonl"))])
    assert f"{os.path.abspath(path)} is missing" in changed_message(saved, fingerprint_sources(cfg_missing))

    changed_synthetic = DataConfig(sources=[SourceConfig(kind="synthetic", synthetic=SyntheticConfig(num_docs=7)),
                                            cfg.sources[1]])
    write_jsonl(path, TEXTS)
    assert "data.sources[0] changed since the checkpoint: its synthetic settings changed" in changed_message(
        saved, fingerprint_sources(changed_synthetic))


def test_files_added_to_a_glob_or_directory(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    write_jsonl(d / "part-0.jsonl", TEXTS[:20])
    for where in (str(d), str(d / "*.jsonl")):
        cfg = DataConfig(sources=[SourceConfig(path=where, kind="json")])
        saved = fingerprint_sources(cfg)
        write_jsonl(d / "part-1.jsonl", TEXTS[20:])
        assert f"{d / 'part-1.jsonl'} was added" in changed_message(saved, fingerprint_sources(cfg))
        os.remove(d / "part-1.jsonl")


def test_moved_data_with_the_same_content_is_the_same_source(tmp_path):
    (tmp_path / "old").mkdir()
    write_jsonl(tmp_path / "old" / "a.jsonl", TEXTS)
    saved = fingerprint_sources(DataConfig(sources=[SourceConfig(path=str(tmp_path / "old" / "a.jsonl"))]))
    shutil.move(tmp_path / "old", tmp_path / "new")
    current = fingerprint_sources(DataConfig(sources=[SourceConfig(path=str(tmp_path / "new" / "a.jsonl"))]))
    assert changed_sources(saved, current) == {}


def test_allowed_changes_are_warnings_and_name_the_sources(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    b = write_jsonl(tmp_path / "b.jsonl", TEXTS[:10])
    cfg = DataConfig(sources=[SourceConfig(path=a), SourceConfig(path=b)])
    saved = fingerprint_sources(cfg)
    edit_in_place(b, b"doc1:", b"DOC1:")
    current = fingerprint_sources(cfg)
    assert set(changed_sources(saved, current)) == {1}
    (line,) = compare_sources(saved, current, allow_changed=True)
    assert line.startswith("data.sources[1] changed since the checkpoint:") and "order restarts" in line


def test_a_different_number_of_sources_is_refused_even_when_changes_are_allowed(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    saved = fingerprint_sources(DataConfig(sources=[SourceConfig(path=a)]))
    current = fingerprint_sources(DataConfig(sources=[SourceConfig(path=a), SourceConfig(kind="synthetic")]))
    with pytest.raises(UserError, match=r"^data.sources: the checkpoint was trained on 1 sources, this run has 2"):
        compare_sources(saved, current, allow_changed=True)


def test_sizes_read_in_their_unit():
    assert [human_size(n) for n in (512, 1536, 5 * 2**20 + 2**19, 3 * 2**30)] == [
        "512 bytes", "1.5 KiB", "5.5 MiB", "3.0 GiB"]


def test_allow_changed_sources_is_a_checked_data_field():
    DataConfig(allow_changed_sources=True).validate()
    with pytest.raises(UserError, match="data.allow_changed_sources: must be true or false"):
        DataConfig(allow_changed_sources="yes").validate()
