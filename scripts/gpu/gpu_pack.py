"""Make a device call's output folder come back whole: the lending tool returns at most 8 files
from $OUT, none more than two folders down, named in letters, digits, '.', '_' and '-'. The files
named KEEP stay where they are (at most 7, top level); every other file and folder under OUT_DIR
goes into OUT_DIR/rest.tar.gz (gzip: what `tar xzf` reads anywhere) and is removed.

    python scripts/gpu/gpu_pack.py OUT_DIR [KEEP ...]      # run by gpu_env.sh at a call's exit
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tarfile
from pathlib import Path

MAX_FILES = 8
REST = "rest.tar.gz"
NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")


def pack(out: Path, keep: list[str]) -> list[str]:
    """Pack `out` as the module docstring says; returns the names left in it."""
    keep = [k for k in dict.fromkeys(keep) if (out / k).is_file() and NAME_OK.match(k)]
    if len(keep) > MAX_FILES - 1:
        raise SystemExit(f"error: KEEP: {len(keep)} files; at most {MAX_FILES - 1} stay beside {REST}")
    rest = sorted(p for p in out.iterdir() if p.name not in keep and p.name != REST)
    if rest:
        tmp = out / (REST + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            if (out / REST).is_file():  # packed by an earlier run of the same call: keep its members
                with tarfile.open(out / REST) as old:
                    for member in old.getmembers():
                        tar.addfile(member, old.extractfile(member) if member.isfile() else None)
            for p in rest:
                tar.add(p, arcname=p.name)
        os.replace(tmp, out / REST)
        for p in rest:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return sorted(p.name for p in out.iterdir())


def main(argv: list[str]) -> int:
    if not argv or not Path(argv[0]).is_dir():
        print("error: OUT_DIR: give an existing folder (usage: gpu_pack.py OUT_DIR [KEEP ...])", file=sys.stderr)
        return 2
    names = pack(Path(argv[0]), argv[1:])
    print(f"{argv[0]}: {len(names)} files come back: {' '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
