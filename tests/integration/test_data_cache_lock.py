"""The data.cache_dir build lock is judged by its holder's liveness: a build SIGKILLed mid-way
never blocks the next one (its lock and temporary directory are taken over at once, with a
notice), and a live build is waited for with a line naming it."""
import os
import subprocess
import sys
import textwrap
import threading
import time

from helpers.data import make_texts, write_jsonl
from helpers.train import env

BUILD = textwrap.dedent("""
    import os, sys, time
    from longctx.data import ByteTokenizer, DataConfig, SourceConfig, build_loader
    from longctx.data import cache

    path, cache_dir, marker, go = sys.argv[1:5]
    real = cache._write_rows

    def stalled(packer, directory, *a):
        open(marker, "w").write(directory)
        while not os.path.exists(go):  # killed here, mid-build (or let go by the test)
            time.sleep(0.05)
        return real(packer, directory, *a)

    cache._write_rows = stalled
    cfg = DataConfig(sources=[SourceConfig(name="docs", path=path)], seq_len=64, micro_batch_size=2,
                     cache_dir=cache_dir, progress=False, prefetch=0)
    batch = next(iter(build_loader(cfg, ByteTokenizer(), dp_rank=0, dp_size=1, seed=0)))
    print("rows", tuple(batch["input_ids"].shape))
""")


def _build(tmp_path, go, name: str):
    """A process building the cache of a.jsonl; it stops mid-build until the file `go` exists."""
    e = dict(env(), XDG_CACHE_HOME=str(tmp_path / "xdg"), HF_DATASETS_CACHE=str(tmp_path / "hf"))
    marker = tmp_path / f"{name}.started"
    proc = subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path / "a.jsonl"), str(tmp_path / "cache"),
                             str(marker), str(go)], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, marker


def _lines(stream, into: list) -> threading.Thread:
    t = threading.Thread(target=lambda: into.extend(iter(stream.readline, "")), daemon=True)
    t.start()
    return t


def _wait_for(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_a_killed_build_is_taken_over_at_once(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", make_texts(200, seed=2))
    killed, marker = _build(tmp_path, tmp_path / "never", "killed")
    _wait_for(marker, killed)
    tmp_dir = marker.read_text()
    killed.kill()
    killed.wait()
    cache = tmp_path / "cache"
    (lock,) = cache.glob("*.lock")
    assert os.path.isdir(tmp_dir)  # what the kill leaves: the lock and a half-built directory

    (tmp_path / "go").touch()
    again, _ = _build(tmp_path, tmp_path / "go", "again")
    out, err = again.communicate(timeout=300)  # a wait on the dead holder would run into this
    assert again.returncode == 0, err[-3000:]
    assert out.strip() == "rows (2, 64)"
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert notes[0].startswith(f"note: taking over {lock}: its holder (pid {killed.pid} on ")
    assert notes[0].endswith("is no longer running")
    assert notes[1] == (f"note: removed {tmp_dir}, left by pid {killed.pid} on {os.uname().nodename}, "
                        "which is no longer running")
    built = [p for p in cache.iterdir()]
    assert len(built) == 1 and (built[0] / "meta.json").exists()  # no lock, no temporary directory left


def test_a_live_build_is_waited_for_with_a_line_naming_it(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", make_texts(200, seed=2))
    go = tmp_path / "go"
    first, marker = _build(tmp_path, go, "first")
    _wait_for(marker, first)
    second, second_marker = _build(tmp_path, go, "second")
    err2 = []
    reader = _lines(second.stderr, err2)
    deadline = time.monotonic() + 120
    while not any(line.startswith("note: waiting") for line in err2):
        assert second.poll() is None and time.monotonic() < deadline, err2
        time.sleep(0.1)
    go.touch()  # the first build goes on and finishes; the second reads its result
    out1, err1 = first.communicate(timeout=300)
    out2 = second.stdout.read()
    assert second.wait(timeout=300) == 0 and first.returncode == 0, err1[-2000:] + "".join(err2)[-2000:]
    reader.join(timeout=60)
    assert out1 == out2 == "rows (2, 64)\n"
    assert not second_marker.exists()  # the second built nothing
    (note,) = [line for line in err2 if line.startswith("note: ")]
    (cache_dir,) = [p for p in (tmp_path / "cache").iterdir()]
    assert note.startswith(f"note: waiting for the cache build of {cache_dir} by pid {first.pid} on ")
