"""Which form of an adapter run a model directory holds (checkpoint/adapter_source.py): a
checkpoint without model/ is its base plus the adapter, a run's hf/ with adapter/ beside it the
merged export, anything else no adapter run's; a PEFT adapter directory given as the model is
refused in one line naming the run. (The evaluation of both forms, scored alike, is
tests/integration/test_adapter_run.py's.)"""
import json

import pytest

from longctx.base.errors import UserError
from longctx.checkpoint.adapter_source import BASE_PLUS_ADAPTER, MERGED_EXPORT, adapter_source
from longctx.checkpoint.find import resolve_model_dir
from longctx.checkpoint.manifest import COMPLETE, write_manifest
from longctx.commands.cli import main

RECORD = {"type": "lora", "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
          "trainable": ["embed_tokens", "norm"], "base_sha256": "ab" * 32, "base": None, "seed": 7}


def _checkpoint(run, adapter=RECORD):
    """A complete checkpoint without model/ whose trainer_state.json records `adapter`."""
    ckpt = run / "checkpoints" / "step_0000002"
    (ckpt / "ds").mkdir(parents=True)
    (ckpt / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2, **({"adapter": adapter} if adapter else {})}))
    assert write_manifest(ckpt, 2) is None
    (ckpt / COMPLETE).write_text("2\n")
    return ckpt


def _peft_dir(path, base=None):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8.0, "target_modules": ["v_proj", "q_proj"],
        "modules_to_save": ["embed_tokens", "norm"], "base_model_name_or_path": base}))
    (path / "adapter_model.safetensors").write_bytes(b"factors")
    (path / "config.json").write_text("{}")
    return path


def test_a_checkpoint_without_model_is_its_base_plus_the_adapter(tmp_path):
    ckpt = _checkpoint(tmp_path / "run")
    source = adapter_source(resolve_model_dir(tmp_path / "run"))
    assert source["loaded"] == BASE_PLUS_ADAPTER and source["checkpoint"] == str(ckpt)
    assert source["base"] == "the preset's random init (seed 7)" and source["base_sha256"] == "ab" * 32
    assert (source["r"], source["target_modules"], source["trainable"]) == (4, ["q_proj", "v_proj"],
                                                                            ["embed_tokens", "norm"])
    assert source["description"] == (
        f"adapter run: {ckpt} holds the trained tensors only; evaluating its base (the preset's random init "
        "(seed 7), sha256 abababababab) with the adapter (LoRA r 4 on q_proj, v_proj with embed_tokens, norm "
        "trained whole) merged in as it loads")
    named = dict(RECORD, base="/models/llama")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2, "adapter": named}))
    assert adapter_source(ckpt)["base"] == "/models/llama"


def test_a_runs_hf_with_adapter_beside_it_is_the_merged_export(tmp_path):
    run = tmp_path / "run"
    (run / "hf").mkdir(parents=True)
    assert adapter_source(run / "hf") is None  # no adapter/ beside it: a full-training run's export
    _peft_dir(run / "adapter", base="/models/llama")
    source = adapter_source(run / "hf")
    assert source["loaded"] == MERGED_EXPORT and source["adapter"] == str(run / "adapter")
    assert (source["base"], source["r"], source["alpha"]) == ("/models/llama", 4, 8.0)
    assert source["description"] == (
        f"adapter run: evaluating its merged export {run / 'hf'} (LoRA r 4 on q_proj, v_proj with embed_tokens, "
        f"norm trained whole, folded into the base weights), the PEFT adapter in {run / 'adapter'}")
    other = tmp_path / "model-dir"
    other.mkdir()
    assert adapter_source(other) is None


def test_a_full_training_checkpoint_is_no_adapter_run(tmp_path):
    assert adapter_source(_checkpoint(tmp_path / "run", adapter=None)) is None


def test_a_peft_adapter_directory_as_the_model_is_refused_naming_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    _checkpoint(run)
    adapter_dir = _peft_dir(run / "adapter")
    with pytest.raises(UserError, match=rf"^eval.model: {adapter_dir} is a PEFT adapter directory \(no weights of "
                                        rf"its own\); give its run instead \(eval.model={run}: "):
        resolve_model_dir(adapter_dir)
    loose = _peft_dir(tmp_path / "elsewhere" / "adapter")
    with pytest.raises(UserError, match="give the merged model instead"):
        resolve_model_dir(loose)
    assert main(["eval", "--model", str(adapter_dir), "--tokenizer", "byte", "--tasks", "passkey", "--lengths", "256",
                 "--samples", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: eval.model: {adapter_dir} is a PEFT adapter directory")
    assert not (tmp_path / "out").exists()
