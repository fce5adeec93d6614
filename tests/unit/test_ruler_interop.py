"""RULER interop: with --ruler-data the lengths come from the data (a --lengths that disagrees is
one error line), results.json states the tasks and samples that ran, --write-data's `length`
counts as RULER's prepare.py does (no BOS) and niah lines carry `token_position_answer`."""
import json
from pathlib import Path

import pytest

from helpers.model import save_byte_model
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.ruler_format import read_ruler_data

BYTE = load_tokenizer("byte")
COMMON = ["--samples", "3", "--max-new-tokens", "4", "--no-progress"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ruler")
    assert main(["eval", "--tokenizer", "byte", "--write-data", str(root), "--tasks", "niah_single_1,vt",
                 "--lengths", "1024", *COMMON]) == 0
    return root


def _lines(path: Path) -> list:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_write_data_counts_length_as_ruler_and_locates_the_answer(data):
    for task in ("niah_single_1", "vt"):
        for line in _lines(data / "1024" / "data" / task / "validation.jsonl"):
            budget = 4
            assert line["length"] == len(BYTE.encode(line["input"] + line["answer_prefix"])) + budget  # no BOS
            assert line["length"] == line["length_w_model_temp"] <= 1024
            if task == "vt":
                assert "token_position_answer" not in line
                continue
            ids = BYTE.encode(line["input"])
            at = line["token_position_answer"]
            assert BYTE.decode(ids[at:]).startswith(line["outputs"][0])
            assert at == len(BYTE.encode(line["input"][:line["input"].find(line["outputs"][0])]))


def test_ruler_data_lengths_come_from_the_data(model_dir, data, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "--model", str(model_dir), "--ruler-data", str(data), "--out", str(out), *COMMON]) == 0
    res = json.loads((out / "results.json").read_text())
    meta = res["meta"]
    assert meta["lengths"] == [1024] and res["summary"]["lengths"] == [1024]  # not the default 4096
    assert meta["tasks"] == ["niah_single_1", "vt"] and meta["suite"] == "ruler_data"
    assert meta["samples"] == 3 and meta["samples_per_cell"] == {"niah_single_1": {"1024": 3}, "vt": {"1024": 3}}
    assert res["ruler_comparable"] is False
    assert any(d.startswith("prompts written by longctx eval --write-data") for d in res["departures"])
    assert not any("squad=FILE" in d or d.startswith("prompts from longctx's generator") for d in res["departures"])
    capsys.readouterr()
    for lengths in ("4096,8192", "2048"):  # data prepared at 1024: not relabelled
        assert main(["eval", "--model", str(model_dir), "--ruler-data", str(data), "--lengths", lengths,
                     "--out", str(tmp_path / lengths), *COMMON]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: eval.lengths: ") and "(its lengths: 1024)" in err[0]
    assert main(["eval", "--model", str(model_dir), "--ruler-data", str(data), "--lengths", "1024",
                 "--out", str(tmp_path / "same"), *COMMON]) == 0  # the data's own length is fine


def test_one_length_folder(data, tmp_path):
    one = data / "1024" / "data"  # prepare.py's save_dir: <L>/data names its length
    samples, _ = read_ruler_data(one, BYTE)
    assert {s.target_length for s in samples} == {1024} and len(samples) == 6
    with pytest.raises(UserError, match=r"eval.lengths: 2048 not in the RULER data of .* \(its lengths: 1024\)"):
        read_ruler_data(one, BYTE, lengths=[2048])
    moved = tmp_path / "prompts"  # a path that names no length: the one length given, checked against the lines
    one.rename(moved)
    try:
        assert {s.target_length for s in read_ruler_data(moved, BYTE, lengths=[1024])[0]} == {1024}
        with pytest.raises(UserError, match=r"eval.lengths: 4096 does not fit the RULER data of .*: .* has lines "
                                            r"of up to \d+ tokens"):
            read_ruler_data(moved, BYTE, lengths=[4096])
        with pytest.raises(UserError, match="give exactly one length in eval.lengths"):
            read_ruler_data(moved, BYTE)
    finally:
        moved.rename(one)
