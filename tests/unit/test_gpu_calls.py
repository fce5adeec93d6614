"""The device calls against the lending rules, on CPU (scripts/gpu/gpu_calls.py, gpu_pack.py,
gpu_env.sh): every call of the plan fits (carried files counted at their caps where they are not
built here), the rules catch a call that does not, docs/gpu.md shows the plan as it is, and a
call's output folder comes back whole: at most 8 files, none in folders, the summary printed from
disk after a step ran out of time
(tests/integration/test_gpu_call_limits.py: the last, which runs a call script)."""
import importlib.util
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"


def load(name):
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


calls = load("gpu_calls")
pack = load("gpu_pack")


def test_the_rules_refuse_a_call_that_does_not_fit():
    report = calls.Report()
    check = calls.CALLS["check"]
    budget = calls.Script.read(check.script).budget_s
    calls.check_call(replace(check, timeout_s=budget + 30), 4.0, False, report)  # under the 60 s margin
    assert any(line.startswith("  FAIL budget") for line in report.lines)
    big = calls.Carried(".whl/nothing-here", 61.0, "a wheel too big")
    report = calls.Report()
    calls.check_call(replace(check, carry=(big,)), 4.0, False, report)
    assert any(line.startswith("  FAIL payload") for line in report.lines)
    report = calls.Report()
    calls.check_call(replace(check, carry=(big,)), 1.0, True, report)  # --strict: a missing file fails
    assert any("FAIL carries" in line for line in report.lines)


def test_each_step_limit_and_setting_is_read_from_the_script():
    script = calls.Script.read("gpu_smollm2_32k.sh", "train")
    assert [name for name, _ in script.steps] == ["text", "train", "trained-ppl", "trained-ruler"]
    assert calls.Script.read("gpu_smollm2_32k.sh", "zero-shot").steps[0] == ("model", 90)
    assert set(script.env) == {"INSTALL_S", "KILL_S", "SUMMARY_S"}
    with pytest.raises(ValueError, match="neither a number"):
        calls._limit("$SOMETHING")


def test_docs_show_the_plan_as_the_scripts_say():
    assert calls.plan() in (ROOT / "docs" / "gpu.md").read_text()


def test_pack_leaves_at_most_eight_files_and_no_folders(tmp_path):
    out = tmp_path / "OUT" / "check"
    (out / "cells" / "yarn8" / "deep").mkdir(parents=True)
    for i in range(12):
        (out / f"log{i}.txt").write_text(f"log {i}\n")
    (out / "cells" / "yarn8" / "deep" / "cell.json").write_text("{}")
    (out / "summary.md").write_text("| table |\n")
    names = pack.pack(out, ["summary.md", "log3.txt", "missing.json"])
    assert names == ["log3.txt", "rest.tar.gz", "summary.md"]
    with tarfile.open(out / "rest.tar.gz") as tar:
        members = set(tar.getnames())
    assert "cells/yarn8/deep/cell.json" in members and "log0.txt" in members and "log3.txt" not in members
    report = calls.returned(tmp_path / "OUT")
    assert report.failed == 0, report.lines


def test_returned_flags_what_the_device_would_drop(tmp_path):
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "too-deep.txt").write_text("x")
    (tmp_path / "a" / "bad name.txt").write_text("x")
    report = calls.returned(tmp_path)
    assert report.failed == 2
