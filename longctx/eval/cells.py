"""The per-cell store of `longctx eval --out OUT`: what makes an evaluation resumable.

    identity = run_identity(model_dir, tokenizer_spec, cfg.dtype, model_overrides=overrides)  # files by content, ...
    cells = task_cells(samples, add_bos, stop_ids) + ppl_cells(lengths, windows, ppl_data)
    store = CellStore(OUT, identity)
    done = store.check(cells, overwrite=False)   # {cell file: stored cell}; one UserError line on a conflict
    store.write(cell, result, complete=True, ...)   # OUT/cells/<length>/<task>.json, whole or absent

Each (task, length) cell (perplexity: one cell per length, `ppl.json`) is written as it
finishes, through a temporary sibling renamed over it, with the key (SHA-256) of everything
that determines its result: the run's identity -- the model's files by content (a checkpoint's
MANIFEST.json, else the SHA-256 of each weight, config and tokenizer file), the tokenizer's
files, the dtype, longctx's version, the model_overrides -- and the cell's own fields: its
samples (every prompt, reference, stop string, generation budget and metric; so the seed,
--samples, --style, the chat template and the haystack data are in it), the BOS setting, the
scoring mode (teacher_forced; absent for generation), the stop ids (when more than the
tokenizer's EOS), for perplexity the windows
and the documents' content. Not in it: where the model or the outputs are (a moved model
resumes), progress, the threshold and --save-inputs (applied when results.json is built), and
the layout (batch size, cp, dp: a cell computed under another layout is the same
measurement; the layouts a cell was computed with are recorded in it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from longctx import __version__
from longctx.base.errors import UserError
from longctx.checkpoint.manifest import MANIFEST, read_manifest
from longctx.data.fingerprint import file_digest
from longctx.eval.tasks import Sample
from longctx.storage import atomic
from longctx.storage.locks import Holder, is_alive, read_holder, release, this_process, try_take

FORMAT = "longctx-eval-cell"
CELLS = "cells"
PPL = "ppl"  # the file name of a perplexity cell (no task has this name)
LOCK = ".longctx-eval.lock"
MARKER = "PREEMPTED"  # in OUT while an eval stopped for preemption has cells left (the SLURM scripts read it)
# a model directory's files that make up the model (eval outputs written into it do not)
_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model", ".txt")
_NOT_MODEL = ("results.json", "timing.json")
_PPL_SUFFIXES = (".txt", ".jsonl", ".json")  # what eval/ppl.py reads from a --ppl-data folder


# ------------------------------------------------------------------------------- identities

def _digests(paths: Sequence[Path], root: Path) -> dict:
    return {p.relative_to(root).as_posix(): file_digest(str(p)) for p in paths}


def model_files(model_dir: Path) -> dict:
    """{file: SHA-256} of a model: a checkpoint's manifest entries (verified when the checkpoint
    was resolved), else the top-level weight, config and tokenizer files of the directory
    (remembered per file version: a second eval of the same files does not read them again)."""
    for ckpt, prefix in ((model_dir, ""), (model_dir.parent, model_dir.name + "/")):
        if (ckpt / MANIFEST).is_file() and (prefix == "" or prefix == "model/"):
            files, _problem = read_manifest(ckpt)
            if files:
                return {name[len(prefix):]: entry.get("sha256") for name, entry in sorted(files.items())
                        if name.startswith(prefix)}
    return _digests(sorted(p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".")
                           and p.suffix in _MODEL_SUFFIXES and p.name not in _NOT_MODEL), model_dir)


def tokenizer_files(spec: str) -> dict:
    """The tokenizer by content: its file, or its directory's top-level files ("byte" and hub
    ids by name)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return {"spec": spec, "files": _digests([path], path.parent)}
    if path.is_dir():
        return {"spec": spec, "files": _digests(sorted(p for p in path.iterdir() if p.is_file()
                                                      and not p.name.startswith(".")), path)}
    return {"spec": spec}


def run_identity(model_dir: Path, tokenizer_spec: str, dtype: str, *, model_overrides: Optional[dict] = None) -> dict:
    """What every cell of an evaluation shares and its result depends on (model_overrides: the
    overridden config fields as the model runs with them; absent when there are none)."""
    identity = {"model": model_files(Path(model_dir)), "tokenizer": tokenizer_files(tokenizer_spec), "dtype": dtype,
                "longctx": __version__}
    if model_overrides:
        identity["model_overrides"] = _json_safe(model_overrides)
    return identity


def _json_safe(obj):
    """As it reads back from a cell file (tuples as lists), so a stored identity compares equal."""
    return json.loads(json.dumps(obj, sort_keys=True))


