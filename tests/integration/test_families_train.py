"""The families through the commands, as a user runs them: a Qwen3 directory saved by
transformers trains at cp 2 and its export loads in AutoModelForCausalLM as Qwen3ForCausalLM with
equal logits (`longctx export` of the checkpoint too); a model whose sliding window is shorter than
the training or eval length is refused in one line before anything is written, and trains with
full attention (exported without a window) once the window is turned off."""
import json
import subprocess
import sys

import torch

import longctx
from helpers.train import TINY, env, run_train


def _qwen3_dir(d):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=256,
                         tie_word_embeddings=True, use_sliding_window=False, sliding_window=64,
                         bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(d)
    return d


def _mistral_dir(d, window):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           sliding_window=window)
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(d)
    return d


def _same_logits(a, b, vocab=512, T=200):
    ids = torch.randint(0, vocab, (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return (a(input_ids=ids).logits - b(ids)).abs().max().item()


def test_a_qwen3_directory_trains_at_cp2_and_exports_a_qwen3_model(tmp_path):
    from transformers import AutoModelForCausalLM

    base, out = _qwen3_dir(tmp_path / "base"), tmp_path / "run"
    res = run_train(2, [f"out_dir={out}", f"model.init_from={base}", "parallel.cp_size=2", "data.seq_len=256",
                        "train.steps=3", "checkpoint.every=3", "data.micro_batch_size=1", "log.progress=false",
                        "log.tensorboard=false"])
    assert res.returncode == 0, res.stderr[-3000:]
    hf = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    ours = longctx.load_pretrained(out / "hf").eval()
    assert ours.config.model_type == "qwen3" and ours.config.qk_norm and ours.lm_head is None
    assert _same_logits(hf, ours) <= 1e-4
    trained = ours.layers[0].self_attn.q_norm.weight
    assert not torch.equal(trained, longctx.load_pretrained(base).layers[0].self_attn.q_norm.weight)
    exported = tmp_path / "exported"
    res = subprocess.run([sys.executable, "-m", "longctx", "export", "--checkpoint",
                          str(out / "checkpoints" / "step_0000003"), "--out", str(exported)],
                         capture_output=True, text=True, timeout=300, env=env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((exported / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    again = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    assert _same_logits(again, ours) == 0.0


def test_a_window_shorter_than_the_length_is_refused_and_trains_once_turned_off(tmp_path):
    from transformers import AutoModelForCausalLM

    base, out = _mistral_dir(tmp_path / "mistral", window=128), tmp_path / "run"
    common = [f"model.init_from={base}", "data.seq_len=256", "train.steps=2", *TINY, "checkpoint.export_hf=true"]
    res = run_train(1, [f"out_dir={out}", *common])
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: sliding_window: the model's window is 128 tokens, shorter than data.seq_len 256"), res.stderr[-2000:]
    assert "model.overrides.sliding_window=null" in errors[0] and "Traceback" not in res.stderr
    assert not out.exists()
    res = subprocess.run([sys.executable, "-m", "longctx", "eval", "--model", str(base), "--tokenizer", "byte",
                          "--tasks", "passkey", "--lengths", "512", "--out", str(tmp_path / "eval")],
                         capture_output=True, text=True, timeout=300, env=env())
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith(
        "error: sliding_window: the model's window is 128 tokens, shorter than eval.lengths 512")
    assert "eval.model_overrides.sliding_window=null" in res.stderr and not (tmp_path / "eval").exists()
    # turned off: full attention, and the export says so (transformers runs the model that was trained)
    res = run_train(1, [f"out_dir={out}", *common, "model.overrides.sliding_window=null"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "hf" / "config.json").read_text())["sliding_window"] is None
    hf = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32).eval()
    assert _same_logits(hf, longctx.load_pretrained(out / "hf").eval(), T=400) <= 1e-4
