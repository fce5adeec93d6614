"""`longctx export` under faults: SIGKILL at each step of a new export and of an --overwrite,
two exports into one --out at once, a full disk and an unwritable --out.

A kill lands at a chosen point through a driver (DRIVER below) that wraps one function of the
export (the weights write, the directory exchange, a rename of the fallback swap) to announce
the point on stdout and wait; the test then SIGKILLs it. The code paths are the command's own.
"""
import errno
import json
import math
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

import longctx
import longctx.model.hf as hf
from helpers.model import tiny_model
from helpers.train import env
from longctx.commands import cli
from longctx.model.hf import load_pretrained
from longctx.storage import atomic

HOST = socket.gethostname()
DRIVER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import longctx.model.hf as hf
    from longctx.storage import atomic
    from longctx.commands.cli import main

    point, go = sys.argv[1], Path(sys.argv[2])

    def pause(what):
        print(what, flush=True)
        while not go.exists():
            time.sleep(0.02)

    if point == "weights":  # the weights are in the temporary sibling, nothing moved yet
        real_save = hf.save_file
        def save_file(*a, **k):
            real_save(*a, **k)
            pause("weights written")
        hf.save_file = save_file
    elif point == "exchanged":  # the new directory is in place, the old one not yet removed
        real_exchange = atomic._exchange
        def exchange(a, b):
            done = real_exchange(a, b)
            pause("exchanged")
            return done
        atomic._exchange = exchange
    elif point == "set_aside":  # no RENAME_EXCHANGE: the old directory renamed aside, the new not yet in
        atomic._exchange = lambda a, b: False
        real_rename = os.rename
        def rename(src, dst):
            real_rename(src, dst)
            if ".old-" in os.path.basename(dst):
                pause("old set aside")
        os.rename = rename
    sys.exit(main(sys.argv[3:]))
""")


def _error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "longctx", *args], capture_output=True, text=True, env=env(),
                          timeout=300)


def _start(tmp_path, point, *args):
    """The export under DRIVER, stopped at `point`; returns (process, go file)."""
    go = tmp_path / f"go-{point}"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, point, str(go), "export", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env())
    return proc, go


def _wait_for(proc, line, timeout=240):
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen = []
    while sel.select(timeout):
        got = proc.stdout.readline()
        if not got:
            break
        seen.append(got)
        if got.strip() == line:
            return
    proc.kill()
    raise AssertionError(f"the driver never reached {line!r}: {seen} {proc.stderr.read()[-3000:]}")


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()


def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two HF directories whose shapes differ (intermediate_size 96 vs 64): an export whose
    config.json came from one and weights from the other does not load."""
    root = tmp_path_factory.mktemp("models")
    old, new = tiny_model("default", "gqa", seed=0), tiny_model("default", "gqa", seed=1, intermediate_size=64)
    longctx.save_pretrained(old, root / "old", tokenizer="byte")
    longctx.save_pretrained(new, root / "new", tokenizer="byte")
    return root / "old", root / "new"


def _which(out, models):
    """"old" or "new": the export in `out` loads (config.json and weights agree) and holds
    that model's weights exactly."""
    loaded = load_pretrained(out).state_dict()
    for name, src in zip(("old", "new"), models):
        ref = load_pretrained(src).state_dict()
        if loaded.keys() == ref.keys() and all(loaded[k].shape == ref[k].shape and torch.equal(loaded[k], ref[k])
                                               for k in ref):
            return name
    raise AssertionError(f"{out} holds neither export")


