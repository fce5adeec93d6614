"""MANIFEST.json of a training checkpoint: every file's size and SHA-256, written before the
COMPLETE marker (longctx/checkpoint/store.py writes both; loading and resume verify them).

    {"format": "longctx-checkpoint-manifest", "version": 1, "step": 100,
     "files": {"ds/mp_rank_00_model_states.pt": {"size": 123, "sha256": "..."}, ...}}

Hashing is split over the ranks (file i goes to rank i % world on a shared file system), so a
large checkpoint costs each rank 1/world of its bytes; sizes alone (cheap) are checked before any
process group.

The checkpoint directory may be node-local (each node sees only the files its ranks wrote): every
rank lists what it sees, each file is hashed by a rank that sees it, the manifest lists the
union and is written into every copy of the directory, and a verification finds each file on
some rank (`shares`).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Optional

import torch.distributed as dist

MANIFEST = "MANIFEST.json"
COMPLETE = "COMPLETE"  # written last: a checkpoint directory without it never counts
FORMAT = "longctx-checkpoint-manifest"
_CHUNK = 8 * 2**20
_NOT_LISTED = {MANIFEST, COMPLETE}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(ckpt: Path) -> list[str]:
    """Every regular file under `ckpt`, relative, sorted (the manifest and marker excluded)."""
    found = []
    for root, _dirs, files in os.walk(ckpt):
        for name in files:
            rel = (Path(root) / name).relative_to(ckpt).as_posix()
            if rel not in _NOT_LISTED:
                found.append(rel)
    return sorted(found)


def rank_and_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order (collective; a single process gets [obj])."""
    _, world = rank_and_world()
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def shares(names: list[str], seen: list[set[str]]) -> dict[int, list[str]]:
    """Which rank hashes which file: file i goes to the (i mod k)-th of the k ranks that see it
    (`seen[rank]`: the names rank sees). On a shared file system every rank sees every file:
    file i goes to rank i % world. A file no rank sees is in no share."""
    out: dict[int, list[str]] = {rank: [] for rank in range(len(seen))}
    for i, name in enumerate(names):
        seers = [rank for rank, mine in enumerate(seen) if name in mine]
        if seers:
            out[seers[i % len(seers)]].append(name)
    return out


def write_manifest(ckpt: Path, step: int) -> Optional[str]:
    """Collective. Every rank lists the files it sees under `ckpt` and hashes its share of them;
    the manifest lists them all. Rank 0 writes it, and every rank that does not see rank 0's
    (a node-local directory) writes the same into its own.
    Returns the first rank's failure as one line (the same on every rank), or None."""
    rank, world = rank_and_world()
    listed, problem = [], None
    try:
        listed = list_files(ckpt)
    except OSError as e:
        problem = f"rank {rank}: cannot list {ckpt} ({e.strerror})"
    gathered = gather_objects((listed, problem))
    problem = next((p for _, p in gathered if p), None)
    if problem:
        return problem
    seen = [set(names) for names, _ in gathered]
    names = sorted(set().union(*seen))
    mine = {}
    try:
        for n in shares(names, seen)[rank]:
            mine[n] = {"size": (ckpt / n).stat().st_size, "sha256": sha256_file(ckpt / n)}
    except OSError as e:
        problem = f"rank {rank}: cannot read {e.filename} ({e.strerror})"
    entries: dict = {}
    for part, part_problem in gather_objects((mine, problem)):
        problem = problem or part_problem
        entries.update(part)
    body = {"format": FORMAT, "version": 1, "step": step, "files": dict(sorted(entries.items()))}
    if problem is None and rank == 0:
        problem = _write_body(ckpt / MANIFEST, body, ckpt / MANIFEST)
    problem = gather_objects(problem)[0]
    if problem is None and rank != 0 and not (ckpt / MANIFEST).is_file():  # a node-local directory
        problem = _write_body(ckpt / f".{MANIFEST}.{rank}.tmp", body, ckpt / MANIFEST)
    problems = [p for p in gather_objects(problem) if p]
    return problems[0] if problems else None


def _write_body(path: Path, body: dict, final: Path) -> Optional[str]:
    """`body` to `path`, synced, then renamed to `final` (the same path: written in place)."""
    try:
        with open(path, "w") as f:
            json.dump(body, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if path != final:
            os.replace(path, final)  # ranks of one node write the same bytes: the last rename wins
    except OSError as e:
        return f"{final} ({e.strerror})"
    return None


def read_manifest(ckpt: Path) -> tuple[Optional[dict], Optional[str]]:
    """(files, None), or (None, what is wrong with the manifest itself)."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return None, f"no {MANIFEST} (written before COMPLETE by every checkpoint; this one is incomplete or foreign)"
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{MANIFEST} is unreadable ({e})"
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("files"), dict):
        return None, f"{MANIFEST} is not a longctx checkpoint manifest"
    return body["files"], None


def _check_file(ckpt: Path, name: str, entry: dict, hash_it: bool) -> Optional[str]:
    path = ckpt / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != entry.get("size"):
        return f"{name} has {size} bytes, the manifest says {entry.get('size')} (truncated or rewritten)"
    if hash_it and sha256_file(path) != entry.get("sha256"):
        return f"{name} fails its SHA-256 check (corrupted)"
    return None


def selected(files: dict, under: Optional[str]) -> list[str]:
    return sorted(n for n in files if under is None or n.startswith(under.rstrip("/") + "/"))


def verify(ckpt: Path, *, under: Optional[str] = None, hashes: bool = True,
           names: Optional[Iterable[str]] = None) -> Optional[str]:
    """None if `ckpt` (or its sub-folder `under`) matches its manifest, else the first problem."""
    files, problem = read_manifest(ckpt)
    if problem:
        return problem
    wanted = selected(files, under)
    if under is not None and not wanted:
        return f"the manifest lists no files under {under}/"
    for name in (wanted if names is None else names):
        problem = _check_file(ckpt, name, files[name], hashes)
        if problem:
            return problem
    return None


def verify_collective(ckpt: Path) -> Optional[str]:
    """Collective `verify`: every rank reads its own copy of the manifest and checks the sizes of
    the files it sees; each listed file must be seen by some rank (a node-local directory holds
    only its node's); each rank hashes its share. All ranks get the same answer (the lowest
    rank's problem, or None)."""
    rank, _ = rank_and_world()
    files, problem = read_manifest(ckpt)
    names = selected(files, None) if problem is None else []
    here = {n for n in names if (ckpt / n).is_file()}
    if problem is None:
        problem = verify(ckpt, hashes=False, names=sorted(here))
    listing = json.dumps(files, sort_keys=True) if files is not None else None
    gathered = gather_objects((problem, here, listing))
    problem = next((p for p, _, _ in gathered if p), None)
    if problem is None and len({copy for _, _, copy in gathered}) > 1:
        problem = f"the copies of {MANIFEST} that the ranks see differ (node-local directories from different saves)"
    if problem is None:
        seen = [mine for _, mine, _ in gathered]
        missing = [n for n in names if not any(n in mine for mine in seen)]
        problem = f"{missing[0]} is missing" if missing else verify(ckpt, names=shares(names, seen)[rank])
    problems = [p for p in gather_objects(problem) if p]
    return problems[0] if problems else None
