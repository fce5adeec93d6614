"""EvalConfig through the training config's loader: the example files, the order of the layers
(defaults < --config < key=value < flags), comma lists, and one-line errors naming eval.<field>."""
from pathlib import Path

import pytest
import torch

from longctx.base.errors import UserError
from longctx.commands.cli import build_parser
from longctx.commands.eval import config_from_args
from longctx.config import load_structured
from longctx.eval.config import EvalConfig, select
from longctx.eval.model_io import eval_device

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "configs" / "eval").glob("*.yaml"))


def _args(*argv):
    args, extra = build_parser().parse_known_args(["eval", *argv])
    args.overrides += extra
    return args


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_configs_load_and_select(path):
    cfg = load_structured(EvalConfig, str(path), prefix="eval.")
    run = select(cfg)
    assert (run.lengths and (run.tasks or run.ppl_lengths)) or (cfg.suite == ["none"] and cfg.lm_eval)
    assert cfg.model


def test_layers_flags_over_overrides_over_file(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text("samples: 3\nlengths: 4k,8k\nstyle: compact\ntasks: passkey\n")
    cfg = config_from_args(_args("--config", str(f), "samples=5", "eval.seed=7"))
    assert (cfg.samples, cfg.seed, cfg.style, cfg.tasks, cfg.lengths) == (5, 7, "compact", ["passkey"], ["4k", "8k"])
    cfg = config_from_args(_args("--config", str(f), "samples=5", "--samples", "9", "--lengths", "1k,2k"))
    assert cfg.samples == 9 and select(cfg).lengths == [1024, 2048]


def test_a_file_may_nest_its_fields_under_eval(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text("eval:\n  samples: 4\n  max-batch-tokens: 2048\n")
    cfg = load_structured(EvalConfig, str(f), prefix="eval.")
    assert (cfg.samples, cfg.max_batch_tokens) == (4, 2048)


@pytest.mark.parametrize("overrides, message", [
    (["sampels=3"], "eval.sampels: unknown key; did you mean 'eval.samples'?"),
    (["samples=many"], "eval.samples: must be an integer, got 'many'"),
    (["threshold=high"], "eval.threshold: must be a number, got 'high'"),
    (["save_inputs=maybe"], "eval.save_inputs: must be true or false, got 'maybe'"),
])
def test_bad_values_name_the_eval_field(overrides, message):
    with pytest.raises(UserError) as e:
        load_structured(EvalConfig, None, overrides, prefix="eval.")
    assert str(e.value).startswith(message)


def _validated(*overrides, world=1):
    cfg = load_structured(EvalConfig, None, ["model=m", "out=null", *overrides], prefix="eval.")
    cfg.validate(world)
    return cfg


@pytest.mark.parametrize("cuda, overrides, message", [
    (False, ["device=gpu"], "eval.device: 'gpu' is not valid; valid: auto, cpu, cuda"),
    (False, ["device=cuda"], "eval.device: cuda, but this process sees no CUDA device; valid here: auto, cpu"),
    (True, ["device=cpu", "cp=2"], "eval.device: cpu with eval.cp=2 on a machine with CUDA"),
])
def test_the_device_is_checked_before_any_work(cuda, overrides, message, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    with pytest.raises(UserError) as e:
        _validated(*overrides, world=2)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("overrides, message", [
    (["timeout_s=0"], "eval.timeout_s: must be a finite number of seconds > 0, got 0.0"),
    (["timeout_s=-5"], "eval.timeout_s: must be a finite number of seconds > 0, got -5.0"),
    (["startup_timeout_s=inf"], "eval.startup_timeout_s: must be a finite number of seconds > 0, got inf"),
    (["startup_timeout_s=soon"], "eval.startup_timeout_s: must be a number, got 'soon'"),
])
def test_bad_timeouts_name_the_eval_field(overrides, message):
    with pytest.raises(UserError) as e:
        _validated(*overrides)
    assert str(e.value).startswith(message)
    assert _validated("timeout_s=20", "startup_timeout_s=600").timeout_s == 20.0


def test_auto_evaluates_on_this_ranks_gpu_when_there_is_one(monkeypatch):
    assert eval_device("auto", 3) == torch.device("cpu") == eval_device("cpu", 0)  # this machine has no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert eval_device("auto", 3) == torch.device("cuda", 1) == eval_device("cuda", 1)
    assert eval_device("cpu", 3) == torch.device("cpu")
    assert _validated("device=cuda").device == "cuda"
