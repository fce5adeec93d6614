"""The identity of each data source: its files' paths, sizes, modification times and SHA-256.

    fps = fingerprint_sources(data_cfg)            # JSON-able; a checkpoint stores it
    warnings = compare_sources(saved, fps, allow_changed=False)   # UserError on any change
    changed = changed_sources(saved, fps)          # {source index: what changed}

The content hash is a full SHA-256 of every file: only a full hash sees a row rewritten in place
with the same size and modification time (`cp -p`, `rsync -t`). A file is hashed once per version:
the digest is remembered (in this process and under `$XDG_CACHE_HOME/longctx/fingerprints`) with
the file's device, inode, size, modification and status-change times; any write, `touch -r` or
rename-over changes the status-change time, which the user cannot set back, so a remembered digest
is reused only for the very same file version. On reuse a few sampled blocks are re-read and
compared too (file systems that do not keep the status-change time faithfully).

Hub sources are identified by name, config and split; synthetic sources by their settings.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Dict, List, Optional, Tuple

from longctx.base.errors import UserError
from longctx.data.config import DataConfig, as_data_config
from longctx.data.peek import list_files
from longctx.data.source_config import SourceConfig, has_glob, resolve_kind, source_label
from longctx.storage import atomic

CHUNK = 1 << 20
SAMPLE_BLOCK = 1 << 12
SAMPLES = 8
_MEMO: Dict[str, Tuple[tuple, str, str]] = {}  # abspath -> (stat identity, sample digest, sha256)


# ----------------------------------------------------------------------------- one file


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sample_digest(path: str, size: int) -> str:
    """SHA-256 of the first and last 64 KiB and SAMPLES blocks spread over the file."""
    h = hashlib.sha256()
    edge = min(size, 1 << 16)
    offsets = [(0, edge), (max(0, size - edge), edge)]
    offsets += [(size * k // (SAMPLES + 1), SAMPLE_BLOCK) for k in range(1, SAMPLES + 1)]
    with open(path, "rb") as f:
        for off, n in offsets:
            f.seek(off)
            h.update(f.read(n))
    return h.hexdigest()


def _full_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                return h.hexdigest()
            h.update(block)


def memo_dir() -> str:
    """Where digests of file versions are remembered across processes."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "longctx", "fingerprints")


def _memo_file(path: str) -> str:
    return os.path.join(memo_dir(), hashlib.sha256(path.encode()).hexdigest()[:32] + ".json")


