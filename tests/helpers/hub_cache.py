"""A Hugging Face Hub cache on disk, laid out as huggingface_hub lays it out, for offline tests.

    cache = tmp_path / "hub"
    commit = add_repo(cache, "org/name", model_dir)     # models--org--name/{blobs,refs/main,snapshots/<commit>}
    env = offline_env(tmp_path)                         # HF_HUB_CACHE/HF_HOME there, HF_HUB_OFFLINE=1

Each file becomes a blob named by its content hash (git's blob SHA-1, the name huggingface_hub
gives non-LFS files), and snapshots/<commit>/<file> is a relative symlink to it; refs/main holds
the commit. huggingface_hub's own scan_cache_dir reads it back (tests check that).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from helpers.train import env


def _git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_repo(cache: Path, repo_id: str, source: Path, ref: str = "main") -> str:
    """Put every file of `source` into `cache` as a snapshot of `repo_id` that `ref` points at;
    returns the (made-up, content-derived) commit hash."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in Path(source).rglob("*") if p.is_file())
    commit = hashlib.sha1(b"".join(p.read_bytes() for p in files)).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for f in files:
        data = f.read_bytes()
        blob = repo / "blobs" / _git_blob_sha(data)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / f.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return commit


def offline_env(home: Path, offline: bool = True) -> dict:
    """The test processes' environment with the HF cache under `home` (hub/ in it) and, with
    `offline`, HF_HUB_OFFLINE=1; no token from the machine reaches the Hub."""
    e = env()
    e.update(HF_HOME=str(home), HF_HUB_CACHE=str(Path(home) / "hub"), HF_HUB_DISABLE_TELEMETRY="1",
             HF_HUB_DISABLE_PROGRESS_BARS="1")
    e.pop("HF_TOKEN", None)
    if offline:
        e["HF_HUB_OFFLINE"] = "1"
    else:
        e.pop("HF_HUB_OFFLINE", None)
    return e
