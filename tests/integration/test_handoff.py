"""Hand-off to other tools: DeepSpeed's own zero_to_fp32.py on our checkpoint as shipped, the
fp32 master export of a bf16 ZeRO run, and an export transformers serves as is."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import longctx
from helpers.data import train_bpe
from helpers.train import env, metrics, run_train

BASE_MAX_LENGTH = 128  # the base tokenizer's model_max_length; the run trains at 4x that
TRAINED = 512  # twice the preset's max_position_embeddings, which the config does not raise


def _load_any_weights(directory: Path) -> dict:
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    state = {}
    for f in files:
        state.update(load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, weights_only=True))
    return state


def test_zero_checkpoint_reads_with_deepspeeds_script_and_exports_fp32_masters(tmp_path):
    tok = Path(train_bpe(tmp_path / "tok"))
    (tok / "tokenizer_config.json").write_text(json.dumps(  # as a base model's hub tokenizer has it
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": BASE_MAX_LENGTH}))
    out = tmp_path / "run"
    res = run_train(2, [f"out_dir={out}", "train.steps=2", f"data.tokenizer={tok}", f"data.seq_len={TRAINED}",
                        "data.micro_batch_size=1", "parallel.zero_stage=2", "train.dtype=bfloat16",
                        "parallel.activation_checkpointing=full", "optim.lr=1e-2", "log.progress=false",
                        "log.tensorboard=false"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(metrics(out)) == 2
    assert f"effective context {TRAINED} (max_position_embeddings, was 256)" in res.stderr
    assert "is deprecated" not in res.stderr  # DeepSpeed's deprecation noise, filtered
    ckpt = out / "checkpoints" / "step_0000002"

    # DeepSpeed's script, the copy in the checkpoint, no flags
    fp32_dir = tmp_path / "fp32"
    script = subprocess.run([sys.executable, str(ckpt / "zero_to_fp32.py"), str(ckpt), str(fp32_dir)],
                            capture_output=True, text=True, env=env())
    assert script.returncode == 0, script.stderr[-3000:]
    masters = _load_any_weights(fp32_dir)
    ours = longctx.load_pretrained(ckpt / "model", dtype=torch.float32)
    assert set(masters) == set(ours.state_dict())  # the model's own names, no wrapper prefixes
    ours.load_state_dict(masters, strict=True)

    # longctx export --dtype float32: the masters themselves, not the bf16 copy upcast
    export = tmp_path / "hf"
    old_umask = os.umask(0o022)
    try:
        res = subprocess.run([sys.executable, "-m", "longctx", "export", "--checkpoint", str(ckpt), "--out",
                              str(export), "--dtype", "float32"], capture_output=True, text=True, env=env())
    finally:
        os.umask(old_umask)
    assert res.returncode == 0, res.stderr[-3000:]
    exported = longctx.load_pretrained(export)
    assert all(torch.equal(exported.state_dict()[k], masters[k]) for k in masters)
    upcast = longctx.load_pretrained(ckpt / "model", dtype=torch.float32).state_dict()
    assert any(not torch.equal(upcast[k], masters[k]) for k in masters)

    # an export a team serves as is
    assert {oct(p.stat().st_mode & 0o777) for p in export.iterdir()} == {"0o644"}
    assert oct(export.stat().st_mode & 0o777) == "0o755"
    assert json.loads((export / "config.json").read_text())["max_position_embeddings"] == TRAINED
    assert json.loads((export / "tokenizer_config.json").read_text())["model_max_length"] == TRAINED
    assert (export / "generation_config.json").is_file()

    from transformers import AutoTokenizer, GenerationConfig, LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    ids = torch.randint(0, ours.config.vocab_size, (2, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(ids).logits - ours.eval()(ids)).abs().max().item()
    assert diff <= 1e-5, diff
    GenerationConfig.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    text = " ".join(["The grass is green. The sky is blue."] * 150)
    assert len(tokenizer(text)["input_ids"]) > TRAINED
    long_text = " ".join(["The grass is green. The sky is blue."] * 40)
    n = len(tokenizer(long_text, truncation=True)["input_ids"])
    assert 2 * BASE_MAX_LENGTH < n < TRAINED  # twice the base length, not cut to it
    assert len(tokenizer(text, truncation=True)["input_ids"]) == TRAINED  # the trained length
