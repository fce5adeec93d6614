"""Exports of every family and RoPE type, and what transformers makes of them: the cases, our
logits, and their logits in the installed transformers (this process) and in the oldest one
pyproject.toml allows (a second interpreter running helpers/hf_export_logits.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from helpers.hf_export_logits import run_cases
from helpers.model import FAMILY_CASES, HEAD_DIM, ROPE_CASES, tiny_model
from helpers.transformers_overlay import full_version, transformers_floor, transformers_overlay
from longctx import save_pretrained

LOGITS_SCRIPT = Path(__file__).with_name("hf_export_logits.py")
TOL = 1e-5  # fp32
T = 24  # tokens per input


@dataclass(frozen=True)
class ExportCase:
    name: str
    family: str
    rope: dict  # rope_parameters
    overrides: dict = field(default_factory=dict)  # further ModelConfig fields
    # first positions of the second and third inputs: past the original length of the tests' RoPE
    # (32) but not past max_position_embeddings where that is 64, then past both
    mid: int = 40
    far: int = 100

    def model(self, seed: int):
        return tiny_model("default", "gqa", seed=seed,
                          **{**FAMILY_CASES[self.family], "rope_parameters": dict(self.rope), **self.overrides})


def _matrix() -> list[ExportCase]:
    cases = []
    for family in FAMILY_CASES:
        for rope, params in ROPE_CASES.items():
            # longrope's factor lists are head_dim/2 long: keep the tests' head_dim for Qwen3 too
            over = {"head_dim": HEAD_DIM} if rope == "longrope" else {}
            if rope == "dynamic":
                over["max_position_embeddings"] = 32  # dynamic NTK grows past max_position_embeddings
            cases.append(ExportCase(f"{family}-{rope}", family, params, over))
    return cases


_YARN_32K = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}
_LONGROPE = ROPE_CASES["longrope"]
CASES: list[ExportCase] = _matrix() + [
    # Qwen's YaRN x4 from 32k, exported at 64k: max_position_embeddings / original (2) is not the factor (4)
    ExportCase("qwen2-yarn4-32k-at-64k", "qwen2", _YARN_32K, {"max_position_embeddings": 65536}, 40000, 65000),
    ExportCase("qwen3-yarn4-32k-at-64k", "qwen3", _YARN_32K, {"max_position_embeddings": 65536}, 40000, 65000),
    # longrope whose factor (and so attention scale) is not max_position_embeddings / original
    ExportCase("llama-longrope-factor4-at-2x", "llama", {**_LONGROPE, "factor": 4.0}, {"max_position_embeddings": 64}),
    ExportCase("qwen2-longrope-factor4-at-2x", "qwen2", {**_LONGROPE, "factor": 4.0},
               {"max_position_embeddings": 64}),
    # windows as config.json spells them (no shorter than the positions: longctx refuses a window it would cut)
    ExportCase("mistral-window-yarn", "mistral", ROPE_CASES["yarn"], {"sliding_window": 128}),
    ExportCase("qwen2-window-per-layer-longrope", "qwen2", _LONGROPE,
               {"sliding_window": 128, "layer_types": ["full_attention", "sliding_attention"]}),
    ExportCase("qwen3-window-per-layer-llama3-tied", "qwen3", ROPE_CASES["llama3"],
               {"sliding_window": 128, "layer_types": ["full_attention", "sliding_attention"],
                "tie_word_embeddings": True}),
]


def _inputs(case: ExportCase, seed: int) -> list[dict]:
    """Three inputs to one loaded model, from position 0, `mid` and `far`: longrope's short and
    long factors and where it switches, dynamic NTK's base as it grows, YaRN far out."""
    ids = torch.randint(0, 128, (2, T), generator=torch.Generator().manual_seed(seed))  # (B, T)
    starts = [(torch.arange(T) + start).expand(2, T).tolist() for start in (case.mid, case.far)]
    return [{"input_ids": ids.tolist(), "position_ids": pos} for pos in [None, *starts]]


@dataclass
class Exported:
    case: ExportCase
    dir: Path
    inputs: list[dict]
    logits: list[torch.Tensor]  # ours, one (B, T, V) per input
    inv_freq: torch.Tensor  # ours, (head_dim/2,) after the last input
    attention_scaling: float  # ours, after the last input


def export_all(root: Path, cases: list[ExportCase] = CASES) -> list[Exported]:
    """Each case saved with save_pretrained under root/NAME, with our logits on its inputs."""
    out = []
    for seed, case in enumerate(cases):
        model = case.model(seed).eval()
        directory = root / case.name
        save_pretrained(model, directory)
        inputs = _inputs(case, seed)
        with torch.no_grad():
            logits = [model(torch.tensor(x["input_ids"]),
                            position_ids=None if x["position_ids"] is None else torch.tensor(x["position_ids"]))
                      for x in inputs]
        out.append(Exported(case, directory, inputs, logits, model.rotary.inv_freq.clone(),
                            float(model.rotary.attention_scaling)))
    return out


def _case_files(exported: list[Exported], work: Path) -> list[dict]:
    return [{"dir": str(e.dir), "inputs": e.inputs, "out": str(work / f"{e.case.name}.pt")} for e in exported]


def compare(exported: list[Exported], report: dict, work: Path) -> list[dict]:
    """Per case: the largest |logit difference| over its inputs, the largest relative difference of
    the RoPE frequencies, the attention scales, and what failed."""
    rows = []
    for e, got in zip(exported, report["cases"]):
        row = {"case": e.case.name, "family": e.case.family, "rope_type": e.case.rope["rope_type"],
               "transformers": report["transformers"], "attention_scaling_ours": e.attention_scaling}
        if "error" in got:
            rows.append({**row, "ok": False, "error": got["error"]})
            continue
        theirs = torch.load(work / f"{e.case.name}.pt")
        diff = max((a - b).abs().max().item() for a, b in zip(e.logits, theirs))
        freq = ((torch.tensor(got["inv_freq"]) - e.inv_freq).abs() / e.inv_freq).max().item()
        row.update(max_abs_logit_diff=diff, inv_freq_max_rel_diff=freq,
                   attention_scaling_theirs=got["attention_scaling"], hf_class=got["class"])
        row["ok"] = diff <= TOL and freq <= 1e-6 and abs(got["attention_scaling"] - e.attention_scaling) <= 1e-6
        rows.append(row)
    return rows


def load_in_this_process(exported: list[Exported], work: Path) -> list[dict]:
    """The installed transformers (the newest pyproject allows, as the suite installs it)."""
    return compare(exported, run_cases(_case_files(exported, work)), work)


def load_in_version(exported: list[Exported], work: Path, version: Optional[str] = None) -> list[dict]:
    """This interpreter with transformers==version (default: the oldest the test extra allows) ahead
    of the installed one on its path."""
    version = version or transformers_floor()
    overlay = transformers_overlay(version)
    cases_file, report_file = work / "cases.json", work / "report.json"
    cases_file.write_text(json.dumps(_case_files(exported, work)))
    env = {**os.environ, "PYTHONPATH": str(overlay), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(LOGITS_SCRIPT), str(cases_file), str(report_file)], env=env,
                         capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"{LOGITS_SCRIPT.name} under transformers {version} failed:\n"
                           f"{run.stderr[-4000:]}")
    report = json.loads(report_file.read_text())
    if report["transformers"] != full_version(version):
        raise RuntimeError(f"the overlay {overlay} gave transformers {report['transformers']}, not {version}")
    return compare(exported, report, work)