def ppl_data_files(path: Optional[str]) -> object:
    """The documents perplexity reads, by content (None: the built-in essay)."""
    if path is None:
        return None
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.suffix in _PPL_SUFFIXES) if p.is_dir() else [p]
    return _digests(files, p if p.is_dir() else p.parent)


IDENTITY_EXTRAS = ("model_overrides", "endpoint_mode")  # identity entries present only when set


# ------------------------------------------------------------------------------- cells

def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Cell:
    """One (task, length) of an evaluation (name "ppl": perplexity at that length)."""

    name: str
    length: int
    fields: dict  # what, besides the run's identity, the result depends on
    samples: tuple = ()

    @property
    def rel(self) -> str:
        return f"{CELLS}/{self.length}/{self.name}.json"

    @property
    def label(self) -> str:
        return f"{self.name} at {self.length}"

    def key(self, identity: dict) -> str:
        return _sha({"identity": identity, "cell": self.fields})


def task_cells(samples: Sequence[Sample], add_bos: bool, stop_ids: Sequence[int] = (),
               mode: str = "generate") -> list[Cell]:
    """The cells of `samples`, by length, then in the order their tasks first appear
    (stop_ids: the token ids that end a generation, when more than the tokenizer's EOS;
    mode: how samples are scored, eval.mode)."""
    groups: dict = {}
    for s in samples:
        groups.setdefault((s.target_length, s.task), []).append(s)
    order = {t: i for i, t in enumerate(dict.fromkeys(s.task for s in samples))}
    cells = []
    for (length, task), group in sorted(groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
        group = sorted(group, key=lambda s: s.index)
        fields = {"kind": "task", "task": task, "length": length, "add_bos": add_bos, "count": len(group),
                  "samples": _sha([dataclasses.asdict(s) for s in group])}
        if stop_ids:  # absent when they are only the tokenizer's EOS (the keys cells had before)
            fields["stop_ids"] = list(stop_ids)
        if mode != "generate":  # absent for generation (the keys cells had before)
            fields["mode"] = mode
        cells.append(Cell(task, length, fields, tuple(group)))
    return cells


def ppl_cells(lengths: Sequence[int], windows: int, data: Optional[str]) -> list[Cell]:
    documents = ppl_data_files(data)
    return [Cell(PPL, L, {"kind": "ppl", "length": L, "windows": windows, "documents": documents}) for L in lengths]


# ------------------------------------------------------------------------------- the store

def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def differences(stored: dict, identity: dict, cell: Optional[Cell]) -> list[str]:
    """What differs between a stored cell and this evaluation's (its identity, and `cell`'s
    fields when it is one of this evaluation's cells), in words."""
    out = []
    old = stored.get("identity") or {}
    old_files, new_files = (old.get("model") or {}), identity["model"]
    # (a served model's "files" are its endpoint and served_model: eval/endpoint/command.py)
    changed = sorted(n for n in set(old_files) | set(new_files) if old_files.get(n) != new_files.get(n))
    if changed:
        where = f" (it was computed from {stored['model_path']})" if stored.get("model_path") else ""
        out.append("the model's " + ", ".join(changed[:3])
                   + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
                   + f" differ{'s' if len(changed) == 1 else ''}{where}")
    for name, what in (("tokenizer", "the tokenizer"), ("dtype", "dtype"), ("longctx", "longctx version"),
                       ("model_overrides", "model_overrides"), ("endpoint_mode", "endpoint_mode")):
        if old.get(name) != identity.get(name):
            out.append(f"{what} {_short(old.get(name))} vs {_short(identity.get(name))}")
    if cell is not None:
        old_cell = stored.get("cell") or {}
        for name in sorted(set(old_cell) | set(cell.fields)):
            if old_cell.get(name) == cell.fields.get(name):
                continue
            if name == "samples":
                out.append("its samples differ (seed, samples, style, chat template, prompts or haystack data)")
            elif name == "documents":
                out.append("the perplexity documents differ")
            else:
                out.append(f"{name} {_short(old_cell.get(name))} vs {_short(cell.fields.get(name))}")
    return out or ["its key differs"]


class CellStore:
    """OUT/cells/: the finished (and, after a preemption, partial) cells of one evaluation."""

    def __init__(self, out: str | Path, identity: dict, model_path: Optional[str] = None):
        self.out, self.identity, self.model_path = Path(out), identity, model_path

    def path(self, cell: Cell) -> Path:
        return self.out / cell.rel

    def read(self, notify: Callable[[str], None]) -> dict:
        """{cell file relative to OUT: its content}; a file that is not a cell is left out (with a note)."""
        found = {}
        root = self.out / CELLS
        for path in sorted(root.glob("*/*.json")) if root.is_dir() else []:
            rel = path.relative_to(self.out).as_posix()
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as e:
                notify(f"{path} is not a readable cell file ({type(e).__name__}); it is computed again")
                continue
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                notify(f"{path} is not a longctx eval cell; it is computed again")
                continue
            found[rel] = doc
        return found

    def check(self, cells: Sequence[Cell], *, overwrite: bool, remove: bool = True,
              notify: Callable[[str], None] = atomic.note) -> dict:
        """The stored cells this evaluation reuses ({file: content}, complete or partial).

        A stored cell of this evaluation whose key differs, or any stored cell of another model,
        tokenizer, dtype or longctx version, is a UserError line naming it and what differs,
        unless `overwrite`: then those files are removed (with a note; only where `remove`:
        the rank that holds the lock) and computed again."""
        planned = {c.rel: c for c in cells}
        reuse, conflicts = {}, []
        for rel, doc in self.read(notify).items():
            cell = planned.get(rel)
            if cell is None:  # not asked for now: kept, unless it belongs to another evaluation
                stored = doc.get("identity", {})
                if any(stored.get(k) != self.identity.get(k) for k in set(self.identity) | set(IDENTITY_EXTRAS)):
                    conflicts.append((rel, doc, None))
            elif doc.get("key") == cell.key(self.identity):
                reuse[rel] = doc
            else:
                conflicts.append((rel, doc, cell))
        if conflicts and not overwrite:
            rel, doc, cell = conflicts[0]
            more = (f" (and {len(conflicts) - 1} more cell{'s' if len(conflicts) > 2 else ''})"
                    if len(conflicts) > 1 else "")
            raise UserError(f"eval.out: {self.out} holds results of another evaluation: {rel}{more}: "
                            f"{'; '.join(differences(doc, self.identity, cell))}; choose another --out, or pass "
                            "--overwrite to replace them")
        if conflicts and remove:
            for rel, _doc, _cell in conflicts:
                (self.out / rel).unlink(missing_ok=True)
            notify(f"--overwrite: removed {len(conflicts)} cell{'s' if len(conflicts) != 1 else ''} of another "
                   f"evaluation from {self.out / CELLS} (first: {conflicts[0][0]})")
        return reuse

    def write(self, cell: Cell, result: dict, *, complete: bool, stats: dict, seconds: float, layout: dict,
              computed_with: Sequence[dict] = ()) -> Path:
        """The cell's file, whole or not at all (a full disk is one line naming it).

        result: {"records": [...]} for a task, {"row": ..., "notes": [...], "source": ...} for
        perplexity; stats: generation counts (deterministic); seconds and the layout are for
        people (not part of any result); computed_with: the layouts of earlier runs of a partial cell."""
        layouts = list(computed_with)
        if layout not in layouts:
            layouts.append(layout)
        doc = {"format": FORMAT, "version": 1, "key": cell.key(self.identity), "complete": complete,
               "task": cell.name, "length": cell.length, "model_path": self.model_path, "identity": self.identity,
               "cell": cell.fields, "stats": stats, "seconds": round(seconds, 3), "computed_with": layouts, **result}
        return atomic.write_result(self.path(cell), json.dumps(doc) + "\n")


# ------------------------------------------------------------------------------- one writer

def acquire(out: Path, notify: Callable[[str], None] = atomic.note) -> Holder:
    """Take OUT's eval lock (creating OUT): one eval writes an --out at a time. A holder that is
    gone from this host, or is this SLURM job (a requeue), is taken over with a notice; a live
    one is one UserError line naming it."""
    path, me = out / LOCK, this_process()
    with atomic.user_errors(path):
        while not _try_take(path, me):
            holder = read_holder(path)
            if holder is None:
                continue  # released between our attempt and the read
            alive = is_alive(holder)
            if holder.job and holder.job == me.job:
                reason = f"it is this SLURM job ({me.job}), requeued"
            elif alive is False:
                reason = "it is no longer running"
            elif alive:
                raise UserError(f"eval.out: {out} is in use by another eval ({holder.describe()}); wait for it, stop "
                                "it, or choose another --out")
            else:
                raise UserError(f"eval.out: {out} is locked by an eval on {holder.host} ({holder.describe()}), which "
                                f"cannot be checked from here; if that eval is gone, remove {path}")
            notify(f"taking over {path} from {holder.describe()}: {reason}")
            path.unlink(missing_ok=True)
    return me


def _try_take(path: Path, me: Holder) -> bool:
    """locks.try_take; a failed write (a full disk) names the lock, and its half-written
    side file is removed."""
    try:
        return try_take(path, me)
    except OSError as e:
        path.with_name(f".{path.name}.{me.host}.{me.pid}").unlink(missing_ok=True)
        raise atomic.write_error(OSError(e.errno, e.strerror), path) from None


def release_lock(out: Path, me: Holder) -> None:
    release(out / LOCK, me)
