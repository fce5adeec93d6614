"""Every hint an error message gives works when followed: each case runs the failing input, checks
the message says the hint, applies the hint literally and checks the input then passes
(validation for configs, the command itself where it is cheap). The eval length hints are in
tests/unit/test_eval_lengths.py."""
import argparse
import json

import pytest

import longctx
from longctx.base.errors import UserError
from longctx.config import load_config, load_structured, validate_config
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.config import EvalConfig
from longctx.eval.model_io import check_lengths, tokenizer_spec_for
from longctx.eval.ruler_format import read_ruler_data, write_ruler_data
from longctx.eval.ruler_prompts import write_prompts
from longctx.eval.tasks import TaskOptions, build_samples
from longctx.model import build_model, get_preset

BYTE = load_tokenizer("byte")


def _train_error(overrides, world=2, **kw) -> str:
    with pytest.raises(UserError) as e:
        validate_config(load_config(None, overrides), world, **kw)
    return str(e.value)


def _train_ok(overrides, world=2, **kw) -> None:
    validate_config(load_config(None, overrides), world, **kw)



# (failing overrides, the hint as the message says it, the overrides with each way of following it)
TRAIN_HINTS = {
    "max_position_embeddings": (["data.seq_len=512", "model.max_position_embeddings=256"],
                                "set model.max_position_embeddings=512 (or more)",
                                [["data.seq_len=512", "model.max_position_embeddings=512"]]),
    "compile with ZeRO-3": (["parallel.compile=norms_mlp", "parallel.zero_stage=3"],
                            "use zero_stage <= 2 or compile=none",
                            [["parallel.compile=norms_mlp", "parallel.zero_stage=2"],
                             ["parallel.compile=none", "parallel.zero_stage=3"]]),
    "mlp tiles with ZeRO-3": (["parallel.mlp_tile_tokens=64", "parallel.zero_stage=3"],
                              "use zero_stage <= 2 or mlp_tile_tokens=0",
                              [["parallel.mlp_tile_tokens=64", "parallel.zero_stage=2"],
                               ["parallel.mlp_tile_tokens=0", "parallel.zero_stage=3"]]),
    "offload_params": (["parallel.offload_params=true"], "needs parallel.zero_stage=3",
                       [["parallel.offload_params=true", "parallel.zero_stage=3"]]),
    "activation offload without checkpointing": (
        ["parallel.offload_activations=host"], "set parallel.activation_checkpointing=full",
        [["parallel.offload_activations=host", "parallel.activation_checkpointing=full"],
         ["parallel.offload_activations=none"]]),
    "activation offload path without disk": (
        ["parallel.offload_activations_path=runs/offload", "parallel.activation_checkpointing=full"],
        "set offload_activations=disk",
        [["parallel.offload_activations_path=runs/offload", "parallel.activation_checkpointing=full",
          "parallel.offload_activations=disk"]]),
    "nvme parameter offload without a path": (
        ["parallel.offload_params_device=nvme", "parallel.offload_params=true", "parallel.zero_stage=3"],
        "required with offload_params_device=nvme",
        [["parallel.offload_params_device=cpu", "parallel.offload_params=true", "parallel.zero_stage=3"]]),
    "model override typo": (["model.overrides={hiden_size: 64}"], "did you mean 'hidden_size'?",
                            [["model.overrides={hidden_size: 64}"]]),
    "rope field": (["model.rope_parameters={rope_type: yarn, factor: 4.0}"],
                   "original_max_position_embeddings: required for rope_type 'yarn'",
                   [["model.rope_parameters={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 256}"]]),
    "tokenizer": (["data.tokenizer=nope.json"], "use 'byte'", [["data.tokenizer=byte"]]),
}


@pytest.mark.parametrize("name", TRAIN_HINTS)
def test_train_config_hints_work_when_followed(name):
    failing, hint, followed = TRAIN_HINTS[name]
    msg = _train_error(failing)
    assert hint in msg, msg
    for overrides in followed:
        _train_ok(overrides)


def _synthetic(length: int, extra: str = "") -> list[str]:
    return [f"data.seq_len={length}", f"data.sources=[{{kind: synthetic, synthetic: {{length_max: {length}{extra}}}}}]"]


@pytest.mark.parametrize("length, hints", [
    (90, ["style 'short'", "length_max >= ", "tasks of 'recall' only"]),
    (40, ["length_max >= "]),  # neither short documents nor another task fit 40 tokens
])
def test_synthetic_length_hints_are_offered_only_where_they_fit(length, hints):
    msg = _train_error(_synthetic(length))
    fixes = msg.split("; use ", 1)[1]
    assert [h for h in ("style 'short'", "length_max >= ", "tasks of 'recall' only") if h in fixes] == hints, msg
    for hint in hints:
        if hint == "style 'short'":
            _train_ok(_synthetic(length, ", style: short"))
        elif hint == "length_max >= ":
            _train_ok(_synthetic(int(fixes.split("length_max >= ")[1].split(",")[0].split(" ")[0])))
        else:
            _train_ok(_synthetic(length, ", tasks: {recall: 1.0}"))


