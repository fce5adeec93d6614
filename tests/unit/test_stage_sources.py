"""Per-stage data sources (`stages[i].sources`): a stage trains on its own mix, the others on
data.sources; bad stage sources are named by their stage; a synthetic `tasks` mix given in a
config replaces the default mix instead of being merged into it."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from longctx.base.errors import UserError
from longctx.config import load_config, resolve_stages, validate_config
from longctx.data import load_tokenizer
from longctx.data.synthetic_config import DEFAULT_TASKS, SyntheticConfig
from longctx.train.stages import build_stage_loader


def _config(tmp_path, stage0_sources):
    cfg = {
        "out_dir": str(tmp_path / "run"),
        "data": {"seq_len": 256, "micro_batch_size": 4,
                 "sources": [{"name": "mix", "kind": "synthetic", "packing": "pad",
                              "synthetic": {"num_keys": 3, "length_min_ratio": 0.9}}]},
        "train": {"answer_loss_weight": 10.0},
        "stages": [{"name": "warm", "seq_len": 192, "steps": 2, "sources": stage0_sources},
                   {"name": "main", "seq_len": 256, "steps": 2}],
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    return path


PASSKEY_ONLY = [{"name": "warm", "kind": "synthetic", "packing": "pad", "synthetic": {"tasks": {"passkey": 1.0}}}]


def test_a_config_task_mix_replaces_the_default_mix(tmp_path):
    cfg = load_config(str(_config(tmp_path, PASSKEY_ONLY)))
    warm, main = (s.data.sources[0].synthetic for s in resolve_stages(cfg))
    assert warm.task_mix() == {"passkey": 1.0}  # not {niah: 0.6, multivalue: 0.2, passkey: 1.0}
    assert main.task_mix() == DEFAULT_TASKS == SyntheticConfig().task_mix()
    assert resolve_stages(cfg)[0].data.seq_len == 192
    assert resolve_stages(cfg)[1].data.sources[0].synthetic.num_keys == 3  # data.sources


def test_each_stage_loader_reads_its_own_sources(tmp_path):
    cfg = load_config(str(_config(tmp_path, PASSKEY_ONLY)))
    tok = load_tokenizer("byte")
    texts = {}
    for si in (0, 1):
        batch = next(iter(build_stage_loader(resolve_stages(cfg)[si], cfg.train.seed, tok, dp_rank=0, dp_size=1)))
        assert batch["input_ids"].shape == (4, cfg.stages[si].seq_len)
        assert "answer_mask" in batch  # answer tokens are weighted in this config
        texts[si] = [tok.decode(row.tolist()) for row in batch["input_ids"]]
    assert all("What is the pass key?" in t for t in texts[0])
    assert any("special magic number" in t for t in texts[1])


def test_bad_stage_sources_are_named_by_their_stage(tmp_path):
    bad = [{"name": "warm", "kind": "synthetic", "synthetic": {"tasks": {"qa": 1.0}}}]
    with pytest.raises(UserError, match=r"^stages\[0\]\.sources\[0\]\.synthetic\.tasks: unknown task 'qa'"):
        validate_config(load_config(str(_config(tmp_path, bad))), world_size=1)
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match=r"^stages\[0\]\.sources: empty"):
        validate_config(load_config(str(_config(tmp_path, []))), world_size=1)
