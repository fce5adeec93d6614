"""Long documents encoded in pieces give the ids of one call; a tokenizer that depends on where
a text starts is encoded whole."""
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from helpers.data import make_texts, train_bpe
from longctx.data import tokenizer as tokenizer_module
from longctx.data.pieces import cut_points
from longctx.data.tokenizer import HFTokenizer, load_tokenizer

SOURCE = "".join(f"def f{i}(x):\n    return x * {i}  # line {i}\n\n\nclass C{i}:\n\tpass\n" for i in range(400))


def _spy(tok, monkeypatch):
    """The texts of every encode call the tokenizer makes."""
    calls = []
    real = tok._ids_many
    monkeypatch.setattr(tok, "_ids_many", lambda texts: calls.append(list(texts)) or real(texts))
    return calls


def test_cuts_follow_a_single_newline_between_non_whitespace():
    cuts = cut_points(SOURCE, 500)
    assert len(cuts) > 10
    bounds = [0, *cuts]
    for a, c in zip(bounds, cuts):
        assert SOURCE[c - 1] == "\n" and not SOURCE[c].isspace() and not SOURCE[c - 2].isspace() and c - a >= 500
    assert cut_points(SOURCE, len(SOURCE)) == [] and cut_points("x" * 5000, 100) == []  # no newline: no cut


def test_byte_level_bpe_in_pieces_gives_the_ids_of_one_call(tmp_path, monkeypatch):
    tok = load_tokenizer(train_bpe(tmp_path / "bpe"))
    one_call = np.asarray(tok.backend.encode(SOURCE, add_special_tokens=False).ids)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 500)
    calls = _spy(tok, monkeypatch)
    ids = tok.encode_np(SOURCE, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    np.testing.assert_array_equal(ids[1:-1], one_call)
    assert max(len(t) for call in calls for t in call) < len(SOURCE)  # never the whole document at once
    batch = tok.encode_batch(["short one", SOURCE])
    np.testing.assert_array_equal(batch[1], one_call)


def test_a_tokenizer_that_marks_text_starts_is_encoded_whole(monkeypatch):
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()  # SentencePiece's "▁" before each text's first word
    raw.train_from_iterator(make_texts(200, seed=2), trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]))
    tok = HFTokenizer(raw, "metaspace")
    text = "alpha beta\ngamma delta\n" * 200
    one_call = np.asarray(raw.encode(text, add_special_tokens=False).ids)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 300)
    calls = _spy(tok, monkeypatch)
    np.testing.assert_array_equal(tok.encode_np(text), one_call)
    assert [text] in calls  # the check failed at a cut, so the document went in one call


@pytest.mark.parametrize("text", ["", "no newline at all " * 100, "\n" * 2000])
def test_texts_without_a_usable_cut_are_encoded_whole(tmp_path, monkeypatch, text):
    tok = load_tokenizer(train_bpe(tmp_path / "bpe"))
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 100)
    one_call = np.asarray(tok.backend.encode(text, add_special_tokens=False).ids)
    np.testing.assert_array_equal(tok.encode_np(text), one_call)
