"""`longctx export` as a process: bad checkpoints fail with one `error:` line (exit 2, nothing
written), as they do through the API, and a bf16 export round-trips."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from helpers.model import tiny_model
from longctx.base.errors import UserError
from longctx.model.hf import load_pretrained, save_pretrained


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "longctx", *args], capture_output=True, text=True, cwd=cwd)


def _write_dir(tmp_path, config=None, tensors=None):
    d = tmp_path / "bad"
    d.mkdir()
    model = tiny_model("default", "gqa")
    save_pretrained(model, d)
    if config is not None:
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(config)
        (d / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        save_file(tensors, str(d / "model.safetensors"))
    return d


BAD_CASES = {
    "missing dir": (lambda p: p / "nope", "does not exist"),
    "no weights": (lambda p: (_write_dir(p), (p / "bad" / "model.safetensors").unlink())[0], "no weights found"),
    "not llama": (lambda p: _write_dir(p, {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}),
                  "GPT2LMHeadModel"),
    "shape mismatch": (lambda p: _write_dir(p, {"intermediate_size": 100}), "has shape"),
    "unknown rope field": (lambda p: _write_dir(p, {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4,
                                                                        "factor": 2.0, "fctor": 2}}),
                           "'fctor'"),
    "incomplete rope": (lambda p: _write_dir(p, {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4,
                                                                     "factor": 8.0}}),
                        "low_freq_factor"),
    "unknown rope type": (lambda p: _write_dir(p, {"rope_parameters": {"rope_type": "ntk-by-parts",
                                                                       "rope_theta": 1e4}}),
                          "ntk-by-parts"),
    "rope factor < 1": (lambda p: _write_dir(p, {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4,
                                                                     "factor": 0.5}}),
                        "factor"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_api_and_cli(tmp_path, case):
    make, needle = BAD_CASES[case]
    src = make(tmp_path)
    with pytest.raises(UserError, match=needle):
        load_pretrained(src)
    out = tmp_path / "out"
    res = _cli("export", "--checkpoint", str(src), "--out", str(out))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists() and not list(tmp_path.glob(".out*"))  # nothing written


def test_cli_export_round_trip(tmp_path):
    model = tiny_model("yarn", "gqa")
    save_pretrained(model, tmp_path / "src")
    res = _cli("export", "--checkpoint", str(tmp_path / "src"), "--out", str(tmp_path / "dst"), "--dtype", "bfloat16")
    assert res.returncode == 0, res.stderr
    loaded = load_pretrained(tmp_path / "dst")
    assert loaded.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight.bfloat16())
