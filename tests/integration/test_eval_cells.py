"""eval/cells.py: what a cell's key holds and leaves out, the store's reuse / refusal /
--overwrite, --out's lock, and `longctx eval` on a full disk (one line naming the file, the
finished cells kept, no temporaries)."""
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.model import save_byte_model
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.eval import cells
from longctx.eval.api import evaluate
from longctx.eval.config import EvalConfig
from longctx.eval.prepare import prepare
from longctx.storage import locks

BYTE = load_tokenizer("byte")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_byte_model(tmp_path_factory.mktemp("model"))


def _cfg(out, **over):
    base = dict(model="m", tasks=["niah_single_1", "passkey"], lengths=["256", "512"], samples=2, style="compact",
                max_new_tokens=4, out=str(out), no_progress=True)
    return EvalConfig(**dict(base, **over))


IDENTITY = {"model": {"model.safetensors": "a" * 64}, "tokenizer": {"spec": "byte"}, "dtype": "auto", "longctx": "x"}


def _keys(cfg, identity=IDENTITY):
    return {c.rel: c.key(identity) for c in prepare(cfg, BYTE).cells}


def test_the_key_leaves_out_what_does_not_change_a_result(tmp_path):
    keys = _keys(_cfg(tmp_path / "a"))
    assert list(keys) == ["cells/256/niah_single_1.json", "cells/256/passkey.json", "cells/512/niah_single_1.json",
                          "cells/512/passkey.json"]
    assert _keys(_cfg(tmp_path / "b")) == keys
    for same in (dict(no_progress=False), dict(threshold=50.0), dict(save_inputs=True),
                 dict(batch_size=3), dict(max_batch_tokens=64), dict(lengths=["512", "256", "256"])):
        assert _keys(_cfg(tmp_path / "a", **same)) == keys, same
    assert _keys(_cfg(tmp_path / "a", lengths=["256"])) == {k: v for k, v in keys.items() if "/256/" in k}


@pytest.mark.parametrize("change", [dict(seed=1), dict(samples=3), dict(max_new_tokens=5), dict(depths=["0.5"]),
                                    dict(chat_template="llama3-chat"), dict(style="ruler", lengths=["4096"])])
def test_the_key_holds_what_the_samples_depend_on(tmp_path, change):
    base = _keys(_cfg(tmp_path))
    changed = _keys(_cfg(tmp_path, **change))
    assert not set(base.items()) & set(changed.items()), change


def test_the_run_identity_is_the_models_content_not_its_path(model_dir, tmp_path):
    ident = cells.run_identity(model_dir, "byte", "auto")
    assert set(ident["model"]) == {"config.json", "generation_config.json", "model.safetensors"}
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(model_dir), str(copy)], check=True)
    (copy / "results.json").write_text("{}")  # an eval written into the model directory is not the model
    (copy / "report.md").write_text("# notes")
    assert cells.run_identity(copy, "byte", "auto") == ident
    assert cells.run_identity(copy, "byte", "bf16") != ident
    weights = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(weights[:-1] + bytes([weights[-1] ^ 1]))  # same size, one bit
    changed = cells.run_identity(copy, "byte", "auto")
    assert changed["model"]["model.safetensors"] != ident["model"]["model.safetensors"]
    assert cells.differences({"identity": ident, "model_path": str(model_dir)}, changed, None) == [
        f"the model's model.safetensors differs (it was computed from {model_dir})"]


def test_a_checkpoints_identity_is_its_manifest(tmp_path):
    ckpt = tmp_path / "step_0000004"
    (ckpt / "model").mkdir(parents=True)
    entries = {"model/model.safetensors": {"size": 3, "sha256": "b" * 64},
               "model/config.json": {"size": 2, "sha256": "c" * 64},
               "ds/mp_rank_00_model_states.pt": {"size": 1, "sha256": "d" * 64}}
    (ckpt / "MANIFEST.json").write_text(json.dumps({"format": "longctx-checkpoint-manifest", "version": 1, "step": 4,
                                                    "files": entries}))
    assert cells.model_files(ckpt / "model") == {"config.json": "c" * 64, "model.safetensors": "b" * 64}
    assert set(cells.model_files(ckpt)) == set(entries)


