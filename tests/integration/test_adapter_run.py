"""An adapter run through the real trainer: torchrun at cp 2 writes the merged export and the
PEFT adapter, its checkpoints record the adapter and the base's hash, and a resume from the
middle on another layout (one process, ZeRO-0) ends with the uninterrupted run's adapter;
`longctx export --adapter` of a checkpoint without model/ gives the same adapter, and its
DeepSpeed files hold the trained tensors only (the merged model rebuilds the base from the record);
`longctx eval --model RUN` of the run scores its merged export and, without it, its checkpoint
(the base rebuilt, the adapter merged as it loads) alike, and says which it read."""
import json

import torch
from safetensors.torch import load_file

import longctx
from helpers.train import TINY, metrics, run_train
from longctx.checkpoint.safe_load import load_checkpoint_file
from longctx.commands.cli import main

ADAPTER = "train.adapter={r: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj], trainable: [embed_tokens, norm]}"
# a RULER-style task, its generated ids compared, and perplexity (tiny: 2 samples at 256 tokens)
EVAL = ["--tasks", "passkey", "--lengths", "256", "--style", "compact", "--samples", "2", "--max-new-tokens", "4",
        "--suite", "ppl", "--ppl-windows", "1", "--no-progress"]
COMMON = [*TINY, "data.seq_len=128", "data.micro_batch_size=2", "train.steps=4", "optim.lr=3e-3",
          "optim.schedule=constant", "checkpoint.every=2", "checkpoint.keep_last=2", ADAPTER]


def _ok(res):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_adapter_run_exports_records_and_resumes_on_another_layout(tmp_path, capsys):
    full = tmp_path / "full"
    _ok(run_train(2, [f"out_dir={full}", *COMMON, "parallel.cp_size=2", "parallel.zero_stage=2",
                      "checkpoint.export_hf=true"]))
    adapter = load_file(full / "adapter" / "adapter_model.safetensors")
    config = json.loads((full / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["modules_to_save"] == ["embed_tokens", "norm"]
    assert any(k.endswith("down_proj.lora_B.weight") for k in adapter)
    assert "base_model.model.lm_head.weight" not in adapter
    merged = longctx.load_pretrained(full / "hf")  # the merged model loads as a plain model
    assert merged.config.num_hidden_layers == 2
    saved = json.loads((full / "checkpoints" / "step_0000002" / "trainer_state.json").read_text())["adapter"]
    assert saved["r"] == 4 and len(saved["base_sha256"]) == 64

    resumed = tmp_path / "resumed"
    _ok(run_train(1, [f"out_dir={resumed}", *COMMON, "train.grad_accum=1", "parallel.zero_stage=0",
                      f"checkpoint.resume={full / 'checkpoints' / 'step_0000002'}", "checkpoint.export_hf=true"]))
    again = load_file(resumed / "adapter" / "adapter_model.safetensors")
    assert set(again) == set(adapter)
    worst = max((again[k] - adapter[k]).abs().max().item() for k in adapter)
    assert worst <= 1e-5, worst
    # steps 3-4 of both runs: the same losses, and they moved the model (not two copies of step 2)
    steps = {r["step"]: r["loss"] for r in metrics(full)}
    again_steps = {r["step"]: r["loss"] for r in metrics(resumed)}
    assert sorted(again_steps) == [3, 4] and abs(steps[4] - steps[2]) > 1e-3
    assert all(abs(again_steps[s] - steps[s]) <= 1e-5 for s in (3, 4)), (steps, again_steps)
    assert torch.equal(merged.layers[0].self_attn.k_proj.weight,
                       longctx.load_pretrained(resumed / "hf").layers[0].self_attn.k_proj.weight)

    # a checkpoint without model/ (ZeRO-0 here): `longctx export --adapter` rebuilds the PEFT
    # adapter from its DeepSpeed files, and the merged model consolidates from them
    ckpt = resumed / "checkpoints" / "step_0000004"
    assert not (ckpt / "model").exists()
    # ... and no copy of the frozen base: the trained tensors only (the base is named by its hash)
    module = load_checkpoint_file(ckpt / "ds" / "mp_rank_00_model_states.pt")["module"]
    assert module and all(".lora_" in k or "embed_tokens" in k or k.endswith("norm.weight") for k in module)
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "peft"), "--adapter"]) == 0
    rebuilt = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    assert all(torch.equal(rebuilt[k], again[k]) for k in again)
    consolidated, exported = longctx.load_pretrained(ckpt).state_dict(), longctx.load_pretrained(resumed / "hf")
    assert all(torch.equal(v, consolidated[k]) for k, v in exported.state_dict().items())

    # `longctx eval --model RUN`: the run's merged export (hf/, newer than its checkpoints), then,
    # with hf/ moved away, its newest checkpoint (no model/): the base rebuilt from the record and
    # the adapter merged as it loads; both say which they read, and score the same
    results = {}
    for form in ("merged export", "base + adapter"):
        out = tmp_path / f"eval-{len(results)}"
        capsys.readouterr()
        assert main(["eval", "--model", str(resumed), *EVAL, "--out", str(out)]) == 0
        said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("adapter run:")]
        results[form] = json.loads((out / "results.json").read_text())
        assert results[form]["meta"]["adapter"]["loaded"] == form and len(said) == 1, said
        assert said[0] in (out / "report.md").read_text()
        if form == "merged export":
            (resumed / "hf").rename(tmp_path / "hf-aside")
    merged, on_base = results["merged export"], results["base + adapter"]
    assert merged["meta"]["model"] == str(resumed / "hf") and on_base["meta"]["model"] == str(ckpt)
    assert on_base["meta"]["adapter"]["base_sha256"] == saved["base_sha256"]
    assert [s["generated_ids"] for s in on_base["samples"]] == [s["generated_ids"] for s in merged["samples"]]
    assert len(merged["samples"]) == 2 and all(len(s["generated_ids"]) > 0 for s in merged["samples"])
    nll = [(a["nll"], b["nll"]) for a, b in zip(on_base["ppl"]["rows"], merged["ppl"]["rows"])]
    assert len(nll) == 1 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in nll), nll