def _recall(path: str, ident: tuple) -> Optional[Tuple[str, str]]:
    if path in _MEMO and _MEMO[path][0] == ident:
        return _MEMO[path][1:]
    try:
        with open(_memo_file(path), encoding="utf-8") as f:
            rec = json.load(f)
        if rec.get("path") == path and tuple(rec.get("identity", ())) == ident:
            return rec["sample"], rec["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _remember(path: str, ident: tuple, sample: str, digest: str) -> None:
    _MEMO[path] = (ident, sample, digest)
    try:
        os.makedirs(memo_dir(), exist_ok=True)
        atomic.write_json(_memo_file(path), {"path": path, "identity": list(ident), "sample": sample,
                                             "sha256": digest}, indent=None)
    except OSError:
        pass  # a read-only home: every process hashes again


def file_digest(path: str) -> str:
    """The SHA-256 of the file at `path` (remembered per file version, see the module doc)."""
    path = os.path.abspath(path)
    st = os.stat(path)
    ident = _identity(st)
    known = _recall(path, ident)
    if known is not None and _sample_digest(path, st.st_size) == known[0]:
        _MEMO[path] = (ident, *known)
        return known[1]
    sample, digest = _sample_digest(path, st.st_size), _full_digest(path)
    if _identity(os.stat(path)) == ident:  # not written while we read it
        _remember(path, ident, sample, digest)
    return digest


def file_record(path: str, name: str) -> dict:
    st = os.stat(path)
    return {"name": name, "path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sha256": file_digest(path)}


# ----------------------------------------------------------------------------- one source


def _glob_root(pattern: str) -> str:
    parts = pattern.split(os.sep)
    fixed = []
    for p in parts:
        if has_glob(p):
            break
        fixed.append(p)
    return os.sep.join(fixed) or "."


def source_files(src: SourceConfig, i: int) -> List[Tuple[str, str]]:
    """(path, name relative to the source's root) of every file a source reads, sorted; empty
    for hub and synthetic sources."""
    kind = resolve_kind(src, i)
    if kind in ("hub", "synthetic") or not src.path:
        return []
    path = os.path.expanduser(src.path)
    if kind in ("dir", "disk"):
        root = path
        files = sorted(os.path.join(r, f) for r, dirs, names in os.walk(path)
                       for f in names if not f.startswith("."))
    else:
        files = list_files(path, kind)
        root = _glob_root(path) if has_glob(path) else (path if os.path.isdir(path) else os.path.dirname(path))
    return [(f, os.path.relpath(f, root or ".")) for f in files if os.path.isfile(f)]


def fingerprint_source(src: SourceConfig, i: int) -> dict:
    """The identity of source `i` (JSON-able)."""
    kind = resolve_kind(src, i)
    out = {"source": i, "name": src.name, "kind": kind, "where": src.path or src.hub_name or "synthetic"}
    if kind == "synthetic":
        settings = json.dumps(dataclasses.asdict(src.synthetic), sort_keys=True)
        out["synthetic"] = hashlib.sha256(settings.encode()).hexdigest()
    elif kind == "hub":
        out["hub"] = {"name": src.hub_name, "config": src.hub_config, "split": src.split}
    else:
        out["files"] = [file_record(f, name) for f, name in source_files(src, i)]
    return out


def content_key(src: SourceConfig, i: int) -> str:
    """A short hash of what source `i` reads (file contents, hub identity or synthetic settings):
    the part of every cache key that changes when its data changes."""
    fp = fingerprint_source(src, i)
    fp.pop("source"), fp.pop("name")
    for f in fp.get("files", ()):
        f.pop("mtime_ns")
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint_sources(data_cfg: DataConfig) -> List[dict]:
    """One fingerprint per source of `data_cfg` (see fingerprint_source)."""
    cfg = as_data_config(data_cfg)
    return [fingerprint_source(src, i) for i, src in enumerate(cfg.sources)]


# ----------------------------------------------------------------------------- comparing


def _sizes(a: int, b: int) -> str:
    ha, hb = atomic.human_size(a), atomic.human_size(b)
    if ha == hb:
        ha, hb = f"{a} bytes", f"{b} bytes"
    return f"size {ha} -> {hb}"


def _file_change(old: dict, new: dict) -> Optional[str]:
    if old["size"] != new["size"]:
        return f"{new['path']}: {_sizes(old['size'], new['size'])}"
    if old["sha256"] != new["sha256"]:
        same = "same size and modification time" if old.get("mtime_ns") == new.get("mtime_ns") else "same size"
        return f"{new['path']}: content changed ({same})"
    return None


def _source_change(old: dict, new: dict) -> Optional[str]:
    """What changed in one source, in a few words; None when its data is the same."""
    if old.get("kind") != new.get("kind"):
        return f"kind {old.get('kind')} -> {new.get('kind')}"
    if "synthetic" in old or "synthetic" in new:
        return None if old.get("synthetic") == new.get("synthetic") else "its synthetic settings changed"
    if "hub" in old or "hub" in new:
        return None if old.get("hub") == new.get("hub") else f"hub dataset {old.get('hub')} -> {new.get('hub')}"
    before = {f["name"]: f for f in old.get("files", ())}
    after = {f["name"]: f for f in new.get("files", ())}
    changes = [f"{before[n]['path']} is missing" for n in before if n not in after]
    changes += [f"{after[n]['path']} was added" for n in after if n not in before]
    changes += [c for n in before if n in after for c in [_file_change(before[n], after[n])] if c]
    if not changes:
        return None
    more = f" (and {len(changes) - 1} more file changes)" if len(changes) > 1 else ""
    return changes[0] + more


def changed_sources(saved: List[dict], current: List[dict]) -> Dict[int, str]:
    """{source index: what changed} between a checkpoint's fingerprints and this run's; raises
    UserError when the number of sources differs (no source's position can be carried over)."""
    if len(saved) != len(current):
        raise UserError(
            f"data.sources: the checkpoint was trained on {len(saved)} sources, this run has {len(current)}; "
            "resume with the same sources (data.allow_changed_sources covers edited files, not added or "
            "removed sources)"
        )
    out = {}
    for i, (old, new) in enumerate(zip(saved, current)):
        change = _source_change(old, new)
        if change:
            out[i] = change
    return out


def compare_sources(saved: List[dict], current: List[dict], allow_changed: bool) -> List[str]:
    """Raise UserError naming the first changed source and what changed, unless `allow_changed`:
    then one warning line per changed source (the loader restarts those, see
    DataLoader.load_state_dict's restart_sources)."""
    changed = changed_sources(saved, current)
    lines = [f"{source_label(i)} changed since the checkpoint: {what}" for i, what in changed.items()]
    if not lines:
        return []
    if not allow_changed:
        more = f" (and {len(lines) - 1} more changed sources)" if len(lines) > 1 else ""
        raise UserError(f"{lines[0]}{more}; resume with the data the checkpoint was trained on, or set "
                        "data.allow_changed_sources=true to continue (a changed source restarts its order)")
    return [f"{line}; continuing (data.allow_changed_sources=true): its order restarts from the beginning"
            for line in lines]
