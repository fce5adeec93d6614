"""The byte-level BPE trainer (longctx.data.bpe): lossless on any text, one token per digit,
specials found as BOS/EOS/PAD, deterministic, and it shortens the corpus it was trained on."""
from __future__ import annotations

import pytest

from longctx.base.errors import UserError
from longctx.data.bpe import MIN_VOCAB, train_bpe
from longctx.data.synthetic import generate_document
from longctx.data.synthetic_config import SyntheticConfig
from longctx.data.tokenizer import load_tokenizer

CFG = SyntheticConfig(num_keys=6, num_values=4, filler="mixed", tasks={"niah": 0.5, "multivalue": 0.3, "passkey": 0.2})


def _texts(n: int, offset: int = 0) -> list[str]:
    return [generate_document(CFG, offset + i, length_chars=600).text for i in range(n)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    path = train_bpe(_texts(400), 600, tmp_path_factory.mktemp("bpe"))
    return path, load_tokenizer(str(path))


def test_specials_are_bos_eos_pad_and_vocab_is_as_asked(bpe):
    _, tok = bpe
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
    assert tok.vocab_size == 600
    ids = tok.encode("hello", add_bos=True, add_eos=True)
    assert ids[0] == 0 and ids[-1] == 1


def test_round_trip_is_lossless_on_unseen_text(bpe):
    _, tok = bpe
    for text in _texts(20, offset=10_000) + ["naïve café — 東京 🙂\n\ttabs  and  spaces", ""]:
        assert tok.decode(tok.encode(text)) == text


def test_every_digit_is_its_own_token(bpe):
    _, tok = bpe
    for value in ("1234567", "9999999", "5203911"):
        pieces = [tok.decode([i]) for i in tok.encode(f"is: {value}.")]
        assert [p for p in pieces if p.strip().isdigit()] == list(value)


def test_compresses_the_training_corpus_and_the_keys(bpe):
    _, tok = bpe
    texts = _texts(50, offset=20_000)
    chars = sum(len(t) for t in texts)
    tokens = sum(len(tok.encode(t)) for t in texts)
    assert chars / tokens > 2.0, chars / tokens  # bytes per token on unseen documents of the same corpus
    needle = "One of the special magic numbers for"
    assert len(tok.encode(needle)) <= 8  # whole words, not bytes


def test_deterministic(bpe, tmp_path):
    path, _ = bpe
    again = train_bpe(_texts(400), 600, tmp_path)
    assert again.read_text() == path.read_text()
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, no temporary left


@pytest.mark.parametrize("bad", [0, 100, MIN_VOCAB - 1, "1024"])
def test_too_small_vocab_is_a_user_error(bad, tmp_path):
    with pytest.raises(UserError, match="vocab_size"):
        train_bpe(["text"], bad, tmp_path)
    assert not (tmp_path / "tokenizer.json").exists()
