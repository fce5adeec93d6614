"""Faults a long run meets, through the real trainer: NaN loss / weights, corrupt checkpoints,
a full disk and a write failing on one rank mid-save (a DeepSpeed build killed mid-way: test_build_locks.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import longctx
from helpers.train import TINY, env, free_port, metrics

FAULTS = Path(__file__).resolve().parents[1] / "helpers" / "fault_injection.py"


def _run(nproc, overrides, faults=None, timeout=300, extra_env=None):
    """The CLI with test faults injected (tests/helpers/fault_injection.py), under torchrun for nproc > 1."""
    script = [str(FAULTS), "train", *overrides]
    cmd = ([sys.executable, *script] if nproc == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(free_port()), *script])
    e = env()
    e.update({f"LONGCTX_FAULT_{k}": str(v) for k, v in (faults or {}).items()})
    e.update(extra_env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


def _error_lines(res):
    return [line for line in res.stderr.splitlines() if line.startswith("error:")]


def _strict_records(out):
    """metrics.jsonl parsed by a strict reader (NaN / Infinity tokens rejected)."""
    def reject(token):
        raise ValueError(f"non-strict JSON token {token}")
    return [json.loads(line, parse_constant=reject) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _ckpts(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def _model_weights(ckpt):
    return load_file(str(ckpt / "model" / "model.safetensors"))


def test_nan_loss_stop_policy_exits_3_keeps_finite_checkpoints_and_resumes(tmp_path):
    out = tmp_path / "run"
    base = [*TINY, f"out_dir={out}", "checkpoint.every=1", "checkpoint.keep_last=2", "checkpoint.save_hf=true"]
    res = _run(1, [*base, "train.steps=8"], faults={"NAN_LOSS_STEPS": "3,4,5"})
    assert res.returncode == 3, res.stderr[-3000:]
    errors = _error_lines(res)
    assert len(errors) == 1 and "non-finite loss" in errors[0] and "step 5" in errors[0], res.stderr[-2000:]
    assert "3 consecutive" in errors[0] and "Traceback" not in res.stderr
    assert (out / "NONFINITE").read_text().strip() == "5"
    records = _strict_records(out)
    bad = [r for r in records if r.get("skipped")]
    assert [r["step"] for r in bad] == [3, 4, 5]
    assert all(r["loss"] is None and "loss" in r["nonfinite"] for r in bad)
    # checkpoints of the dropped steps hold the last good weights, bit for bit; nothing at step 5
    assert _ckpts(out) == ["step_0000003", "step_0000004"]
    w3, w4 = (_model_weights(out / "checkpoints" / c) for c in _ckpts(out))
    assert all(torch.isfinite(t).all() for t in w4.values())
    assert all(torch.equal(w3[k], w4[k]) for k in w3)
    # resume=auto continues from the finite step-4 checkpoint and trains to the end
    res = _run(1, [*base, "train.steps=8", "checkpoint.resume=auto"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in (out / "logs" / "rank_00000.log").read_text()
    tail = [r for r in _strict_records(out)][-3:]
    assert [r["step"] for r in tail] == [6, 7, 8] and all(r["loss"] is not None for r in tail)
    assert not (out / "NONFINITE").exists()


def test_nan_on_one_rank_skip_step_policy_all_ranks_agree(tmp_path):
    """ZeRO-2 bf16, world 2: only rank 1's loss is NaN; both ranks drop the same updates."""
    out = tmp_path / "run"
    res = _run(2, [*TINY, f"out_dir={out}", "train.steps=6", "train.nonfinite=skip_step", "parallel.zero_stage=2",
                   "train.dtype=bfloat16", "checkpoint.every=2"], faults={"NAN_LOSS_STEPS": "3,4", "RANK": 1})
    assert res.returncode == 0, res.stderr[-3000:]
    records = _strict_records(out)
    assert [r["step"] for r in records if r["skipped"]] == [3, 4]
    assert all(r["loss"] is not None and r["grad_norm"] is not None for r in records if not r["skipped"])
    assert _ckpts(out) == ["step_0000004", "step_0000006"]
    for log in ("rank_00000.log", "rank_00001.log"):
        assert "Traceback" not in (out / "logs" / log).read_text()


