"""Each family's tokenizer conventions: Qwen's has no BOS token (tokenizer_config.json's
bos_token null), so training data gets nothing prepended (no <|im_start|> stand-in) and eval
adds none; Qwen3's chat template renders with its thinking switch off by default; Mistral's
and Llama 3's BOS stays. The tokenizers are built here with `tokenizers`."""
import json

import pytest

from helpers.byte_level_files import write_byte_level_tokenizer
from longctx.base.errors import UserError
from longctx.data.config import DataConfig
from longctx.data.loader import DataLoader
from longctx.data.source_config import SourceConfig
from longctx.data.tokenizer import adds_bos_for, load_tokenizer, prepends_bos
from longctx.eval import chat

# Qwen3's template, reduced to what decides the rendering of one user turn: the thinking switch
QWEN3_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
                  "+ '<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                  "{% if enable_thinking is defined and enable_thinking is false %}"
                  "{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}")
FAMILY_TOKENS = {  # specials, tokenizer_config.json's entries
    "qwen": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
             {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "chat_template": QWEN3_TEMPLATE}),
    "mistral": (["<unk>", "<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}),
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
}


def _tokenizer_dir(d, family):
    specials, config = FAMILY_TOKENS[family]
    ids = write_byte_level_tokenizer(d, specials)
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d, ids


@pytest.mark.parametrize("family, bos", [("qwen", None), ("mistral", "<s>"), ("llama3", "<|begin_of_text|>")])
def test_the_bos_token_is_the_tokenizers_own_or_none(family, bos, tmp_path):
    d, ids = _tokenizer_dir(tmp_path / family, family)
    tok = load_tokenizer(str(d))
    assert tok.bos_id == (None if bos is None else ids[bos])
    assert prepends_bos(tok) is (bos is not None) and adds_bos_for(None, tok) is (bos is not None)
    assert tok.eos_id == ids[FAMILY_TOKENS[family][1]["eos_token"]]


def _first_tokens(tok, tmp_path, **data):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i} " * 3}) + "\n" for i in range(8)))
    cfg = DataConfig(tokenizer=tok.source, sources=[SourceConfig(name="docs", path=str(docs), packing="pad")],
                     seq_len=64, micro_batch_size=2, shuffle=False, prefetch=0, progress=False, **data)
    batch = next(iter(DataLoader(cfg, tok)))
    return batch["input_ids"][:, 0].tolist()


def test_qwen_training_rows_start_with_the_text_not_a_stand_in_bos(tmp_path):
    d, ids = _tokenizer_dir(tmp_path / "qwen", "qwen")
    tok = load_tokenizer(str(d))
    first = _first_tokens(tok, tmp_path)  # one document per row: each row starts with its text
    assert first == [tok.encode("document")[0]] * 2 and ids["<|im_start|>"] not in first
    with pytest.raises(UserError, match="^data.add_bos: tokenizer .* has no BOS token; set data.add_bos=false"):
        _first_tokens(tok, tmp_path, add_bos=True)


def test_mistral_training_rows_start_with_bos(tmp_path):
    d, ids = _tokenizer_dir(tmp_path / "mistral", "mistral")
    assert _first_tokens(load_tokenizer(str(d)), tmp_path) == [ids["<s>"]] * 2


@pytest.mark.parametrize("thinking, think_block", [(False, True), (True, False)])
def test_qwen3_template_renders_with_thinking_off_by_default(thinking, think_block, tmp_path):
    d, ids = _tokenizer_dir(tmp_path / "qwen", "qwen")
    choice = chat.resolve_chat_template_choice(None, d, adds_bos=False, thinking=thinking)
    assert choice.spec.startswith("<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n")
    assert ("<think>\n\n</think>" in choice.spec) is think_block
    assert choice.record["enable_thinking"] is thinking
    assert ids["<|im_end|>"] in chat.stop_ids(None, d, load_tokenizer(str(d)))
