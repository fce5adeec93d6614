"""Export, eval and load_pretrained from a checkpoint with no model/ export (checkpoint.save_hf:
false, as every configs/cpu recipe ships) in a run with no hf/ (as a preempted run leaves it).

Each CPU recipe trains one step per stage with its own layout (2 ranks, its cp size, its ZeRO
stage; one more run of a recipe at ZeRO-0), then:
- `longctx export` consolidates the ZeRO shards with the model config the checkpoint records;
  transformers' AutoModelForCausalLM + AutoTokenizer load the export, its logits match
  longctx's model on the same ids, and generate() runs and decodes;
- `longctx eval` (one sample) and `longctx.load_pretrained` read the checkpoint itself.
Logit tolerance: 1e-4 absolute, as tests/unit/test_model_checkpoint.py uses for fp32. Both sides
hold the same fp32 weights; they may order floating-point operations differently (attention
kernel, RoPE tables), which changes these logits (|logit| < 1) by rounding only.
"""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import longctx
from helpers.recipes import CPU_RECIPES, ROOT, cluster, one_step_per_stage
from helpers.train import env, train_cmd
from longctx.checkpoint import manifest
from longctx.checkpoint.model import RECORD_CONFIG, RECORD_TOKENIZER
from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.data.tokenizer import load_tokenizer

LOGITS_TOL = 1e-4
# the offload recipes' layouts (ZeRO-2/3 at cp 2) are the other recipes'; an offload changes no checkpoint.
# The adapter recipe's export from a checkpoint without model/ is tests/integration/test_adapter_run.py's.
SKIPPED_RECIPES = ("llama3-8b-128k-2gpu.yaml", "llama3-8b-1m.yaml", "llama3-8b-128k-lora.yaml")
RUNS = [(name, ()) for name in CPU_RECIPES if name not in SKIPPED_RECIPES] + [
    ("prolong-llama3-8b-64k.yaml", ("parallel.zero_stage=0",))]
TEXT = "The grass is green. Le café est fermé — 日本語 🙂\nThe pass key is 71432. "


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "longctx", *args], capture_output=True, text=True, env=env(),
                          timeout=600)


@pytest.fixture(scope="module", params=RUNS, ids=lambda r: r[0].removesuffix(".yaml") + "".join(
    "-" + o.replace("parallel.", "").replace("=", "") for o in r[1]))
def run(request, tmp_path_factory):
    """(run dir, its last checkpoint, the resolved config) of a recipe trained here."""
    name, overrides = request.param
    recipe = ROOT / "configs" / "cpu" / name
    tmp = tmp_path_factory.mktemp(name.removesuffix(".yaml"))
    config, out = one_step_per_stage(recipe, tmp), tmp / "run"
    args = ["--config", str(config), f"out_dir={out}", "log.progress=false", "checkpoint.export_hf=false", *overrides]
    res = subprocess.run(train_cmd(int(cluster(recipe)["gpus_per_node"]), args), capture_output=True, text=True,
                         env=env(), timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    ckpt = sorted((out / "checkpoints").glob("step_*"))[-1]
    assert not (ckpt / "model").exists() and not (out / "hf").exists()  # the case under test
    return out, ckpt, load_config(str(config), [f"out_dir={out}", *overrides])


@pytest.fixture(scope="module")
def export(run, tmp_path_factory):
    """`longctx export --checkpoint <the checkpoint> --out <new dir>` (the command as the issue ran it)."""
    _, ckpt, _ = run
    directory = tmp_path_factory.mktemp("export") / "hf"
    res = _cli("export", "--checkpoint", str(ckpt), "--out", str(directory))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "consolidating the ZeRO shards" in res.stdout
    return directory


def test_export_loads_in_transformers_and_generates(run, export):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, ckpt, cfg = run
    last_stage = stage_model_config(resolve_stages(cfg)[-1])
    config = json.loads((export / "config.json").read_text())
    assert config["rope_parameters"] == last_stage.rope_parameters  # the model the checkpoint holds
    assert config["max_position_embeddings"] == last_stage.max_position_embeddings

    byte = load_tokenizer("byte")
    tokenizer = AutoTokenizer.from_pretrained(export)
    ids = tokenizer(TEXT)["input_ids"]
    assert ids == byte.encode(TEXT, add_bos=True)
    assert tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    generation = json.loads((export / "generation_config.json").read_text())
    for key, want in (("bos_token_id", byte.bos_id), ("eos_token_id", byte.eos_id), ("pad_token_id", byte.pad_id)):
        assert config[key] == generation[key] == getattr(tokenizer, key) == want

    hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    ours = longctx.load_pretrained(ckpt, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        hf_logits, our_logits = hf(x).logits, ours(x)
    assert (hf_logits - our_logits).abs().max().item() <= LOGITS_TOL

    with torch.no_grad():
        generated = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False)
    new = generated[0, len(ids):].tolist()
    assert generated[0, :len(ids)].tolist() == ids and 1 <= len(new) <= 8
    assert tokenizer.decode(new, skip_special_tokens=True) == byte.decode(new)
    top2 = our_logits[0, -1].topk(2).values
    if (top2[0] - top2[1]).item() > 2 * LOGITS_TOL:  # not a tie within the tolerance: greedy agrees
        assert new[0] == our_logits[0, -1].argmax().item()


def test_eval_and_load_pretrained_read_the_checkpoint(run, tmp_path):
    out, ckpt, _ = run
    res = _cli("eval", "--model", str(out), "--tasks", "passkey", "--lengths", "256", "--style", "compact",
               "--samples", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "eval"), "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["meta"]["model"] == str(ckpt) and results["meta"]["tokenizer"] == "byte"
    assert results["summary"]["tasks"]["passkey"]["samples"] == {"256": 1}
    from_run, from_ckpt = longctx.load_pretrained(out), longctx.load_pretrained(ckpt)
    assert from_run.config == from_ckpt.config
    assert all(torch.equal(a, b) for a, b in zip(from_run.state_dict().values(), from_ckpt.state_dict().values()))


def test_checkpoint_without_recorded_model_exports_from_its_run_config(run, export, tmp_path):
    """A checkpoint written before the trainer recorded its model (and with an empty model/):
    export reads the run's resolved_config.yaml and gives the same export; load_pretrained
    says what reads it."""
    out, ckpt, _ = run
    old_run = tmp_path / "old" / "run"
    old_run.mkdir(parents=True)
    (old_run / "resolved_config.yaml").write_text((out / "resolved_config.yaml").read_text())
    old = old_run / "checkpoints" / ckpt.name
    shutil.copytree(ckpt, old)
    (old / "model").mkdir()
    state = json.loads((old / "trainer_state.json").read_text())
    del state[RECORD_CONFIG], state[RECORD_TOKENIZER]
    (old / "trainer_state.json").write_text(json.dumps(state))
    body = json.loads((old / manifest.MANIFEST).read_text())  # the manifest such a checkpoint has
    body["files"]["trainer_state.json"] = {"size": (old / "trainer_state.json").stat().st_size,
                                           "sha256": manifest.sha256_file(old / "trainer_state.json")}
    (old / manifest.MANIFEST).write_text(json.dumps(body))

    res = _cli("export", "--checkpoint", str(old_run), "--out", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == json.loads((export / "config.json").read_text())
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    expected = load_file(str(export / "model.safetensors"))
    assert exported.keys() == expected.keys() and all(torch.equal(exported[k], expected[k]) for k in expected)
    with pytest.raises(longctx.UserError, match="resolved_config.yaml"):
        longctx.load_pretrained(old)