def test_nonfinite_weights_are_never_checkpointed_nor_rotate_a_good_one_out(tmp_path):
    out = tmp_path / "run"
    res = _run(1, [*TINY, f"out_dir={out}", "train.steps=4", "checkpoint.every=1", "checkpoint.keep_last=1"],
               faults={"NAN_WEIGHT_STEP": 2})
    assert res.returncode == 3, res.stderr[-3000:]
    errors = _error_lines(res)
    assert len(errors) == 1 and "non-finite weights at step 2" in errors[0], res.stderr[-2000:]
    assert "step_0000001" in errors[0]  # names the checkpoint that is still good
    assert _ckpts(out) == ["step_0000001"]


def _short_run(out, steps=4, nproc=1, extra=()):
    res = _run(nproc, [*TINY, f"out_dir={out}", f"train.steps={steps}", "checkpoint.every=1",
                       "checkpoint.keep_last=4", *extra])
    assert res.returncode == 0, res.stderr[-3000:]
    return metrics(out)


def test_corrupt_checkpoint_resume_falls_back_and_an_explicit_one_is_named(tmp_path):
    out = tmp_path / "run"
    first = _short_run(out)
    ckpt = out / "checkpoints"
    model_states = ckpt / "step_0000004" / "ds" / "mp_rank_00_model_states.pt"
    with open(model_states, "r+b") as f:  # truncated, as by a full disk or an interrupted copy
        f.truncate(model_states.stat().st_size // 2)
    state = ckpt / "step_0000003" / "trainer_state.json"
    text = state.read_text()
    state.write_text(text.replace('"step": 3', '"step": 9'))  # same size, different bytes
    explicit = _run(1, [*TINY, f"out_dir={tmp_path / 'other'}", "train.steps=5",
                        f"checkpoint.resume={ckpt / 'step_0000004'}"])
    assert explicit.returncode == 2
    errors = _error_lines(explicit)
    assert len(errors) == 1 and "step_0000004" in errors[0] and "mp_rank_00_model_states.pt" in errors[0]
    assert not (tmp_path / "other").exists()  # a size mismatch is caught before any work
    explicit = _run(1, [*TINY, f"out_dir={tmp_path / 'other'}", "train.steps=5",
                        f"checkpoint.resume={ckpt / 'step_0000003'}"])  # hashes: checked by the ranks
    assert explicit.returncode == 2 and len(_error_lines(explicit)) == 1, explicit.stderr[-2000:]
    assert "step_0000003" in _error_lines(explicit)[0] and "trainer_state.json" in _error_lines(explicit)[0]
    res = _run(1, [*TINY, f"out_dir={out}", "train.steps=4", "checkpoint.every=1", "checkpoint.keep_last=4",
                   "checkpoint.resume=auto"])
    assert res.returncode == 0, res.stderr[-3000:]
    warning = [line for line in res.stderr.splitlines() if "resuming from" in line]
    assert len(warning) == 1 and "step_0000002" in warning[0]
    assert "step_0000004" in warning[0] and "ds/mp_rank_00_model_states.pt" in warning[0]
    assert "step_0000003" in warning[0] and "trainer_state.json" in warning[0]
    resumed = metrics(out)
    # steps 3 and 4 re-run from the step-2 checkpoint give the losses of the first run exactly
    assert [r["loss"] for r in resumed[2:4]] == [r["loss"] for r in first[2:4]]
    assert resumed[-1]["step"] == 4


def test_export_and_eval_refuse_incomplete_or_corrupt_checkpoints(tmp_path):
    out = tmp_path / "run"
    _short_run(out, steps=2, extra=["checkpoint.save_hf=true"])
    ckpt = out / "checkpoints" / "step_0000002"
    (ckpt / "COMPLETE").rename(ckpt / "COMPLETE.bak")
    for argv in (["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")],
                 ["export", "--checkpoint", str(ckpt / "model"), "--out", str(tmp_path / "hf")],
                 ["eval", "--model", str(ckpt), "--tasks", "passkey", "--lengths", "256", "--samples", "1",
                  "--out", str(tmp_path / "ev")]):
        res = subprocess.run([sys.executable, "-m", "longctx", *argv], capture_output=True, text=True, env=env())
        assert res.returncode == 2, res.stderr[-2000:]
        assert len(_error_lines(res)) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert "COMPLETE" in _error_lines(res)[0] and str(ckpt) in _error_lines(res)[0]
    (ckpt / "COMPLETE.bak").rename(ckpt / "COMPLETE")
    weights = ckpt / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    res = subprocess.run([sys.executable, "-m", "longctx", "export", "--checkpoint", str(out), "--out",
                          str(tmp_path / "hf")], capture_output=True, text=True, env=env())
    assert res.returncode == 2 and "model/model.safetensors" in _error_lines(res)[0]
    assert not (tmp_path / "hf").exists()


