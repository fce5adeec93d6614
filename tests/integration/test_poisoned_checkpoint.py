"""A checkpoint handed over by someone else cannot run code: each kind of torch file longctx or
DeepSpeed loads (a rank's trainer state, DeepSpeed's model states and optimizer partitions),
replaced by a pickle that calls os.system, with MANIFEST.json updated to match, is refused by
every command that reads it -- resume on the same layout, resume on another layout (DeepSpeed's
universal conversion), export and eval -- with one error line naming the file, exit 2, the
payload never run and nothing written."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from helpers.train import TINY, env, run_train
from longctx.checkpoint.manifest import MANIFEST, sha256_file

CKPT = "checkpoints/step_0000002"
BASE = [*TINY, "train.steps=2", "checkpoint.every=2", "parallel.zero_stage=1"]


class _Payload:
    """Unpickling it runs `touch <marker>`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("poison") / "run"
    res = run_train(1, [*BASE, f"out_dir={out}"])
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _poisoned(run, tmp_path, name):
    """A copy of the run whose checkpoint file `name` runs the payload when unpickled, its manifest
    entry rewritten to match (so only the unpickler stands between the file and the machine)."""
    out = tmp_path / "run"
    shutil.copytree(run, out)
    ckpt = out / CKPT
    marker = tmp_path / "PAYLOAD_RAN"
    torch.save({"module": {}, "state": _Payload(marker)}, ckpt / name)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["files"][name] = {"size": (ckpt / name).stat().st_size, "sha256": sha256_file(ckpt / name)}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    return out, marker


def _longctx(*args):
    return subprocess.run([sys.executable, "-m", "longctx", *args], capture_output=True, text=True, timeout=300,
                          env=env())


def _refused(res, out, name, marker):
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {out / CKPT / name}: refused: it names posix.system"), last
    assert "Traceback" not in res.stderr
    assert not marker.exists()  # the payload never ran


@pytest.mark.parametrize("name", ["rank_00000.pt", "ds/mp_rank_00_model_states.pt",
                                  "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt"])
def test_resume_refuses_a_poisoned_file(run, tmp_path, name):
    out, marker = _poisoned(run, tmp_path, name)
    before = (out / "metrics.jsonl").read_text()
    _refused(run_train(1, [*BASE, "train.steps=3", f"out_dir={out}", "checkpoint.resume=auto"]), out, name, marker)
    assert (out / "metrics.jsonl").read_text() == before and not (out / "checkpoints" / "step_0000003").exists()


def test_a_resume_on_another_layout_refuses_before_the_universal_conversion(run, tmp_path):
    name = "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    out, marker = _poisoned(run, tmp_path, name)
    res = run_train(1, [*BASE, "parallel.zero_stage=2", "train.steps=3", f"out_dir={out}", "checkpoint.resume=auto"])
    _refused(res, out, name, marker)
    assert not list((out / "checkpoints").glob(".universal*"))


@pytest.mark.parametrize("command", ["export", "eval"])
def test_export_and_eval_of_a_checkpoint_refuse_a_poisoned_partition(run, tmp_path, command):
    """The run saved no model/ (checkpoint.save_hf false): both read the weights from ds/."""
    name = "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    out, marker = _poisoned(run, tmp_path, name)
    target = tmp_path / "target"
    if command == "export":
        res = _longctx("export", "--checkpoint", str(out / CKPT), "--out", str(target))
    else:
        res = _longctx("eval", "--model", str(out / CKPT), "--tokenizer", "byte", "--tasks", "passkey",
                       "--lengths", "128", "--samples", "1", "--style", "compact", "--out", str(target))
    _refused(res, out, name, marker)
    assert not target.exists()
