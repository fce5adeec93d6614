"""The wheel as a user outside the clone gets it: built from the repo, installed into a fresh
virtualenv in another directory, then `--help`, a recipe dry run by name and a 2-step train.

The fresh virtualenv reaches the dependencies (torch, DeepSpeed, ...) through a path entry to
the test environment's site-packages (a `.pth` line: its own .pth files, among them the repo's
editable install, are not read), so the test installs nothing from the network; longctx itself
comes from the wheel alone (checked)."""
import json
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

from helpers.train import TINY

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd, cwd, timeout=600):
    started = time.time()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return res, time.time() - started


def test_the_wheel_works_outside_the_clone(tmp_path):
    src, dist, venv, home = tmp_path / "src", tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    home.mkdir()
    # a copy of the sources, so the build leaves nothing in the checkout and nothing built earlier gets in
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "runs", "__pycache__", ".pytest_cache"))
    res, _ = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                   str(src)], cwd=home)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = dist.glob("longctx-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "longctx/recipes/cpu/yarn-llama2-7b-128k.yaml" in names and "longctx/recipes/eval/ruler-128k.yaml" in names

    res, _ = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=home)
    assert res.returncode == 0, res.stderr
    python = venv / "bin" / "python"
    res, _ = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                   str(wheel)], cwd=home)
    assert res.returncode == 0, res.stderr[-3000:]
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    res, _ = _run([str(python), "-c", "import longctx; print(longctx.__file__)"], cwd=home)
    assert res.stdout.startswith(str(venv)), res.stdout + res.stderr  # the wheel's copy, not the repo's

    longctx = str(venv / "bin" / "longctx")
    timings = {}
    for args in (["--help"], ["--version"], ["train", "--help"], ["recipes"]):
        res, timings[" ".join(args)] = _run([longctx, *args], cwd=home)
        assert res.returncode == 0 and res.stderr == "", res.stderr
    assert "cpu/yarn-llama2-7b-128k" in res.stdout
    res, _ = _run([longctx, "train", "--config", "recipe:cpu/yarn-llama2-7b-128k", "--dry-run"], cwd=home)
    assert res.returncode == 0, res.stderr[-3000:]
    res, _ = _run([longctx, "train", "--config", "recipe:nope"], cwd=home)
    assert res.returncode == 2 and res.stderr.startswith("error: --config: no recipe 'nope'")
    res, timings["train 2 steps"] = _run([longctx, "train", *TINY, "train.steps=2", "out_dir=run"], cwd=home)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in (home / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    print("wall time (s): " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