@pytest.mark.parametrize("overrides, hint, fixed", [
    (["train.stpes=5"], "did you mean 'train.steps'?", ["train.steps=5"]),
    (["model=3"], "(e.g. model.preset=...)", ["model.preset=debug-tiny"]),
    (["train.steps"], "expected key=value (e.g. train.steps=100)", ["train.steps=100"]),
    (["model.overrides={hidden_size: 64"], "write mappings as {a: 1, b: 2}", ["model.overrides={hidden_size: 64}"]),
])
def test_loader_hints_work_when_followed(overrides, hint, fixed):
    with pytest.raises(UserError) as e:
        load_config(None, overrides)
    assert hint in str(e.value), str(e.value)
    _train_ok(fixed)


def test_an_empty_config_file_hint(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(UserError, match="leave out --config for the built-in defaults"):
        load_config(str(empty))
    _train_ok([])  # no --config


def test_deepspeed_json_zero_stage_hint(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    msg = _train_error([f"parallel.deepspeed_config={ds}"])
    assert "set parallel.zero_stage=2" in msg
    _train_ok([f"parallel.deepspeed_config={ds}", "parallel.zero_stage=2"])


def test_missing_init_from_hints(tmp_path):
    """Training needs the weights ("set model.init_from=DIR"); the dry run and --print-config do
    not ("take the architecture from model.preset without it")."""
    missing = [f"model.init_from={tmp_path / 'nope'}", "model.preset=debug-tiny"]
    msg = _train_error(missing)
    assert "set model.init_from=DIR" in msg and "take the architecture from model.preset" in msg
    _train_ok(missing, weights=False)
    model_dir = tmp_path / "tiny"
    longctx.save_pretrained(build_model(get_preset("debug-tiny"), seed=0), model_dir)
    _train_ok([f"model.init_from={model_dir}"])
    (model_dir / "model.safetensors").unlink()
    assert "has no weights" in _train_error([f"model.init_from={model_dir}"])


def _eval_error(world=1, **fields) -> str:
    with pytest.raises(UserError) as e:
        EvalConfig(**fields).validate(world)
    return str(e.value)


def test_eval_config_hints_work_when_followed(tmp_path):
    assert "(--model DIR" in _eval_error()
    EvalConfig(model=str(tmp_path)).validate(1)
    assert "(--tokenizer byte" in _eval_error(write_data=str(tmp_path / "w"))
    EvalConfig(write_data=str(tmp_path / "w"), tokenizer="byte").validate(1)
    assert "use integers or 4k/8k-style values" in _eval_error(model="m", lengths=["4x"])
    EvalConfig(model="m", lengths=["4k"]).validate(1)
    assert "torchrun --nproc-per-node 2" in _eval_error(model="m", cp=2)
    EvalConfig(model="m", cp=2).validate(2)
    with pytest.raises(UserError, match="did you mean 'eval.samples'"):
        load_structured(EvalConfig, None, ["sampels=3"], prefix="eval.")
    assert load_structured(EvalConfig, None, ["samples=3"], prefix="eval.").samples == 3


def test_strict_lengths_hint():
    config = get_preset("debug-tiny", max_position_embeddings=1024)
    with pytest.raises(UserError, match=r"\(drop them, or leave out --strict-lengths"):
        check_lengths([512, 2048], config, strict=True)
    assert check_lengths([512], config, strict=True) == []  # drop them
    with pytest.warns(UserWarning):
        check_lengths([512, 2048], config, strict=False)  # leave out --strict-lengths


def test_model_without_tokenizer_files_hint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r'pass --tokenizer \("byte"'):
        tokenizer_spec_for(tmp_path, None)
    assert tokenizer_spec_for(tmp_path, "byte") == "byte"


def test_ruler_data_hints(tmp_path):
    data = tmp_path / "one"
    write_ruler_data(tmp_path / "tmp", build_samples("passkey", BYTE, 512, 2))
    (tmp_path / "tmp" / "512" / "data").rename(data)
    with pytest.raises(UserError, match="leave chat_template unset with ruler_data"):
        read_ruler_data(data, BYTE, TaskOptions(chat_template="chatml"), lengths=[512])
    with pytest.raises(UserError, match="give exactly one length in eval.lengths"):
        read_ruler_data(data, BYTE, lengths=[512, 1024])
    samples, _ = read_ruler_data(data, BYTE, lengths=[512])
    assert len(samples) == 2


def test_write_data_hint(tmp_path):
    cfg = EvalConfig(write_data=str(tmp_path / "w"), tokenizer="byte", tasks=["passkey"], lengths=["512"], samples=1)
    assert write_prompts(cfg)[0]
    with pytest.raises(UserError, match="write into an empty directory"):
        write_prompts(cfg)
    cfg.write_data = str(tmp_path / "empty")
    assert write_prompts(cfg)[0]


def _plan(argv, capsys) -> str:
    from longctx.commands import plan

    p = argparse.ArgumentParser()
    plan.add_parser(p)
    plan.run(p.parse_args(argv))
    return capsys.readouterr().out


def test_plan_nothing_fits_hints(capsys):
    base = ["model.preset=llama2-7b", "train.dtype=bfloat16", "--gpu-mem", "80GB"]
    out = _plan([*base, "--gpus", "1", "--seq-len", "1m"], capsys)
    assert "nothing fits 1,048,576 tokens on 1 GPUs: try more GPUs (--gpus above 1, for cp > 1), a shorter " \
           "target (--seq-len)" in out
    assert "recommended:" in _plan([*base, "--gpus", "64", "--seq-len", "1m"], capsys)  # more GPUs
    assert "recommended:" in _plan([*base, "--gpus", "1", "--seq-len", "8k"], capsys)  # a shorter target
