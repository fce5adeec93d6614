"""scripts/real_model/smollm2.py --gguf on a tiny quantized llama GGUF this test writes: a plain HF directory
whose weights are the dequantized ones, whose logits through longctx match transformers'
GGUF-loaded model, and that is never overwritten without --overwrite."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

import longctx  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_model" / "smollm2.py"
H, F, L, NQ, NKV, D = 32, 64, 2, 4, 2, 8  # hidden, ffn, layers, q heads, kv heads, head dim
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
LOGIT_TOL = 1e-4  # float32 on both sides: the same weights through two implementations


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for q/k (rotary halves interleaved per head); transformers undoes it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path) -> dict:
    """A 2-layer llama (Q4_1 matrices, Q8_0 embedding, tied output) with a byte-level BPE
    tokenizer; returns the HF-named float32 weights it dequantizes to."""
    Q = gguf.GGMLQuantizationType
    tokens = SPECIAL + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))
    V = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(NQ)
    w.add_head_count_kv(NKV)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    w.add_add_bos_token(False)
    rng = np.random.default_rng(0)
    expected = {}

    def add(name: str, hf: str, arr: np.ndarray, qtype=None, heads=None):
        arr = arr.astype(np.float32)
        stored = _permute(arr, heads) if heads else arr
        if qtype is None:
            w.add_tensor(name, stored)
            deq = stored
        else:
            packed = gguf.quants.quantize(stored, qtype)
            w.add_tensor(name, packed, raw_dtype=qtype)
            deq = gguf.quants.dequantize(packed, qtype).reshape(stored.shape)
        expected[hf] = torch.from_numpy(_unpermute(deq, heads) if heads else deq.copy())

    add("token_embd.weight", "model.embed_tokens.weight", rng.normal(0, 0.5, (V, H)), Q.Q8_0)
    for i in range(L):
        p, hp = f"blk.{i}.", f"model.layers.{i}."
        add(p + "attn_norm.weight", hp + "input_layernorm.weight", 1 + 0.1 * rng.normal(size=H))
        add(p + "attn_q.weight", hp + "self_attn.q_proj.weight", rng.normal(0, 0.3, (NQ * D, H)), Q.Q4_1, NQ)
        add(p + "attn_k.weight", hp + "self_attn.k_proj.weight", rng.normal(0, 0.3, (NKV * D, H)), Q.Q4_1, NKV)
        add(p + "attn_v.weight", hp + "self_attn.v_proj.weight", rng.normal(0, 0.3, (NKV * D, H)), Q.Q4_1)
        add(p + "attn_output.weight", hp + "self_attn.o_proj.weight", rng.normal(0, 0.3, (H, NQ * D)), Q.Q4_1)
        add(p + "ffn_norm.weight", hp + "post_attention_layernorm.weight", 1 + 0.1 * rng.normal(size=H))
        add(p + "ffn_gate.weight", hp + "mlp.gate_proj.weight", rng.normal(0, 0.3, (F, H)), Q.Q4_1)
        add(p + "ffn_up.weight", hp + "mlp.up_proj.weight", rng.normal(0, 0.3, (F, H)), Q.Q4_1)
        add(p + "ffn_down.weight", hp + "mlp.down_proj.weight", rng.normal(0, 0.3, (H, F)), Q.Q4_1)
    add("output_norm.weight", "model.norm.weight", 1 + 0.1 * rng.normal(size=H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600,
                          check=False)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    expected = write_tiny_gguf(d / "tiny.gguf")
    out = d / "hf"
    done = run(out, "--gguf", d / "tiny.gguf")
    assert done.returncode == 0, done.stderr
    return d, out, expected, done


def test_directory_is_plain_hf_with_dequantized_weights(converted):
    _, out, expected, _ = converted
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg
    shape = (cfg["architectures"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"])
    assert shape == (["LlamaForCausalLM"], NQ, NKV, F)
    assert cfg["tie_word_embeddings"] is True
    saved = load_file(str(out / "model.safetensors"))
    assert set(saved) == set(expected)
    for key, want in expected.items():
        torch.testing.assert_close(saved[key], want, rtol=0, atol=1e-6, msg=key)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0]  # the GGUF's eos (<|im_end|>), then <|endoftext|>
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert "<|im_start|>" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert tok.eos_token == "<|im_end|>"
    assert json.loads((out / "tokenizer_config.json").read_text())["add_bos_token"] is False
    assert tok("hi the").input_ids[0] != tok.bos_token_id  # the GGUF says: no BOS


def test_longctx_logits_match_transformers_gguf_model(converted):
    d, out, _, done = converted
    check = json.loads((out / "longctx_check.json").read_text())
    assert check["ok"] and check["max_abs_logit_diff"] <= LOGIT_TOL
    assert check["greedy_equal"]
    assert "max |logit diff|" in done.stdout
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(d), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ours = longctx.load_pretrained(out, dtype=torch.float32).eval()
    x = torch.randint(0, ref.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x).logits, rtol=0, atol=LOGIT_TOL)


def test_existing_out_is_refused_then_replaced_with_overwrite(converted):
    d, out, _, _ = converted
    (out / "config.json").write_text("{}")  # a marker: a refused run leaves it
    done = run(out, "--gguf", d / "tiny.gguf")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [(f"error: {out}: already exists; pass --overwrite to replace it, "
                                                 "or choose another OUT")]
    assert (out / "config.json").read_text() == "{}"
    done = run(out, "--gguf", d / "tiny.gguf", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert not [p for p in d.iterdir() if p.name.startswith(".hf.")]  # no temporaries left


def test_missing_gguf_is_one_line(tmp_path):
    done = run(tmp_path / "out", "--gguf", tmp_path / "none.gguf")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: --gguf {tmp_path / 'none.gguf'}: no such file"
    assert not (tmp_path / "out").exists()
