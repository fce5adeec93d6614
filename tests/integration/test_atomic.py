"""longctx/storage/atomic.py: a result file or directory is the old one or the new one, never a mix;
temporaries of dead writers are removed by the next writer, a live writer's are kept."""
import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from longctx.base.errors import UserError
from longctx.storage import atomic

HOST = socket.gethostname()


def _dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _siblings(directory, name):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{name}."))


def test_replacing_writes_whole_and_follows_the_umask(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    old_umask = os.umask(0o022)
    try:
        atomic.write_json(path, {"a": 1})
    finally:
        os.umask(old_umask)
    assert json.loads(path.read_text()) == {"a": 1}
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert _siblings(tmp_path, "results.json") == []


def test_replacing_keeps_the_old_content_on_an_exception(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"complete": true}\n')
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic.replacing(path) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(atomic.temp_sibling_name(path))
            tmp.write_text('{"compl')
            raise RuntimeError("writer failed")
    assert path.read_text() == '{"complete": true}\n'
    assert _siblings(tmp_path, "results.json") == []


def test_replacing_creates_the_parent(tmp_path):
    path = tmp_path / "a" / "b" / "report.md"
    atomic.write_text(path, "# report\n")
    assert path.read_text() == "# report\n"


def test_write_lines_is_json_lines(tmp_path):
    path = atomic.write_lines(tmp_path / "x.jsonl", [{"index": 0, "pred": "é"}, {"index": 1}])
    assert path.read_text() == '{"index": 0, "pred": "\\u00e9"}\n{"index": 1}\n'


@pytest.mark.parametrize("name,host,pid", [
    (".results.json.tmp-node-12.cluster.local-4242-ab_c9x", "node-12.cluster.local", 4242),
    (".hf.old-gpu7-77-0a1b2c3d", "gpu7", 77),
    (".my.dir.tmp-h-1-z", "h", 1),
])
def test_names_parse_with_owner_of(tmp_path, name, host, pid):
    holder = atomic.owner_of(tmp_path / name)
    assert (holder.host, holder.pid) == (host, pid)


@pytest.mark.parametrize("name", ["results.json", ".results.json.tmp", ".hf.tmp-abc123xy", ".x.tmp-host-pid-1",
                                  ".x.tmp-host-12-UPPER"])
def test_other_names_have_no_owner(tmp_path, name):
    assert atomic.owner_of(tmp_path / name) is None


def test_the_names_this_module_makes_parse_to_this_process(tmp_path):
    with atomic.replacing(tmp_path / "f.csv") as tmp:
        holder = atomic.owner_of(tmp)
    made = atomic.make_temp_dir(tmp_path / "out")
    for h in (holder, atomic.owner_of(made)):
        assert (h.host, h.pid) == (HOST, os.getpid())


def test_remove_stale_removes_dead_writers_and_keeps_live_ones_and_our_own(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead_file = tmp_path / f".results.json.tmp-{HOST}-{_dead_pid()}-abc12345"
        dead_dir = tmp_path / f".hf.tmp-{HOST}-{_dead_pid()}-xyz"
        live_file = tmp_path / f".results.json.tmp-{HOST}-{live.pid}-abc12345"
        ours = tmp_path / f".results.json.tmp-{HOST}-{os.getpid()}-abc12345"
        other_host = tmp_path / f".results.json.tmp-not-{HOST}-{_dead_pid()}-abc12345"
        unrelated = tmp_path / ".results.json.tmp"
        for f in (dead_file, live_file, ours, other_host, unrelated):
            f.write_text("partial")
        dead_dir.mkdir()
        (dead_dir / "model.safetensors").write_bytes(b"\0" * 100)
        notes = []
        removed = atomic.remove_stale(tmp_path, notes.append)
        assert sorted(removed) == sorted([dead_file, dead_dir])
        assert not dead_file.exists() and not dead_dir.exists()
        assert live_file.exists() and ours.exists() and other_host.exists() and unrelated.exists()
        assert len(notes) == 2 and all(n.startswith("removed ") and "no longer running" in n for n in notes)
        assert any(str(dead_dir) in n for n in notes)
    finally:
        live.kill()
        live.wait()


def test_remove_stale_with_a_name_touches_only_that_name(tmp_path):
    pid = _dead_pid()
    mine = tmp_path / f".hf.tmp-{HOST}-{pid}-a"
    other = tmp_path / f".results.json.tmp-{HOST}-{pid}-a"
    mine.mkdir()
    other.write_text("x")
    assert atomic.remove_stale(tmp_path, name="hf") == [mine]
    assert other.exists()


def test_remove_stale_renames_back_an_old_directory_whose_swap_did_not_finish(tmp_path):
    """A swap without RENAME_EXCHANGE killed between its renames: NAME is missing, the old
    directory is aside, the new one is a temporary. The old comes back; the new one goes."""
    pid = _dead_pid()
    aside = tmp_path / f".hf.old-{HOST}-{pid}-0a1b2c3d"
    new = tmp_path / f".hf.tmp-{HOST}-{pid}-zz"
    for d, text in ((aside, "old"), (new, "new")):
        d.mkdir()
        (d / "config.json").write_text(text)
    notes = []
    assert atomic.remove_stale(tmp_path, notes.append, name="hf") == [new]
    assert (tmp_path / "hf" / "config.json").read_text() == "old"
    assert _siblings(tmp_path, "hf") == []
    assert any(n.startswith("restored ") and str(tmp_path / "hf") in n for n in notes)


def _tree(d):
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


def _dirs(old_files, new_files, tmp_path):
    path = tmp_path / "hf"
    path.mkdir()
    for name, text in old_files.items():
        (path / name).write_text(text)
    new = atomic.make_temp_dir(path)
    for name, text in new_files.items():
        (new / name).write_text(text)
    return new, path


def test_swap_directory_exchanges_the_whole_directory(tmp_path, monkeypatch):
    calls = []
    exchange = atomic._exchange
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: calls.append((a, b)) or exchange(a, b))
    new, path = _dirs({"config.json": "old", "stale.safetensors": "old"},
                      {"config.json": "new", "m.safetensors": "new"},
                      tmp_path)
    atomic.swap_directory(new, path)
    assert calls == [(new, path)]
    assert _tree(path) == {"config.json": "new", "m.safetensors": "new"}
    assert _siblings(tmp_path, "hf") == []


def test_swap_directory_without_exchange_renames_the_old_aside(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    new, path = _dirs({"config.json": "old", "stale.safetensors": "old"}, {"config.json": "new"}, tmp_path)
    atomic.swap_directory(new, path)
    assert _tree(path) == {"config.json": "new"}
    assert _siblings(tmp_path, "hf") == []


def test_swap_directory_into_a_new_path_is_a_rename(tmp_path):
    new = atomic.make_temp_dir(tmp_path / "hf")
    (new / "config.json").write_text("new")
    atomic.swap_directory(new, tmp_path / "hf")
    assert _tree(tmp_path / "hf") == {"config.json": "new"} and _siblings(tmp_path, "hf") == []


def test_make_temp_dir_follows_the_umask(tmp_path):
    old_umask = os.umask(0o022)
    try:
        made = atomic.make_temp_dir(tmp_path / "out")
    finally:
        os.umask(old_umask)
    assert oct(made.stat().st_mode & 0o777) == "0o755"
    assert made.name.startswith(atomic.temp_sibling_name(tmp_path / "out"))


def test_a_full_disk_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "results.json"
    with pytest.raises(UserError) as info:
        with atomic.user_errors(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "the disk (or quota) is full" in message
    assert " free" in message


def test_a_library_error_naming_an_errno_is_a_write_error(tmp_path):
    """safetensors reports a full disk as SafetensorError('... (os error 28)')."""
    class SafetensorError(Exception):
        pass

    with pytest.raises(UserError, match="the disk \\(or quota\\) is full"):
        with atomic.user_errors(tmp_path / "model.safetensors"):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    with pytest.raises(UserError, match=r"cannot write .*out \(Permission denied\)"):
        with atomic.user_errors(tmp_path / "out"):
            raise PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(ValueError):  # not a write failure: stays what it is
        with atomic.user_errors(tmp_path / "out"):
            raise ValueError("a bug")


def test_result_file_clears_a_dead_writers_temporary_of_that_file_with_a_note(tmp_path, capsys):
    pid = _dead_pid()
    stale = tmp_path / f".results.json.tmp-{HOST}-{pid}-abc"
    other = tmp_path / f".report.md.tmp-{HOST}-{pid}-abc"
    stale.write_text("half")
    other.write_text("half")
    atomic.write_result(tmp_path / "results.json", "{}\n")
    assert capsys.readouterr().err == (f"note: removed {stale}, left by pid {pid} on {HOST}, "
                                       "which is no longer running\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "results.json"]
    with pytest.raises(UserError, match="cannot write .*results.json: the disk"):
        with atomic.result_file(tmp_path / "results.json") as tmp:
            tmp.write_text("{")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert (tmp_path / "results.json").read_text() == "{}\n"


def test_an_hf_save_clears_what_a_killed_save_of_that_directory_left(tmp_path, capsys):
    from helpers.model import tiny_model
    from longctx.model.hf import load_pretrained, save_pretrained

    stale = tmp_path / f".hf.tmp-{HOST}-{_dead_pid()}-abc"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\0" * 64)
    save_pretrained(tiny_model(), tmp_path / "hf")
    assert f"note: removed {stale}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    load_pretrained(tmp_path / "hf")


def test_a_failure_on_the_temporary_names_the_file_asked_for(tmp_path):
    path = tmp_path / "results.json"
    temp = tmp_path / (atomic.temp_sibling_name(path) + "abc")
    with pytest.raises(UserError) as info:
        with atomic.user_errors(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(temp))
    assert str(info.value) == f"cannot write {path} (Permission denied)"
