"""Bad input → one clear UserError line naming the source or field (never a traceback)."""
import json

import datasets
import huggingface_hub.constants
import pytest
from tokenizers import Tokenizer

from helpers.data import train_bpe, write_jsonl
from longctx.base.errors import UserError
from longctx.data import (
    ByteTokenizer,
    DataConfig,
    SourceConfig,
    SyntheticConfig,
    UpsampleBucket,
    build_loader,
    check_vocab,
    load_tokenizer,
    validate_data_config,
)

TOK = ByteTokenizer()


def load(cfg):
    return next(iter(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)))


def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


def test_missing_path(tmp_path):
    cfg = DataConfig(sources=[SourceConfig(), SourceConfig(path=str(tmp_path / "nope.jsonl"))])
    with pytest.raises(UserError) as e:
        validate_data_config(cfg)
    assert one_line(e) == f"data.sources[1].path: {tmp_path / 'nope.jsonl'} does not exist"
    with pytest.raises(UserError, match=r"data.sources\[1\].path"):
        load(cfg)
    cfg.sources[1].path = str(tmp_path / "*.parquet")
    with pytest.raises(UserError, match=r"data.sources\[1\].path: no file matches"):
        validate_data_config(cfg)


@pytest.mark.parametrize("streaming", [False, True])
def test_empty_dataset(tmp_path, streaming):
    (tmp_path / "empty.jsonl").write_text("")
    cfg = DataConfig(sources=[SourceConfig(path=str(tmp_path / "empty.jsonl"))], streaming=streaming, prefetch=0)
    with pytest.raises(UserError) as e:
        load(cfg)
    assert "data.sources[0]" in one_line(e) and ("empty" in one_line(e) or "no rows" in one_line(e))


def test_all_documents_filtered_out(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ["short one", "short two"])
    cfg = DataConfig(sources=[SourceConfig(path=path, min_tokens=1000)], prefetch=0)
    with pytest.raises(UserError, match=r"data.sources\[0\]: no document .* passes min_tokens=1000"):
        load(cfg)


@pytest.mark.parametrize("streaming", [False, True])
def test_missing_text_field(tmp_path, streaming):
    path = write_jsonl(tmp_path / "a.jsonl", ["hello world"], field="content")
    cfg = DataConfig(sources=[SourceConfig(path=path)], streaming=streaming, prefetch=0)
    with pytest.raises(UserError) as e:
        load(cfg)
    msg = one_line(e)
    assert msg.startswith("data.sources[0].text_field: 'text' is not a column") and "content" in msg


def test_non_text_field(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ["x", "y"])
    cfg = DataConfig(sources=[SourceConfig(path=path, text_field="id")], prefetch=0)
    with pytest.raises(UserError, match=r"data.sources\[0\].text_field: .*a.jsonl row 1: 'id' holds int, not text"):
        load(cfg)


def test_tokenizer_vocab_larger_than_model(tmp_path):
    with pytest.raises(UserError) as e:
        check_vocab(TOK, 256)
    assert one_line(e).startswith("data.tokenizer: byte has vocab_size 259 but the model's vocab_size is 256")
    check_vocab(TOK, 259)
    bpe = load_tokenizer(train_bpe(tmp_path / "tok", vocab_size=300))
    with pytest.raises(UserError, match="data.tokenizer: .* vocab_size 300"):
        validate_data_config(DataConfig(tokenizer=str(tmp_path / "tok")), model_vocab_size=299)
    validate_data_config(DataConfig(tokenizer=str(tmp_path / "tok")), model_vocab_size=bpe.vocab_size)


@pytest.mark.parametrize("seq_len", [1, 0, -4])
def test_seq_len_below_two(seq_len):
    with pytest.raises(UserError) as e:
        validate_data_config(DataConfig(seq_len=seq_len))
    assert one_line(e) == f"data.seq_len: must be an integer >= 2, got {seq_len}"
    with pytest.raises(UserError, match="data.seq_len"):
        build_loader(DataConfig(seq_len=seq_len), TOK, dp_rank=0, dp_size=1, seed=0)