def _export_with_notes(tmp_path, models):
    out = tmp_path / "hf"
    res = _cli("export", "--checkpoint", str(models[0]), "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    (out / "README.md").write_text("team notes")
    (out / "eval").mkdir()
    (out / "eval" / "results.json").write_text("{}")
    return out


def test_sigkill_during_a_new_export_leaves_no_out_and_the_next_export_removes_its_temporary(tmp_path, models):
    out = tmp_path / "hf"
    proc, _ = _start(tmp_path, "weights", "--checkpoint", str(models[0]), "--out", str(out))
    _wait_for(proc, "weights written")
    pid = proc.pid
    _kill(proc)
    assert not out.exists()
    left = _siblings(out)
    temps = [n for n in left if n.startswith(f".hf.tmp-{HOST}-{pid}-")]
    assert len(temps) == 1 and (tmp_path / temps[0] / "model.safetensors").is_file()  # a full copy of the weights
    assert ".hf.lock" in left and json.loads((tmp_path / ".hf.lock").read_text())["pid"] == pid

    res = _cli("export", "--checkpoint", str(models[0]), "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    notes = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    assert any(f"removed {tmp_path / temps[0]}" in n and f"pid {pid}" in n for n in notes), res.stderr
    assert any("taking over" in n and ".hf.lock" in n and f"pid {pid}" in n for n in notes), res.stderr
    assert _siblings(out) == []
    assert _which(out, models) == "old"


@pytest.mark.parametrize("point,expect", [("weights", "old"), ("exchanged", "new"), ("set_aside", "old")])
def test_sigkill_during_overwrite_leaves_the_whole_old_or_the_whole_new_export(tmp_path, models, point, expect):
    out = _export_with_notes(tmp_path, models)
    proc, _ = _start(tmp_path, point, "--checkpoint", str(models[1]), "--out", str(out), "--overwrite")
    _wait_for(proc, {"weights": "weights written", "exchanged": "exchanged", "set_aside": "old set aside"}[point])
    _kill(proc)
    if point == "set_aside":  # both complete directories are siblings: the old aside, the new a temporary
        assert not out.exists()
        (aside,) = [tmp_path / n for n in _siblings(out) if n.startswith(".hf.old-")]
        (built,) = [tmp_path / n for n in _siblings(out) if n.startswith(".hf.tmp-")]
        assert _which(aside, models) == "old" and _which(built, models) == "new"
        assert (aside / "README.md").read_text() == "team notes"
    else:
        assert _which(out, models) == expect
        assert (out / "README.md").read_text() == "team notes" and (out / "eval" / "results.json").read_text() == "{}"

    res = _cli("export", "--checkpoint", str(models[1]), "--out", str(out), "--overwrite")
    assert res.returncode == 0, res.stderr[-2000:]
    notes = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    if point == "set_aside":
        assert any(n.startswith(f"note: restored {out} from .hf.old-") for n in notes), res.stderr
    assert any(n.startswith("note: removed ") and ".hf.tmp-" in n for n in notes), res.stderr
    assert _siblings(out) == []
    assert _which(out, models) == "new"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "eval", "generation_config.json",
                                                     "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert (out / "README.md").read_text() == "team notes"


def test_two_exports_into_one_new_out_one_succeeds_the_other_names_the_holder(tmp_path, models):
    out = tmp_path / "hf"
    first, go = _start(tmp_path, "weights", "--checkpoint", str(models[0]), "--out", str(out))
    try:
        _wait_for(first, "weights written")
        second = _cli("export", "--checkpoint", str(models[1]), "--out", str(out))
        assert second.returncode == 2, second.stderr[-2000:]
        errors = _error_lines(second.stderr)
        assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"pid {first.pid} on {HOST}" in errors[0] and str(out) in errors[0] and "another export" in errors[0]
        go.touch()
        stdout, stderr = first.communicate(timeout=240)
        assert first.returncode == 0, stderr[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert "exported" in stdout and _which(out, models) == "old"
    assert _siblings(out) == []
    again = _cli("export", "--checkpoint", str(models[1]), "--out", str(out))  # after it: refused as not empty
    assert again.returncode == 2 and "--overwrite" in _error_lines(again.stderr)[0]


def _disk_full_after(nbytes):
    """save_file writing `nbytes` of a file and then failing as safetensors does on a full disk."""
    class SafetensorError(Exception):
        pass

    def save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * nbytes)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    return save_file


def test_a_disk_full_mid_write_is_one_line_and_leaves_nothing(tmp_path, models, monkeypatch, capsys):
    monkeypatch.setattr(hf, "save_file", _disk_full_after(1000))
    out = tmp_path / "hf"
    assert cli.main(["export", "--checkpoint", str(models[0]), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(_error_lines(err)) == 1 and "Traceback" not in err, err
    assert _error_lines(err)[0].startswith(f"error: --out: cannot write {out / 'model.safetensors'}: the disk (or "
                                           "quota) is full")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_disk_full_during_overwrite_keeps_the_old_export(tmp_path, models, monkeypatch, capsys):
    out = _export_with_notes(tmp_path, models)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    monkeypatch.setattr(hf, "save_file", _disk_full_after(1000))
    assert cli.main(["export", "--checkpoint", str(models[1]), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert len(_error_lines(err)) == 1 and "the disk (or quota) is full" in err and "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert _siblings(out) == []


def test_an_export_too_big_for_the_disk_is_refused_before_writing(tmp_path, models, monkeypatch, capsys):
    monkeypatch.setattr(atomic, "free_bytes", lambda path: 5 * 2**20 // 10)  # 512 KiB; the weights are ~740 KiB
    out = tmp_path / "hf"
    assert cli.main(["export", "--checkpoint", str(models[0]), "--out", str(out)]) == 2
    line = _error_lines(capsys.readouterr().err)[0]
    assert line == f"error: --out: {out} needs ~738.5 KiB for the weights, 512.0 KiB free on its disk; " \
                   "free some space or choose another directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_unwritable_out_is_one_line(tmp_path, models, monkeypatch, capsys):
    def refuse(path, me):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    monkeypatch.setattr("longctx.storage.locks.try_take", refuse)
    out = tmp_path / "hf"
    assert cli.main(["export", "--checkpoint", str(models[0]), "--out", str(out)]) == 2
    assert _error_lines(capsys.readouterr().err) == [f"error: --out: cannot write {out} (Permission denied)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _mount_tmpfs(path, size):
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs a tmpfs mount (root)")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")


def test_a_real_full_disk_mid_export_is_one_line_and_leaves_nothing(tmp_path, models):
    """A tmpfs one block larger than the weights (and the lock): the space check passes, the
    files do not all fit."""
    need = sum(t.numel() * t.element_size() for t in load_file(str(models[0] / "model.safetensors")).values())
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, (math.ceil(need / 4096) + 2) * 4096)
    try:
        out = disk / "hf"
        res = _cli("export", "--checkpoint", str(models[0]), "--out", str(out))
        assert res.returncode == 2, res.stderr[-2000:]
        errors = _error_lines(res.stderr)
        assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
        # the file in --out (a tokenizer file's error names no file: then --out itself)
        assert errors[0].startswith(f"error: --out: cannot write {out}") and "the disk (or quota) is full" in errors[0]
        assert ".tmp-" not in errors[0]
        assert sorted(p.name for p in disk.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_sigterm_during_an_overwrite_ends_it_cleanly(tmp_path, models):
    """A cancelled job (SIGTERM) unwinds: the temporary sibling and the lock go, the old export stays."""
    out = _export_with_notes(tmp_path, models)
    proc, _ = _start(tmp_path, "weights", "--checkpoint", str(models[1]), "--out", str(out), "--overwrite")
    _wait_for(proc, "weights written")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    assert _error_lines(stderr) == [f"error: export stopped by SIGTERM; nothing of it is half-written in {out}"]
    assert "Traceback" not in stderr
    assert _siblings(out) == [] and _which(out, models) == "old"