def test_export_never_deletes_what_it_did_not_write(tmp_path):
    out = tmp_path / "run"
    _short_run(out, steps=1, extra=["checkpoint.save_hf=true"])
    target = tmp_path / "serve"
    target.mkdir()
    (target / "README.md").write_text("team notes")
    (target / "model-00001-of-00002.safetensors").write_text("stale shard of an earlier export")
    before = sorted(p.name for p in target.iterdir())
    argv = ["export", "--checkpoint", str(out), "--out", str(target)]
    res = subprocess.run([sys.executable, "-m", "longctx", *argv], capture_output=True, text=True, env=env())
    assert res.returncode == 2 and "--overwrite" in _error_lines(res)[0] and str(target) in _error_lines(res)[0]
    assert sorted(p.name for p in target.iterdir()) == before
    old_umask = os.umask(0o022)
    try:
        res = subprocess.run([sys.executable, "-m", "longctx", *argv, "--overwrite"], capture_output=True,
                             text=True, env=env())
    finally:
        os.umask(old_umask)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "config.json", "generation_config.json",
                                                        "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert (target / "README.md").read_text() == "team notes"
    assert {oct(p.stat().st_mode & 0o777) for p in target.iterdir()} == {"0o644"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".serve.tmp-")]
    fresh = tmp_path / "fresh"
    res = subprocess.run([sys.executable, "-m", "longctx", "export", "--checkpoint", str(out), "--out", str(fresh)],
                         capture_output=True, text=True, env=env())
    assert res.returncode == 0 and oct(fresh.stat().st_mode & 0o777) == "0o755"
    longctx.load_pretrained(fresh)


def test_a_write_failing_on_one_rank_mid_save_ends_cleanly_on_every_rank(tmp_path):
    """ZeRO-1, world 2: rank 1's optimizer shard write fails inside DeepSpeed's save of step 2."""
    out = tmp_path / "run"
    res = _run(2, [*TINY, f"out_dir={out}", "train.steps=4", "checkpoint.every=1", "parallel.zero_stage=1"],
               faults={"SAVE_OSERROR": 28, "SAVE_STEP": 2, "RANK": 1}, timeout=240)
    assert res.returncode != 0
    errors = _error_lines(res)
    assert len(errors) == 1, res.stderr[-3000:]
    assert "cannot save step 2" in errors[0] and "rank 1" in errors[0] and "disk" in errors[0]
    assert "step_0000001 newest" in errors[0]
    assert _ckpts(out) == ["step_0000001"]  # no partial .tmp-step_0000002 left, step 1 intact
    assert (out / "checkpoints" / "step_0000001" / "COMPLETE").is_file()


def _can_mount_tmpfs(where: Path) -> str:
    where.mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {where}"],
                           capture_output=True, text=True)
    return "" if probe.returncode == 0 else (probe.stderr.strip() or "unshare/mount failed")


def test_disk_full_during_a_save(tmp_path):
    """A 3 MB tmpfs in a private mount namespace: the first checkpoint (~1.9 MB) fits, the
    second does not. One line naming the path and the full disk; nothing partial is left."""
    disk = tmp_path / "disk"
    why = _can_mount_tmpfs(disk)
    if why:
        pytest.skip(f"cannot make a size-limited file system here: {why}")
    out = disk / "run"
    overrides = " ".join([*TINY, f"out_dir={out}", "train.steps=3", "checkpoint.every=1", "checkpoint.keep_last=3"])
    script = (f"mount -t tmpfs -o size=3m tmpfs {disk} && "
              f"{sys.executable} -m longctx train {overrides}; echo \"rc=$?\"; "
              f"find {out / 'checkpoints'} -mindepth 1 -maxdepth 2 -printf '%P\\n' | sort")
    res = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env(),
                         timeout=300)
    lines = res.stdout.splitlines()
    assert "rc=2" in lines, res.stdout + res.stderr[-3000:]
    errors = _error_lines(res)
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "cannot save step 2" in errors[0] and "disk" in errors[0] and str(out / "checkpoints") in errors[0]
    listed = lines[lines.index("rc=2") + 1:]
    assert [n for n in listed if "/" not in n] == ["step_0000001"], listed
    assert "step_0000001/COMPLETE" in listed and "step_0000001/MANIFEST.json" in listed
