"""The tokenizer's own chat template (`--chat-template auto`, the default when it has one) and the
stop ids: every end-of-sequence / end-of-turn id of the tokenizer, config.json and
generation_config.json ends a generation. The tokenizer is built here with `tokenizers`."""
import json

import pytest
import torch

import longctx
from helpers.byte_level_files import write_byte_level_tokenizer
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.eval import chat
from longctx.eval.runner import Engine
from longctx.model import build_model, get_preset
from longctx.model.generate import generate, greedy_decode

# SmolLM2-Instruct's template: a default system turn, then chatml
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _write_tokenizer(d, *, template=TEMPLATE, jinja_file=False, add_bos_token=None):
    ids = write_byte_level_tokenizer(d, SPECIALS)
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    if add_bos_token is not None:
        config["add_bos_token"] = add_bos_token
    if jinja_file:
        (d / "chat_template.jinja").write_text(template)
    elif template is not None:
        config["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return ids


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat_model")
    longctx.save_pretrained(build_model(get_preset("debug-tiny", initializer_range=0.2,
                                                   max_position_embeddings=1024), seed=0).eval(), d)
    ids = _write_tokenizer(d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}))
    return d


def test_the_template_renders_as_transformers_renders_it(model_dir):
    from transformers import AutoTokenizer

    choice = chat.resolve_chat_template_choice(None, model_dir)
    assert choice.record == {"choice": "auto", "source": str(model_dir / "tokenizer_config.json"),
                             "template": choice.spec, "enable_thinking": False}
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    text = "Find the number.\n{not a placeholder}"
    ref = hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    assert ref.startswith("<|im_start|>")  # the BOS text, which the runner adds as an id instead
    assert choice.spec.replace("{input}", text) == ref[len("<|im_start|>"):]
    tok = load_tokenizer(str(model_dir))
    ours = tok.encode(choice.spec.replace("{input}", text), add_bos=True)
    assert ours == hf.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                          add_generation_prompt=True, return_dict=False)


def test_choices(model_dir, tmp_path):
    assert chat.resolve_chat_template_choice("auto", model_dir).spec == chat.resolve_chat_template_choice(
        None, model_dir).spec
    assert chat.resolve_chat_template_choice("none", model_dir).record["choice"] == "none"
    assert chat.resolve_chat_template_choice("chatml", model_dir).record == {
        "choice": "chatml", "template": "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"}
    assert chat.resolve_chat_template_choice(None, model_dir, ruler_data=True).spec is None
    jinja = tmp_path / "jinja"
    _write_tokenizer(jinja, jinja_file=True)
    choice = chat.resolve_chat_template_choice(None, jinja)
    assert choice.record["source"] == str(jinja / "chat_template.jinja") and "{input}" in choice.spec
    plain = tmp_path / "plain"
    _write_tokenizer(plain, template=None)
    assert chat.resolve_chat_template_choice(None, plain).spec is None  # no template of its own: none
    with pytest.raises(UserError, match="eval.chat_template: auto needs the tokenizer's own template"):
        chat.resolve_chat_template_choice("auto", plain)
    broken = tmp_path / "broken"
    _write_tokenizer(broken, template="{{ raise_exception('system turns only') }}")
    with pytest.raises(UserError, match=r"does not render \(system turns only\)"):
        chat.resolve_chat_template_choice(None, broken)


def test_stop_ids_are_every_eos_and_end_of_turn_id(model_dir, tmp_path):
    ids = {t: i for t, i in zip(SPECIALS, (256, 257, 258))}
    tok = load_tokenizer(str(model_dir))
    assert tok.eos_id == ids["<|im_end|>"]
    assert chat.stop_ids(model_dir, model_dir, tok) == [ids["<|endoftext|>"], ids["<|im_end|>"]]
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))  # an int there, a list elsewhere
    assert chat.stop_ids(tmp_path, model_dir, tok) == [7, ids["<|endoftext|>"], ids["<|im_end|>"]]
    assert chat.stop_ids(None, None, load_tokenizer("byte")) == [257]


