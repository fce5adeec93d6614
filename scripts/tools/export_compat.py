"""Every export case of the suite's compatibility test (tests/helpers/export_compat.py: each
family with each RoPE type, Qwen's YaRN x4 from 32k at 64k, longrope with its own factor,
windowed configs) exported by longctx and loaded by transformers' AutoModelForCausalLM in the
installed transformers and in other versions (default: the oldest pyproject.toml's test extra
allows); prints one row per case and version (largest |logit difference| in fp32 over three
inputs, largest relative difference of the RoPE frequencies, the attention scales) and writes
them as JSON.

    .venv/bin/python scripts/tools/export_compat.py --json docs/results/2026-12-06-export-compat.json
    .venv/bin/python scripts/tools/export_compat.py --versions 4.56.0,5.0.0

Exit 1 when any case fails to load or differs by more than 1e-5. Each other version is installed
into the venv on first use (tests/helpers/transformers_overlay.py; pip needs the package index).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.export_compat import TOL, export_all, load_in_this_process, load_in_version  # noqa: E402
from helpers.transformers_overlay import transformers_floor  # noqa: E402


def _row(r: dict) -> str:
    if "error" in r:
        return (f"| {r['case']} | {r['transformers']} | - | - | {r['attention_scaling_ours']:.6f} | - | "
                f"{r['error'][:80]} |")
    verdict = "ok" if r["ok"] else "DIFFERS"
    return (f"| {r['case']} | {r['transformers']} | {r['max_abs_logit_diff']:.2e} | {r['inv_freq_max_rel_diff']:.1e} | "
            f"{r['attention_scaling_ours']:.6f} | {r['attention_scaling_theirs']:.6f} | {verdict} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--versions", default=None,
                    help="comma-separated transformers versions to load with besides the installed one "
                         "(default: the test extra's floor)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: a second thread only waits
    versions = args.versions.split(",") if args.versions else [transformers_floor()]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        exported = export_all(tmp / "exports")
        rows = []
        for version in versions:
            (tmp / version).mkdir()
            rows += load_in_version(exported, tmp / version, version)
        (tmp / "installed").mkdir()
        rows += load_in_this_process(exported, tmp / "installed")
    print("| case | transformers | max abs logit diff | inv_freq max rel diff | attention scale (longctx) "
          "| (transformers) | result |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(_row(r))
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} loads within {TOL:g} "
          f"(transformers floor in pyproject.toml: {transformers_floor()})")
    if args.json:
        args.json.write_text(json.dumps({"tolerance": TOL, "rows": rows}, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