@pytest.mark.parametrize("weights", [[0.0, 0.0], [-1.0, 2.0], [float("nan"), 1.0], [float("inf"), 1.0]])
def test_mixture_weights(weights):
    cfg = DataConfig(sources=[SourceConfig(weight=w) for w in weights])
    with pytest.raises(UserError) as e:
        validate_data_config(cfg)
    msg = one_line(e)
    assert "weight" in msg and "data.sources" in msg


def test_other_fields_named():
    cases = [
        (DataConfig(micro_batch_size=0), "data.micro_batch_size"),
        (DataConfig(packing="greedy"), "data.packing: 'greedy' is not one of carry, pad, fit"),
        (DataConfig(packing="fit", fit_lookahead=0), "data.fit_lookahead: must be an integer >= 1, got 0"),
        (DataConfig(final_partial="keep"), "data.final_partial"),
        (DataConfig(sources=[]), "data.sources: empty"),
        (DataConfig(sources=[SourceConfig(kind="hub")]), r"data.sources\[0\].hub_name: required"),
        (DataConfig(sources=[SourceConfig(kind="parquet")]), r"data.sources\[0\].path: required"),
        (DataConfig(sources=[SourceConfig(kind="xml", path="x")]), r"data.sources\[0\].kind: 'xml'"),
        (DataConfig(sources=[SourceConfig(upsample=[UpsampleBucket(factor=-1)])]),
         r"data.sources\[0\].upsample\[0\].factor"),
        (DataConfig(sources=[SourceConfig(min_tokens=10, max_tokens=5)]), r"data.sources\[0\].max_tokens"),
        (DataConfig(sources=[SourceConfig(synthetic=SyntheticConfig(tasks={"qa": 1.0}))]),
         r"synthetic.tasks: unknown task 'qa'"),
        (DataConfig(seq_len=64), r"data.sources\[0\].synthetic.length_max: 64 tokens is too short for a 'niah'"),
        (DataConfig(tokenizer="/no/such/tokenizer.json"), "data.tokenizer: /no/such/tokenizer.json does not exist"),
    ]
    for cfg, pattern in cases:
        with pytest.raises(UserError, match=pattern) as e:
            validate_data_config(cfg)
        one_line(e)


def test_unknown_format_and_hub_offline(tmp_path, monkeypatch):
    # offline mode fails fast (a cut-off network only fails after DNS timeouts)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "data.xyz").write_text("hi")
    with pytest.raises(UserError, match=r"data.sources\[0\].path: cannot infer the format of .*data.xyz; set kind"):
        validate_data_config(DataConfig(sources=[SourceConfig(path=str(tmp_path / "data.xyz"))]))
    cfg = DataConfig(sources=[SourceConfig(hub_name="no-such-org/no-such-dataset-xyz")],
                     hf_cache_dir=str(tmp_path / "hf"))
    with pytest.raises(UserError) as e:
        load(cfg)
    assert one_line(e).startswith("data.sources[0]: cannot load hub dataset 'no-such-org/no-such-dataset-xyz'")


def test_tokenizer_without_bos_with_add_bos(tmp_path):
    tok = load_tokenizer(train_bpe(tmp_path / "tok", with_config=False))
    assert tok.bos_id is not None  # "<s>" found by name
    raw = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    data = json.loads(raw.to_str())
    data["added_tokens"] = []
    data["model"]["vocab"] = {k: v for k, v in data["model"]["vocab"].items() if k not in ("<s>", "</s>", "<pad>")}
    (tmp_path / "bare.json").write_text(json.dumps(data))
    bare = load_tokenizer(str(tmp_path / "bare.json"))
    assert bare.bos_id is None
    with pytest.raises(UserError, match="data.add_bos: tokenizer .* has no BOS token; set data.add_bos=false"):
        build_loader(DataConfig(tokenizer=str(tmp_path / "bare.json"), add_bos=True), bare, dp_rank=0, dp_size=1,
                     seed=0)
    build_loader(DataConfig(tokenizer=str(tmp_path / "bare.json"), add_eos=False), bare, dp_rank=0, dp_size=1,
                 seed=0)  # add_bos null: none