def test_generation_stops_at_any_stop_id():
    model = build_model(get_preset("debug-tiny", initializer_range=0.2), seed=0).eval()
    prompt = [5, 6, 7, 8]
    free = generate(model, [prompt], 12)[0]
    stop = next(t for t in free[1:] if t != free[0])
    cut = free.index(stop)
    assert generate(model, [prompt], 12, eos_id={stop, 511}) == [free[:cut]]
    assert generate(model, [prompt], 12, eos_id=stop) == [free[:cut]]
    assert Engine(model, load_tokenizer("byte"), stop_ids=[511, stop]).generate_ids([prompt], 12) == [free[:cut]]
    steps = iter([torch.tensor([3, 9]), torch.tensor([4, 4]), torch.tensor([5, 5])])
    out = greedy_decode(torch.tensor([1, 2]), lambda i, tok: next(steps), 4, eos_id=frozenset({9, 4}), pad_id=0)
    assert out == [[1, 3], [2]]
    # a row whose tokens so far hold its stop (a stop string in its text) is done; the other goes on
    calls = []
    steps = iter([torch.tensor([3, 7]), torch.tensor([4, 8]), torch.tensor([5, 6])])
    out = greedy_decode(torch.tensor([1, 2]), lambda i, tok: calls.append(tok.tolist()) or next(steps), 4,
                        eos_id=None, pad_id=0, stopped=lambda ids: ids[-2:] == [1, 3])
    assert out == [[1, 3, 0, 0], [2, 7, 8, 6]]  # row 0 fed pad after its stop: kept whole, cut by the caller
    assert calls == [[1, 2], [3, 7], [0, 8]]
    assert generate(model, [prompt], 12, stopped=lambda ids: len(ids) == 5) == [free[:5]]


def test_cli_uses_the_tokenizers_template_and_records_it(model_dir, tmp_path, capsys):
    common = ["--model", str(model_dir), "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1",
              "--style", "compact", "--max-new-tokens", "4", "--no-progress", "--save-inputs"]
    assert main(["eval", *common, "--out", str(tmp_path / "auto")]) == 0
    res = json.loads((tmp_path / "auto" / "results.json").read_text())
    meta = res["meta"]
    assert meta["chat_template"]["choice"] == "auto" and meta["stop_ids"] == [256, 258]
    # the template's leading BOS text is the BOS id the runner adds
    prompt = res["samples"][0]["prompt"]
    assert prompt.startswith("system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\n")
    assert not any("no chat template" in d for d in res["departures"])
    capsys.readouterr()
    assert main(["eval", *common, "--out", str(tmp_path / "none"), "--chat-template", "none"]) == 0
    res = json.loads((tmp_path / "none" / "results.json").read_text())
    assert res["meta"]["chat_template"] == {"choice": "none", "template": "{input}"}
    assert any("no chat template for a chat model" in d and "chat_template=auto" in d for d in res["departures"])
    assert main(["eval", *common, "--out", str(tmp_path / "auto"), "--chat-template", "none"]) == 2
    assert "its samples differ" in capsys.readouterr().err  # the template is in the cells' key
    assert main(["eval", *common, "--tokenizer", "byte", "--chat-template", "auto", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: eval.chat_template: auto needs the tokenizer's own template")


def test_stop_ids_beyond_the_eos_are_in_the_cells_key(model_dir):
    from longctx.eval.config import EvalConfig
    from longctx.eval.prepare import prepare

    cfg = EvalConfig(tasks=["passkey"], lengths=["512"], samples=1, style="compact", out=None)
    cells = prepare(cfg, load_tokenizer(str(model_dir)), model_path=str(model_dir)).cells
    assert cells[0].fields["stop_ids"] == [256, 258]
    assert "stop_ids" not in prepare(cfg, load_tokenizer("byte")).cells[0].fields  # the EOS alone: keys as before


@pytest.mark.parametrize("add_bos_token", [None, True, False])
def test_a_tokenizer_that_adds_no_bos_gets_none_in_prompts_and_perplexity_windows(tmp_path, add_bos_token):
    """SmolLM2's tokenizer_config.json says add_bos_token false although <|im_start|> looks like a
    BOS: its template's own leading <|im_start|> is the only one, and raw documents start bare."""
    from longctx.eval.config import EvalConfig
    from longctx.eval.ppl import make_windows
    from longctx.eval.prepare import prepare
    from longctx.eval.runner import Engine

    ids = _write_tokenizer(tmp_path / "tok", add_bos_token=add_bos_token)
    tok = load_tokenizer(str(tmp_path / "tok"))
    adds = add_bos_token is not False
    assert tok.bos_id == ids["<|im_start|>"] and tok.adds_bos is adds
    plan = prepare(EvalConfig(tasks=["passkey"], lengths=["512"], samples=1, style="compact", out=None), tok)
    assert plan.run.options.add_bos is adds and plan.cells[0].fields["add_bos"] is adds
    engine = Engine(model=None, tokenizer=tok, add_bos=plan.run.options.add_bos)
    prompt_ids = engine.encode(plan.samples[0].prompt)
    # either way the model sees <|im_start|>system... exactly as the template renders it
    assert prompt_ids[0] == ids["<|im_start|>"] and prompt_ids[1] != ids["<|im_start|>"]
    prompt = plan.samples[0].prompt
    assert prompt.startswith("system\n") if adds else prompt.startswith("<|im_start|>system\n")
    assert prompt_ids == tok.encode(prompt if not adds else "<|im_start|>" + prompt)
    windows, _, _ = make_windows(tok, ["some long document text " * 40], 64, 1)
    assert (windows[0][0] == tok.bos_id) is adds
