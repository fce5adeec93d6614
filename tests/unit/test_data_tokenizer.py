"""Tokenizers: the byte tokenizer and a local 🤗 tokenizer (file and directory)."""

import numpy as np
import pytest
import torch

from helpers.data import train_bpe
from longctx.base.errors import UserError
from longctx.data import ByteTokenizer, HFTokenizer, load_tokenizer

TEXT = "Héllo wörld — 你好! The pass key is 12345.\n\ttabs"


def test_byte_tokenizer_roundtrip_and_specials():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and tok.name == "byte"
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (259, 256, 257, 258)
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8")) and isinstance(ids, list)
    assert tok.decode(ids) == TEXT
    full = tok.encode(TEXT, add_bos=True, add_eos=True)
    assert full[0] == 256 and full[-1] == 257 and full[1:-1] == ids
    assert tok.decode(full) == TEXT  # specials are dropped
    assert tok.decode(torch.tensor(full)) == TEXT and tok.decode(np.array(full)) == TEXT
    batch = tok.encode_batch([TEXT, ""], add_bos=True)
    assert batch[0].dtype == np.int32 and batch[0].tolist() == [256] + ids and batch[1].tolist() == [256]


def test_byte_tokenizer_encodes_long_texts_as_arrays():
    tok = ByteTokenizer()
    text = "abc " * 1_000_000  # 4 MB

    arr = tok.encode_np(text)
    ids = tok.encode(text)
    assert isinstance(arr, np.ndarray) and arr.shape == (4_000_000,)
    assert arr.tolist() == ids and arr[:4].tolist() == list(b"abc ")
    assert tok.decode(ids[:8]) == "abc abc "


def test_byte_span_mask_handles_multibyte_characters():
    tok = ByteTokenizer()
    text = "é key: 42"
    s = text.index("42")
    m = tok.span_mask(text, [(s, s + 2)])
    ids = np.array(tok.encode(text))
    assert bytes(ids[m].astype(np.uint8)).decode() == "42"


@pytest.mark.parametrize("as_dir", [True, False])
def test_hf_tokenizer_from_file_and_directory(tmp_path, as_dir):
    d = train_bpe(tmp_path / "tok", vocab_size=350)
    spec = d if as_dir else str(tmp_path / "tok" / "tokenizer.json")
    tok = load_tokenizer(spec)
    assert isinstance(tok, HFTokenizer) and tok.name == spec
    assert tok.vocab_size == 350
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)  # <s>, </s>, <pad> from tokenizer_config.json
    text = "alpha bravo charlie The grass is green."
    ids = tok.encode(text)
    assert len(ids) < len(text) // 2  # real BPE merges
    assert tok.decode(ids) == text
    full = tok.encode(text, add_bos=True, add_eos=True)
    assert full == [0] + ids + [1]
    assert tok.decode(full) == text
    batch = tok.encode_batch([text, "golf hotel"], add_eos=True)
    assert batch[0].tolist() == ids + [1]
    assert tok.fingerprint.startswith("hf-") and tok.fingerprint == load_tokenizer(spec).fingerprint


def test_hf_span_mask(tmp_path):
    tok = load_tokenizer(train_bpe(tmp_path / "tok"))
    text = "The special magic number is 8816342."
    s = text.index("8816342")
    m = tok.span_mask(text, [(s, s + 7)])
    ids = np.array(tok.encode(text))
    assert m.shape == ids.shape and m.any() and not m.all()
    assert "8816342" in tok.decode(ids[m]).replace(" ", "")


def test_bad_specs(tmp_path):
    with pytest.raises(UserError, match="data.tokenizer: .* does not exist"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no tokenizer.json"):
        load_tokenizer(str(tmp_path / "empty"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="data.tokenizer: cannot read"):
        load_tokenizer(str(tmp_path / "bad.json"))
    d = train_bpe(tmp_path / "tok2", with_config=False)
    (tmp_path / "tok2" / "tokenizer_config.json").write_text('{"bos_token": "<nope>"}')
    with pytest.raises(UserError, match="special token '<nope>' is not in the vocabulary"):
        load_tokenizer(d)
