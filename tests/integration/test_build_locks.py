"""DeepSpeed's JIT ops: a run builds none it does not need, one process builds an op while the
others wait, and a build killed mid-way never blocks the next (longctx/parallel/ds_ops.py)."""
import subprocess
import sys
from pathlib import Path

from helpers.fake_op import NAME, FakeBuilder
from helpers.train import TINY, env, metrics
from longctx.parallel import ds_ops

FAKE_OP = Path(__file__).resolve().parents[1] / "helpers" / "fake_op.py"


def _fake_op(ext):
    """A process building the fake op until the file `go` appears in `ext`."""
    return subprocess.Popen([sys.executable, str(FAKE_OP)], env=dict(env(), TORCH_EXTENSIONS_DIR=str(ext)),
                            stdout=subprocess.PIPE, text=True)


def test_a_cpu_zero_run_builds_no_op_and_leaves_nothing(tmp_path):
    ext, tmp = tmp_path / "ext", tmp_path / "tmp"
    tmp.mkdir()
    e = dict(env(), TORCH_EXTENSIONS_DIR=str(ext), TMPDIR=str(tmp))
    res = subprocess.run([sys.executable, "-m", "longctx", "train", *TINY, "train.steps=1", "parallel.zero_stage=2",
                          f"out_dir={tmp_path / 'run'}"], env=e, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(metrics(tmp_path / "run")) == 1
    assert not ext.exists() or not any(ext.iterdir())  # nothing built, no lock
    assert "built successfully" not in res.stdout + res.stderr and "shm" not in res.stdout + res.stderr
    assert [p.name for p in tmp.iterdir() if p.name.startswith("longctx")] == []


def test_one_process_builds_while_the_other_waits(tmp_path):
    ext = tmp_path / "ext"
    first = _fake_op(ext)
    assert first.stdout.readline().startswith("building DeepSpeed's fake_op op")
    second = _fake_op(ext)
    assert second.stdout.readline().startswith(f"waiting for DeepSpeed's build of {NAME} by pid {first.pid} on ")
    (ext / "go").touch()
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0
    assert (ext / "builds.log").read_text().split() == [str(first.pid)]  # built once
    assert second.stdout.read() == ""  # loaded what the first built
    assert sorted(p.name for p in ext.rglob("*")) == ["builds.log", NAME, f"{NAME}.so", "go"]  # no lock left


def test_a_build_killed_mid_way_is_taken_over_at_once(tmp_path, monkeypatch):
    ext = tmp_path / "ext"
    killed = _fake_op(ext)
    while killed.stdout.readline().strip() != "building":
        pass
    killed.kill()
    killed.wait()
    torch_lock, our_lock = ext / NAME / "lock", ext / f"{NAME}.longctx-lock"
    assert torch_lock.exists() and our_lock.exists()  # what a killed build leaves behind
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    notes = []
    ds_ops.build_once(FakeBuilder(wait_for_go=False), notify=notes.append)
    assert len(notes) == 3, notes
    assert notes[0].startswith(f"taking over {our_lock}: its holder (pid {killed.pid} on ")
    assert notes[1] == f"removing {torch_lock}: no running process holds it (a build killed mid-way leaves it)"
    assert notes[2].startswith(f"building DeepSpeed's {NAME} op in {ext / NAME}")
    assert ds_ops.is_built(NAME) and not torch_lock.exists() and not our_lock.exists()


def test_a_torch_lock_held_open_by_a_live_process_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / NAME / "lock"
    lock.parent.mkdir()
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); print(1, flush=True); "
                               "time.sleep(600)", str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        notes = []
        ds_ops.clear_dead_torch_lock(NAME, notes.append)
        assert lock.exists() and notes == []  # a build in progress (not ours) is never broken
    finally:
        holder.kill()
        holder.wait()
    ds_ops.clear_dead_torch_lock(NAME, notes.append)
    assert not lock.exists() and len(notes) == 1


def test_inference_only_ops_are_marked_unneeded():
    import deepspeed.ops

    assert ds_ops.skip_unused_ops() == ["deepspeed_shm_comm"]
    assert deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] is False
    assert ds_ops.offload_builders(offload_optimizer=False) == []
