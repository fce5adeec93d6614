"""Every export loads with longctx's logits in the oldest transformers that pyproject.toml allows
and in the installed (newest) one: each family with each RoPE type, Qwen's YaRN x4 from 32k
exported at 64k, longrope with its own factor, and windows (helpers/export_compat.py has the
cases). The oldest version runs in a second interpreter, installed once into the venv."""
import json

import pytest
import torch

from helpers.export_compat import CASES, export_all, load_in_this_process, load_in_version
from helpers.transformers_overlay import full_version, transformers_floor
from longctx.model.hf_config import read_hf_config


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_all(tmp_path_factory.mktemp("exports"))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: a second intra-op thread only waits for the first, and badly on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _failures(rows):
    return [r for r in rows if not r["ok"]]


def test_exports_load_with_our_logits_in_the_installed_transformers(exported, tmp_path):
    rows = load_in_this_process(exported, tmp_path)
    assert len(rows) == len(CASES) and not _failures(rows), json.dumps(_failures(rows), indent=1)


def test_exports_load_with_our_logits_in_the_oldest_transformers_allowed(exported, tmp_path):
    rows = load_in_version(exported, tmp_path)  # the test extra's floor
    assert {r["transformers"] for r in rows} == {full_version(transformers_floor())}
    assert len(rows) == len(CASES) and not _failures(rows), json.dumps(_failures(rows), indent=1)


def test_an_export_reads_back_as_its_config_and_spells_rope_for_both_versions(exported):
    by_name = {e.case.name: e for e in exported}
    for e in exported:
        assert read_hf_config(e.dir) == e.case.model(0).config, e.case.name
    yarn = json.loads((by_name["qwen3-yarn4-32k-at-64k"].dir / "config.json").read_text())
    assert yarn["max_position_embeddings"] == 65536 and yarn["rope_theta"] == 1e6
    for key in ("rope_parameters", "rope_scaling"):  # longctx reads the first, transformers (4.x, 5.x) the second
        assert yarn[key]["factor"] == 4.0 and yarn[key]["original_max_position_embeddings"] == 32768
    longrope = json.loads((by_name["llama-longrope-factor4-at-2x"].dir / "config.json").read_text())
    assert longrope["original_max_position_embeddings"] == 32  # 4.x reads it only at the top level
    assert longrope["rope_scaling"]["attention_factor"] == by_name["llama-longrope-factor4-at-2x"].attention_scaling
    assert "attention_factor" not in longrope["rope_parameters"]  # what the user configured, as configured
    plain = json.loads((by_name["llama-longrope"].dir / "config.json").read_text())
    assert "factor" not in plain["rope_parameters"] and plain["rope_scaling"]["factor"] == 128 / 32
