"""A bad row anywhere in a source is one UserError line naming the file and the row, raised when
the source is opened (so check_data raises it before a run directory exists), for map-style and
streaming sources alike."""
import gzip
import json
import os

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.data import make_texts, train_bpe
from longctx.base.errors import UserError
from longctx.data import ByteTokenizer, DataConfig, SourceConfig, build_loader, check_data
from longctx.data import check as check_mod
from longctx.data import fingerprint as fp

TOK = ByteTokenizer()
TEXTS = make_texts(300, seed=11)


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(fp, "_MEMO", {})


def jsonl_with(tmp_path, name, row151: bytes, blank_first=False) -> str:
    """300 good JSON lines, the 151st replaced by `row151`."""
    lines = [json.dumps({"text": t}).encode() for t in TEXTS]
    lines[150] = row151
    path = tmp_path / name
    path.write_bytes((b"\n" if blank_first else b"") + b"\n".join(lines) + b"\n")
    return str(path)


def error_of(cfg, via) -> str:
    with pytest.raises(UserError) as e:
        if via == "check_data":
            check_data(cfg)
        else:
            next(iter(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def config(path, streaming=False, **src):
    return DataConfig(sources=[SourceConfig(path=path, **src)], prefetch=0, streaming=streaming,
                      shuffle_window=512)


VIAS = [("check_data", False), ("loader", False), ("check_data", True), ("loader", True)]


@pytest.mark.parametrize("via,streaming", VIAS)
def test_a_non_utf8_row_after_the_first(tmp_path, via, streaming):
    path = jsonl_with(tmp_path, "a.jsonl", b'{"text": "caf\xe9"}')
    assert error_of(config(path, streaming), via) == (f"data.sources[0]: {path} row 151: "
                                                      "not UTF-8 (byte 0xe9 at column 14)")


@pytest.mark.parametrize("via,streaming", VIAS)
def test_a_text_field_holding_an_int(tmp_path, via, streaming):
    path = jsonl_with(tmp_path, "a.jsonl", b'{"text": 12}')
    assert error_of(config(path, streaming), via) == (f"data.sources[0].text_field: {path} row 151: "
                                                      "'text' holds int, not text")


@pytest.mark.parametrize("via", ["check_data", "loader"])
def test_a_text_field_of_numbers_only(tmp_path, via):
    path = tmp_path / "n.jsonl"
    path.write_text("".join(json.dumps({"text": k}) + "\n" for k in range(20)))
    assert error_of(config(str(path)), via) == f"data.sources[0].text_field: {path} row 1: 'text' holds int, not text"


@pytest.mark.parametrize("via,streaming", VIAS)
def test_broken_json_at_row_151(tmp_path, via, streaming):
    path = jsonl_with(tmp_path, "a.jsonl", b'{"text": "unterminated}')
    assert error_of(config(path, streaming), via) == (
        f"data.sources[0]: {path} row 151: not valid JSON (Unterminated string starting at at column 10)"
        .replace("at at", "at"))


def test_rows_and_lines_are_both_named_when_they_differ(tmp_path):
    path = jsonl_with(tmp_path, "a.jsonl", b'{"text": 12}', blank_first=True)
    assert error_of(config(path), "check_data").endswith(f"{path} row 151 (line 152): 'text' holds int, not text")


def test_a_non_utf8_line_of_a_text_file(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"fine line\n" * 4 + b"caf\xe9\n" + b"more\n")
    assert error_of(config(str(path), sample_by="line"), "check_data") == (
        f"data.sources[0]: {path} line 5: not UTF-8 (byte 0xe9 at column 4)")


def test_a_csv_column_of_numbers(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("body,id\n" + "".join(f"{k},{k}\n" for k in range(10)))
    assert error_of(config(str(path), text_field="body"), "check_data") == (
        f"data.sources[0].text_field: {path} row 1: 'body' holds int, not text")


def test_a_parquet_column_of_numbers(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": list(range(10))}), str(path))
    assert error_of(config(str(path)), "check_data") == (
        f"data.sources[0].text_field: {path} row 1: 'text' holds int, not text")


def test_a_truncated_gzip_names_the_file_and_cause(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    whole = gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in TEXTS).encode())
    path.write_bytes(whole[: len(whole) // 2])
    msg = error_of(config(str(path)), "check_data")
    assert msg.startswith(f"data.sources[0]: {path}: cannot be read (EOFError:")


def test_a_vague_datasets_error_gives_its_cause(tmp_path, monkeypatch):
    """When no row is to blame, the innermost cause (not 'An error occurred while generating')."""
    path = jsonl_with(tmp_path, "a.jsonl", json.dumps({"text": "fine"}).encode())

    def fail(*a, **k):
        try:
            raise ValueError("the real cause")
        except ValueError as e:
            raise datasets.exceptions.DatasetGenerationError("An error occurred while generating the dataset") from e

    monkeypatch.setattr(datasets, "load_dataset", fail)
    assert error_of(config(path), "check_data") == f"data.sources[0]: cannot load {path} (ValueError: the real cause)"


def test_a_tokenizer_directory_with_only_its_config(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    cfg = DataConfig(tokenizer=str(d))
    msg = error_of(cfg, "check_data")
    assert msg.startswith(f"data.tokenizer: {d} has no tokenizer.json or other vocabulary file (found: "
                          "tokenizer_config.json); a tokenizer directory needs tokenizer.json")
    train_bpe(d)  # with a vocabulary it loads
    check_data(cfg)


def arrow_files(root):
    return sorted(os.path.join(r, f) for r, _, names in os.walk(root) for f in names if f.endswith(".arrow"))


def test_check_data_passes_good_sources_and_warms_the_loader(tmp_path):
    path = jsonl_with(tmp_path, "a.jsonl", json.dumps({"text": "fine"}).encode())
    cfg = DataConfig(sources=[SourceConfig(path=path), SourceConfig(kind="synthetic")], prefetch=0,
                     hf_cache_dir=str(tmp_path / "hf"))
    check_data(cfg)
    warmed = arrow_files(tmp_path / "hf")
    assert len(warmed) == 1 and "longctx-content" in warmed[0]
    next(iter(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)))
    assert arrow_files(tmp_path / "hf") == warmed  # the loader read what check_data prepared


def test_check_data_skips_a_built_packed_cache(tmp_path, monkeypatch):
    path = jsonl_with(tmp_path, "a.jsonl", json.dumps({"text": "fine"}).encode())
    cfg = DataConfig(sources=[SourceConfig(path=path)], prefetch=0, cache_dir=str(tmp_path / "packed"),
                     progress=False, hf_cache_dir=str(tmp_path / "hf"))
    next(iter(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)))  # builds the packed cache
    monkeypatch.setattr(check_mod, "open_table", lambda *a, **k: pytest.fail("source read again"))
    check_data(cfg)