def _stored(store, cfg, complete=True):
    plan = prepare(cfg, BYTE)
    for c in plan.cells:
        store.write(c, {"records": [{"index": s.index} for s in c.samples]}, complete=complete, stats={}, seconds=0.0,
                    layout={"batch_size": 1})
    return plan


def test_the_store_reuses_refuses_and_overwrites(tmp_path):
    out = tmp_path / "out"
    store = cells.CellStore(out, IDENTITY, "m")
    plan = _stored(store, _cfg(out))
    assert set(store.check(plan.cells, overwrite=False)) == {c.rel for c in plan.cells}
    # fewer lengths: the others are kept, not refused
    fewer = prepare(_cfg(out, lengths=["256"]), BYTE)
    assert set(store.check(fewer.cells, overwrite=False)) == {c.rel for c in fewer.cells}
    # more samples: the same cells with other keys
    more = prepare(_cfg(out, samples=3), BYTE)
    with pytest.raises(UserError) as info:
        store.check(more.cells, overwrite=False)
    assert str(info.value) == (f"eval.out: {out} holds results of another evaluation: cells/256/niah_single_1.json "
                               "(and 3 more cells): count 2 vs 3; its samples differ (seed, samples, style, chat "
                               "template, prompts or haystack data); choose another --out, or pass --overwrite to "
                               "replace them")
    # another model at other lengths: refused too (its cells would sit beside this one's)
    other = cells.CellStore(out, dict(IDENTITY, dtype="bf16"), "m2")
    with pytest.raises(UserError, match="cells/256/niah_single_1.json .and 3 more cells.: dtype auto vs bf16"):
        other.check(prepare(_cfg(out, lengths=["1024"]), BYTE).cells, overwrite=False)
    notes = []
    assert other.check(prepare(_cfg(out, lengths=["1024"]), BYTE).cells, overwrite=True, remove=False,
                       notify=notes.append) == {}
    assert notes == [] and len(list(out.glob("cells/*/*.json"))) == 4  # only the lock holder removes
    assert store.check(more.cells, overwrite=True, notify=notes.append) == {}
    assert notes == [f"--overwrite: removed 4 cells of another evaluation from {out / 'cells'} "
                     "(first: cells/256/niah_single_1.json)"]
    assert not list(out.glob("cells/*/*.json"))


def test_a_damaged_cell_file_is_computed_again(tmp_path):
    out = tmp_path / "out"
    store = cells.CellStore(out, IDENTITY)
    plan = _stored(store, _cfg(out))
    (out / "cells/512/passkey.json").write_text('{"format": "longctx-eval-cell", "ke')
    notes = []
    reused = store.check(plan.cells, overwrite=False, notify=notes.append)
    assert "cells/512/passkey.json" not in reused and len(reused) == 3
    assert notes == [f"{out / 'cells/512/passkey.json'} is not a readable cell file (JSONDecodeError); "
                     "it is computed again"]


def test_outs_lock_refuses_a_live_eval_and_takes_over_a_dead_one(tmp_path):
    out = tmp_path / "out"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = locks.Holder(locks.this_process().host, sleeper.pid, locks.process_start(sleeper.pid), 0.0)
        assert locks.try_take(out / cells.LOCK, live)
        with pytest.raises(UserError, match=rf"eval.out: {out} is in use by another eval \(pid {sleeper.pid} on "):
            cells.acquire(out)
    finally:
        sleeper.kill()
        sleeper.wait()
    notes = []
    me = cells.acquire(out, notes.append)
    assert notes == [f"taking over {out / cells.LOCK} from {live.describe()}: it is no longer running"]
    cells.release_lock(out, me)
    assert not (out / cells.LOCK).exists()


class StopAfter:
    """agreed() is True from its n-th call on (a PreemptionFlag that got a signal then)."""

    def __init__(self, n):
        self.n, self.calls = n, 0

    def agreed(self):
        self.calls += 1
        return self.calls >= self.n


