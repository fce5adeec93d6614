"""Fault cases of data: bad rows found before out_dir exists, sources edited between a save and
the resume (truncated, appended, replaced, edited in place keeping size and mtime), a cache
build killed half-way."""
from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

from fault_kit import (
    TINY,
    Row,
    case,
    checkpoints,
    digests,
    kill_group,
    last_line,
    longctx,
    metric_steps,
    run,
    shown,
    start,
    steps_text,
    wait_for,
)

ROWS = 600  # rows of a clean source: enough for a few tiny steps


def rows(n: int = ROWS, word: str = "text") -> str:
    return "".join(json.dumps({"text": f"{word} {i}: " + "the quick brown fox jumps over the lazy dog " * 6}) + "\n"
                   for i in range(n))


def bad_row_case(title: str, name: str, content: bytes) -> None:
    @case(title)
    def bad_row(tmp: Path) -> Row:
        (tmp / name).write_bytes(content)
        cmd = longctx("train", *TINY, "out_dir=run", f"data.sources=[{{path: {name}}}]")
        res = run(cmd, tmp)
        return Row(title, shown(cmd, tmp), res.returncode, last_line(res),
                   "out_dir not created" if not (tmp / "run").exists() else "out_dir CREATED")


GOOD = rows(150).encode()
bad_row_case("a non-UTF-8 row 151", "nonutf8.jsonl", GOOD + b'{"text": "caf\xe9 au lait"}\n')
bad_row_case("'text' holds an int at row 151", "int.jsonl", GOOD + b'{"text": 7}\n')
bad_row_case("broken JSON at row 151", "broken.jsonl", GOOD + b'{"text": "unterminated}\n')
bad_row_case("a truncated .jsonl.gz", "trunc.jsonl.gz", gzip.compress(rows().encode())[:-64])


@case("a tokenizer directory with only tokenizer_config.json")
def tokenizer_config_only(tmp: Path) -> Row:
    (tmp / "tok").mkdir()
    (tmp / "tok" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    cmd = longctx("train", *TINY, "out_dir=run", "data.tokenizer=tok")
    res = run(cmd, tmp)
    return Row("a tokenizer directory with only tokenizer_config.json", shown(cmd, tmp), res.returncode,
               last_line(res), "out_dir not created" if not (tmp / "run").exists() else "out_dir CREATED")


def trained_on(tmp: Path, name: str) -> list[str]:
    """Two steps on tmp/name (a checkpoint at step 2); the resume's command."""
    (tmp / name).write_text(rows())
    source = f"data.sources=[{{path: {name}}}]"
    res = run(longctx("train", *TINY, "out_dir=run", "train.steps=2", source), tmp)
    if res.returncode != 0:
        raise RuntimeError(f"the tiny run failed: {res.stderr[-2000:]}")
    return longctx("train", *TINY, "out_dir=run", "train.steps=4", source, "checkpoint.resume=auto")


def edit_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Replace bytes by as many others and put the modification time back, as `cp -p` leaves it."""
    st = path.stat()
    data = path.read_bytes()
    path.write_bytes(data.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


EDITS = {
    "truncated (3 rows removed)": lambda p: p.write_text("".join(p.read_text().splitlines(True)[:-3])),
    "appended": lambda p: p.write_text(p.read_text() + rows(1, "more")),
    "replaced, same row count": lambda p: p.write_text(rows(ROWS, "other")),
    "edited with the same size and mtime (cp -p)": lambda p: edit_in_place(p, b"quick brown", b"quick green"),
}


def changed_source_case(what: str, edit) -> None:
    title = f"data {what} between a save and the resume"

    @case(title)
    def changed(tmp: Path) -> Row:
        cmd = trained_on(tmp, "data.jsonl")
        before = digests(tmp / "run")
        edit(tmp / "data.jsonl")
        res = run(cmd, tmp)
        same = digests(tmp / "run") == before
        return Row(title, shown(cmd, tmp), res.returncode, last_line(res),
                   "run directory unchanged" if same else "run directory CHANGED")


for what, edit in EDITS.items():
    changed_source_case(what, edit)


@case("the same in-place edit, continuing on purpose (allow_changed_sources)")
def changed_allowed(tmp: Path) -> Row:
    cmd = trained_on(tmp, "data.jsonl") + ["data.allow_changed_sources=true"]
    EDITS["edited with the same size and mtime (cp -p)"](tmp / "data.jsonl")
    res = run(cmd, tmp)
    return Row("the same in-place edit, continuing with data.allow_changed_sources=true", shown(cmd, tmp),
               res.returncode, last_line(res, "data.sources[0] changed"),
               f"metrics.jsonl: {steps_text(metric_steps(tmp / 'run'))}")


@case("a data.cache_dir build SIGKILLed, then the same run")
def cache_build_killed(tmp: Path) -> Row:
    (tmp / "big.jsonl").write_text(rows(40 * ROWS))
    cmd = longctx("train", *TINY, "out_dir=run", "train.steps=2", "data.sources=[{path: big.jsonl}]",
                  "data.cache_dir=cache")
    first = start(cmd, tmp, tmp / "first.log")
    try:
        wait_for(lambda: any((tmp / "cache").glob(".*tmp-*")), first)
    finally:
        kill_group(first)
    shutil.rmtree(tmp / "run", ignore_errors=True)  # the killed job's lock and config: a fresh run
    res = run(cmd, tmp)
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("note:")]
    left = sorted(p.name for p in (tmp / "cache").iterdir() if p.name.startswith("."))
    return Row("a data.cache_dir build SIGKILLed, then the same run", shown(cmd, tmp), res.returncode,
               " — then: ".join(notes) or last_line(res),
               f"cache/: temporaries or locks left: {left or 'none'}; {len(checkpoints(tmp / 'run'))} checkpoints")
