"""`longctx eval model_overrides.*`: zero-shot RoPE on a stored model (the same numbers as a model
built with that RoPE), one error line before any weight is read, results.json and the cells' key,
and dynamic NTK / longrope computed per sequence (as transformers does for one sequence)."""
import json
import re

import pytest
import torch

import longctx
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.eval import command, sequence_rope
from longctx.eval.api import evaluate
from longctx.eval.config import EvalConfig
from longctx.eval.model_io import load_model
from longctx.eval.model_overrides import apply_overrides, base_model_config
from longctx.eval.runner import Engine
from longctx.model import build_model, get_preset

BYTE = load_tokenizer("byte")
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
YARN_RUN = dict(YARN, rope_theta=5e4)  # as it runs: the stored model's theta kept
YARN_ARG = "model_overrides.rope_parameters={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 256}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    cfg = get_preset("debug-tiny", initializer_range=0.2, rope_parameters={"rope_type": "default", "rope_theta": 5e4})
    longctx.save_pretrained(build_model(cfg, seed=0).eval(), d)
    config = json.loads((d / "config.json").read_text())
    config["longctx_tokenizer"] = "byte"
    (d / "config.json").write_text(json.dumps(config))
    return d


def _built_with(model_dir, **changes):
    """The reference: a model built with the changed config, the stored weights loaded."""
    stored = longctx.load_pretrained(model_dir)
    model = build_model(stored.config.replace(**changes))
    model.load_state_dict(stored.state_dict())
    return model.eval()


def test_an_override_keeps_the_models_theta_and_pretraining_length(model_dir):
    base = base_model_config(model_dir)
    config, effective = apply_overrides(base, {"rope_parameters": {"rope_type": "yarn", "factor": 4}})
    assert effective["rope_parameters"]["rope_theta"] == 5e4  # not RoPE's 1e4 default
    assert effective["rope_parameters"]["original_max_position_embeddings"] == 256  # the stored length
    assert effective["rope_parameters"]["factor"] == 4.0 and config.max_position_embeddings == 256
    assert apply_overrides(base, {}) == (base, {})