def test_the_api_stops_writes_and_resumes_with_an_identity(tmp_path):
    out = tmp_path / "o"
    cfg = _cfg(out, batch_size=1)
    def oracle(s):
        return " " + s.outputs[0]

    stopped = evaluate(None, BYTE, cfg, predictor=oracle, identity=IDENTITY, stop=StopAfter(3))
    assert stopped["preempted"] == {"cells_done": 1, "cells": 4, "partial": ["1 of 2 samples of passkey at 256"],
                                    "out": str(out)}
    assert (out / "PREEMPTED").read_text() == "1 of 4 cells\n" and not (out / "results.json").exists()
    asked = []
    done = evaluate(None, BYTE, cfg, predictor=lambda s: asked.append(s.index) or oracle(s), identity=IDENTITY,
                    stop=StopAfter(100))
    assert len(asked) == 8 - 3 and done["preempted"] is None  # the 3 finished samples are not asked again
    assert all(t["scores"] == {"256": 100.0, "512": 100.0} for t in done["summary"]["tasks"].values())
    assert not (out / "PREEMPTED").exists() and (out / "results.json").is_file()
    assert json.loads((out / "timing.json").read_text())["cells_computed"] == 3


# ------------------------------------------------------------------ a full disk, through the CLI

def _eval_args(model_dir, out):
    return ["eval", "--model", str(model_dir), "--tasks", "niah_single_1,passkey", "--lengths", "256,512",
            "--samples", "2", "--style", "compact", "--max-new-tokens", "2", "--no-progress", "--out", str(out)]


def _full_after(monkeypatch, prefix, allowed=0):
    """Path.write_bytes of a temporary sibling whose name starts with `prefix` fails as a full
    disk does, after `allowed` such writes succeed."""
    real, seen = Path.write_bytes, {"n": 0}

    def write_bytes(self, data):
        if self.name.startswith(prefix):
            seen["n"] += 1
            if seen["n"] > allowed:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)
    monkeypatch.setattr(Path, "write_bytes", write_bytes)


def _error_lines(err):
    return [x for x in err.splitlines() if x.startswith("error:")]


def _hidden(out):
    return sorted(p.name for p in out.rglob(".*"))


@pytest.mark.parametrize("target,allowed,cells_left", [
    ("cells/256/passkey.json", 0, 1),   # the second cell: the first stays
    ("results.json", 0, 4),             # every cell is kept for the rerun
])
def test_a_full_disk_is_one_line_naming_the_file(model_dir, tmp_path, monkeypatch, capsys, target, allowed, cells_left):
    out = tmp_path / "out"
    _full_after(monkeypatch, f".{Path(target).name}.tmp-", allowed)
    assert main(_eval_args(model_dir, out)) == 2
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert line.startswith(f"error: cannot write {out / target}: the disk (or quota) is full (") and \
        line.endswith(" free); free some space or choose another directory"), line
    assert "Traceback" not in err
    assert len(list(out.glob("cells/*/*.json"))) == cells_left and not (out / "results.json").exists()
    assert _hidden(out) == []  # no temporary, no lock
    monkeypatch.undo()
    assert main(_eval_args(model_dir, out)) == 0
    assert f"resuming: {cells_left} of 4 cells already done in {out}" in capsys.readouterr().err


def test_a_full_disk_at_a_figure_or_the_lock(model_dir, tmp_path, monkeypatch, capsys):
    import matplotlib.figure

    out = tmp_path / "out"

    def full(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fname))
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    assert main(_eval_args(model_dir, out)) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: cannot write {out / 'scores_vs_length.png'}: the disk (or quota) is full")
    assert not list(out.glob("*.png")) and _hidden(out) == [] and len(list(out.glob("cells/*/*.json"))) == 4
    monkeypatch.undo()

    real = Path.write_text

    def lock_full(self, text, *args, **kwargs):
        if self.name.startswith(f".{cells.LOCK}."):
            real(self, text[:3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, text, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", lock_full)
    assert main(_eval_args(model_dir, tmp_path / "new")) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: cannot write {tmp_path / 'new' / cells.LOCK}: the disk (or quota) is full")
    assert _hidden(tmp_path / "new") == []
