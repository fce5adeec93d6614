"""The tokenizer an export carries (longctx/data/hf_tokenizer.py): transformers' AutoTokenizer
loads it and encodes / decodes exactly as longctx's own tokenizer does, for the byte tokenizer
and a BPE tokenizer.json, and config.json names its special token ids."""
import json

import pytest
from transformers import AutoTokenizer

import longctx
from helpers.data import train_bpe
from helpers.model import tiny_model
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.data.tokenizer import load_tokenizer
from longctx.model.hf import export_files_in

TEXTS = ["The grass is green. The sky is blue.", "  two  spaces\n\tand a tab, then 1234567 ",
         "naïve café — 日本語の文 🙂 ünïcödé", "", "x" * 3000]


def _hf(directory):
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))  # what AutoTokenizer also reads
    return AutoTokenizer.from_pretrained(directory)


def test_byte_tokenizer_round_trips_through_transformers(tmp_path):
    byte = load_tokenizer("byte")
    entries = TokenizerFiles("byte").write(tmp_path, 777)
    assert entries == {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258, "longctx_tokenizer": "byte"}
    hf = _hf(tmp_path)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (byte.bos_id, byte.eos_id, byte.pad_id)
    assert hf.model_max_length == 777
    for text in TEXTS + ["<s> written as text </s> <pad>"]:  # special tokens in a text stay bytes
        assert hf(text)["input_ids"] == byte.encode(text, add_bos=True)
        assert hf(text, add_special_tokens=False)["input_ids"] == byte.encode(text)
        ids = byte.encode(text, add_bos=True, add_eos=True) + [byte.pad_id, 300]  # 300: a model id past the vocab
        assert hf.decode(ids, skip_special_tokens=True) == byte.decode(ids) == text
    cut = byte.encode("日本")[:-1] + byte.encode("A")  # a character cut in the middle
    assert hf.decode(cut, skip_special_tokens=True) == byte.decode(cut)
    # longctx reading the exported files as an HF tokenizer gets the same ids
    again = load_tokenizer(str(tmp_path))
    assert (again.bos_id, again.eos_id, again.pad_id, again.vocab_size) == (256, 257, 258, 259)
    assert all(again.encode(t, add_bos=True) == byte.encode(t, add_bos=True) for t in TEXTS)


@pytest.mark.parametrize("spec_kind", ["tokenizer.json", "directory"])
def test_bpe_tokenizer_files_travel_and_match(tmp_path, spec_kind):
    src = tmp_path / "tok"
    train_bpe(src, with_config=spec_kind == "directory")
    spec = str(src / "tokenizer.json") if spec_kind == "tokenizer.json" else str(src)
    ours = load_tokenizer(spec)
    out = tmp_path / "out"
    out.mkdir()
    entries = TokenizerFiles(spec).write(out, 4096)
    assert entries == {"bos_token_id": ours.bos_id, "eos_token_id": ours.eos_id, "pad_token_id": ours.pad_id}
    assert (out / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()  # copied as is
    settings = json.loads((out / "tokenizer_config.json").read_text())
    if spec_kind == "directory":
        assert settings["eos_token"] == "</s>"  # the source's {"content": "</s>"}, in a form transformers reads
    assert settings["model_max_length"] == 4096
    hf = _hf(out)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (ours.bos_id, ours.eos_id, ours.pad_id)
    for text in TEXTS:
        ids = ours.encode(text)
        assert hf(text, add_special_tokens=False)["input_ids"] == ids
        assert hf.decode(ids, skip_special_tokens=True) == ours.decode(ids)


def test_save_pretrained_with_byte_tokenizer_names_its_ids_and_files(tmp_path):
    longctx.save_pretrained(tiny_model("default", "gqa"), tmp_path / "m", tokenizer="byte")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    generation = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    for key, want in (("bos_token_id", 256), ("eos_token_id", 257), ("pad_token_id", 258)):
        assert config[key] == generation[key] == want
    assert config["longctx_tokenizer"] == "byte"
    # every file is one an export writes, so --overwrite replaces them all
    assert export_files_in(tmp_path / "m") == sorted((tmp_path / "m").iterdir())
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in (tmp_path / "m").iterdir()}