@pytest.mark.parametrize("overrides, message", [
    ({"max_position_embedings": 1024}, "eval.model_overrides.max_position_embedings: not a model field"),
    ({"hidden_size": 128}, "eval.model_overrides.hidden_size: changes the shapes of the weights"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 0.5}},
     "eval.model_overrides.rope_parameters.factor: must be >= 1"),
    ({"rope_parameters": {"rope_type": "ntk"}}, "eval.model_overrides.rope_parameters.rope_type: unknown 'ntk'; valid"),
    ({"rope_parameters": {"rope_type": "linear", "beta_fast": 2}}, "unknown field 'beta_fast' for rope_type 'linear'"),
    ({"max_position_embeddings": 0}, "eval.model_overrides.max_position_embeddings: must be a positive integer"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 1024},
     "eval.model_overrides.max_position_embeddings: dynamic NTK scales the sequences longer than"),
    ({"rope_parameters": "yarn"}, "eval.model_overrides.rope_parameters: must be a mapping"),
])
def test_a_bad_override_is_one_line_naming_its_field(model_dir, overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        apply_overrides(base_model_config(model_dir), overrides)


def test_the_cli_refuses_a_bad_override_before_loading_weights(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(command, "load_model", lambda *a, **k: pytest.fail("the weights were read"))
    rc = main(["eval", "--model", str(model_dir), "--out", str(tmp_path / "o"), "--no-progress",
               "model_overrides.rope_parameters={rope_type: yarn, factor: 0.5}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: eval.model_overrides.rope_parameters.factor:")
    assert main(["eval", "--model", str(model_dir), "model_overrides.num_layers=3"]) == 2
    err = capsys.readouterr().err
    assert "eval.model_overrides.num_layers: not a model field" in err and "valid: rope_parameters" in err
    assert not (tmp_path / "o").exists()


def test_yarn_at_eval_equals_a_model_built_with_yarn(model_dir):
    config, _ = apply_overrides(base_model_config(model_dir), {"rope_parameters": YARN,
                                                               "max_position_embeddings": 1024})
    ours = load_model(model_dir, config=config).eval()
    ref = _built_with(model_dir, rope_parameters=YARN_RUN, max_position_embeddings=1024)
    plain = longctx.load_pretrained(model_dir).eval()
    ids = torch.randint(0, 256, (2, 700), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ours(ids), ref(ids))
        assert not torch.allclose(ours(ids), plain(ids))  # the override is applied


def test_cli_yarn_scores_and_records(model_dir, tmp_path, capsys):
    common = ["--model", str(model_dir), "--suite", "ppl,passkey", "--lengths", "512", "--samples", "1",
              "--style", "compact", "--ppl-windows", "1", "--max-new-tokens", "4", "--no-progress"]
    out = tmp_path / "yarn"
    assert main(["eval", *common, "--out", str(out), YARN_ARG, "model_overrides.max_position_embeddings=1024"]) == 0
    res = json.loads((out / "results.json").read_text())
    recorded = res["meta"]["model_overrides"]
    assert recorded["max_position_embeddings"] == 1024 and res["meta"]["max_position_embeddings"] == 1024
    assert recorded["rope_parameters"] == YARN_RUN
    assert res["meta"]["rope_parameters"]["rope_type"] == "yarn"
    assert "model_overrides" in (out / "report.md").read_text()
    cfg = EvalConfig(suite=["ppl", "passkey"], lengths=["512"], samples=1, style="compact", ppl_windows=1,
                     max_new_tokens=4, no_progress=True, out=None)
    ref = evaluate(_built_with(model_dir, rope_parameters=YARN_RUN, max_position_embeddings=1024), BYTE, cfg)
    assert res["ppl"]["rows"] == ref["ppl"]["rows"]
    assert [r["generated_ids"] for r in res["samples"]] == [r["generated_ids"] for r in ref["records"]]
    plain = evaluate(longctx.load_pretrained(model_dir).eval(), BYTE, cfg)
    assert plain["ppl"]["rows"] != ref["ppl"]["rows"]
    # the same --out with other overrides: its cells are not reused
    capsys.readouterr()
    assert main(["eval", *common, "--out", str(out), YARN_ARG]) == 2
    err = capsys.readouterr().err
    assert "holds results of another evaluation" in err and "model_overrides" in err
    assert main(["eval", *common, "--out", str(out)]) == 2  # nor without any
    assert main(["eval", *common, "--out", str(out), YARN_ARG, "model_overrides.max_position_embeddings=1024"]) == 0
    assert "resuming: 2 of 2 cells already done" in capsys.readouterr().err


def test_the_key_holds_the_overrides(model_dir):
    from longctx.eval.cells import run_identity

    plain = run_identity(model_dir, "byte", "auto")
    assert "model_overrides" not in plain  # an eval without overrides keeps its key
    yarn = run_identity(model_dir, "byte", "auto", model_overrides={"rope_parameters": YARN})
    assert yarn != plain and yarn["model_overrides"] == {"rope_parameters": YARN}
    assert run_identity(model_dir, "byte", "auto", model_overrides={"rope_parameters": dict(YARN, factor=2.0)}) != yarn


# ------------------------------------------------------------------ length-dependent RoPE, per sequence

DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 5e4}


def _dynamic_model(model_dir):
    config, _ = apply_overrides(base_model_config(model_dir), {"rope_parameters": DYNAMIC})
    return load_model(model_dir, config=config).eval()


def _hf_greedy(hf, prompt: list, steps: int) -> list:
    """transformers' forward with its KV cache, one token at a time (the keys keep the base they were made with)."""
    out = hf(torch.tensor([prompt]), use_cache=True)
    tokens = [int(out.logits[0, -1].argmax())]
    for i in range(steps - 1):
        out = hf(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True,
                 position_ids=torch.tensor([[len(prompt) + i]]))
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def test_dynamic_ntk_generates_as_transformers_does_for_one_sequence(model_dir):
    from transformers import AutoConfig, LlamaForCausalLM

    model = _dynamic_model(model_dir)
    assert isinstance(model.rotary, sequence_rope.SequenceRotary)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (600, 200, 430)]
    engine = Engine(model, BYTE, batch_size=1)
    hf_config = AutoConfig.from_pretrained(model_dir)
    hf_config.rope_parameters = dict(DYNAMIC)
    with torch.no_grad():
        for prompt in prompts:  # each on a fresh transformers model: its base state starts over
            hf = LlamaForCausalLM.from_pretrained(model_dir, config=hf_config, torch_dtype=torch.float32).eval()
            assert hf.model.rotary_emb.rope_type == "dynamic"
            assert engine.generate_ids([prompt], 8)[0] == _hf_greedy(hf, prompt, 8)


def test_dynamic_ntk_does_not_depend_on_the_batch_or_the_order(model_dir):
    model = _dynamic_model(model_dir)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (700, 300, 520)]
    alone = [Engine(model, BYTE, batch_size=1).generate_ids([p], 6)[0] for p in reversed(prompts)][::-1]
    assert Engine(model, BYTE, batch_size=3).generate_ids(prompts, 6) == alone
    # a short window after a long one reads the original frequencies, as on a fresh model
    short = torch.tensor([prompts[1]])
    with torch.no_grad():
        first = model(short)
        model(torch.tensor([prompts[0]]))
        assert torch.equal(model(short), first)


@pytest.mark.parametrize("rope", [DYNAMIC, {"rope_type": "longrope", "short_factor": [1.0] * 8,
                                            "long_factor": [float(i + 1) for i in range(8)],
                                            "original_max_position_embeddings": 256}])
def test_a_cp_shard_uses_its_sequences_length(rope):
    """Under context parallelism a rank holds part of the positions: the declared length decides."""
    config = get_preset("debug-tiny").replace(rope_parameters=rope)
    rotary = sequence_rope.SequenceRotary(config.rope_parameters, config.head_dim, config.max_position_embeddings)
    full = torch.arange(600)[None]  # (1, 600)
    cos, sin = rotary(full)
    shard = full[:, 100:250]  # ends below the original length
    with_length = sequence_rope.SequenceRotary(config.rope_parameters, config.head_dim,
                                               config.max_position_embeddings)
    with_length.lengths = torch.tensor([600])
    c, s = with_length(shard)
    assert torch.equal(c, cos[:, 100:250]) and torch.equal(s, sin[:, 100:250])
    alone, _ = rotary(shard)
    assert not torch.equal(alone, cos[:, 100:250])  # without it the shard would read other frequencies
