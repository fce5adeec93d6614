"""Long real documents from the Python packages installed here: a train corpus and a disjoint
held-out set, as jsonl.

    python scripts/real_model/long_text.py OUT_DIR [--tokenizer DIR] [--min-chars N] [--heldout-fraction F]
    python scripts/real_model/long_text.py OUT_DIR --roots DIR [DIR ...]      # packages from these directories

A document is one package's source, repository-level (the ProLong recipe's code documents):
every .py file under a top-level package directory, in sorted path order, each after a header
line `# file: PACKAGE/PATH`. The top-level modules of a root (e.g. the stdlib's os.py, typing.py)
form one more document, `(modules)`. A package's prose (.rst, .md, .txt, licenses left out) is
its own document of kind "prose". Roots default to the stdlib (sysconfig's stdlib path) and
this environment's site-packages. Documents shorter than --min-chars are dropped.

Short documents (the short share a long-context mixture keeps, as ProLong's) are single
files: every code section of the train documents with --short-chars MIN MAX characters
(default 2000 40000) is a row of short.jsonl, from train packages only.

Packages are split by name: a fraction of them, chosen by a hash of the name, is held out, and
every document of a held-out package (in any root) is in heldout.jsonl only. OUT_DIR holds
train.jsonl, short.jsonl, heldout.jsonl (rows {"text", "package", "kind", "source", "files", "chars",
"tokens"}) and manifest.json (per-document chars and tokens, totals per split). Token counts use
--tokenizer (a tokenizer directory or tokenizer.json; no special tokens), summed over file
sections (each ends in one newline, a boundary byte-level pre-tokenizers split at anyway).
The same inputs give the same bytes; OUT_DIR is built in a temporary sibling and renamed, and an
existing OUT_DIR is refused unless --overwrite.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from longctx.base.errors import UserError
from longctx.storage import atomic

PROSE_SUFFIXES = (".rst", ".md", ".txt")
_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages"}
_NOT_PROSE = ("license", "licence", "copying", "notice", "authors", "record", "top_level", "entry_points",
              "requirements", "sources", "dependency_links")
_BATCH = 256  # sections per tokenizer call


@dataclass
class Doc:
    package: str
    kind: str  # "code" or "prose"
    source: str
    sections: list[str] = field(default_factory=list)
    tokens: Optional[int] = None

    @property
    def text(self) -> str:
        return "".join(self.sections)


def default_roots() -> list[tuple[str, Path]]:
    paths = sysconfig.get_paths()
    roots = [("stdlib", Path(paths["stdlib"]))]
    for key in ("purelib", "platlib"):
        p = Path(paths[key])
        if all(p != r for _, r in roots):
            roots.append(("site-packages", p))
    return roots


def _skip_dir(name: str) -> bool:
    return name in _SKIP_DIRS or name.startswith(".") or name.endswith((".dist-info", ".egg-info", ".data"))


def _walk(top: Path) -> Iterator[Path]:
    """Every regular file under `top` (symlinks not followed), in sorted relative-path order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not _skip_dir(d))
        found += [Path(dirpath) / f for f in filenames]
    return iter(sorted((f for f in found if f.is_file() and not f.is_symlink()),
                       key=lambda f: f.relative_to(top).as_posix()))


def _read(path: Path) -> Optional[str]:
    """A file's text, or None for one that is not UTF-8 text."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return None if "\x00" in text or not text.strip() else text


def _section(label: str, text: str) -> str:
    return f"# file: {label}\n{text.rstrip()}\n"


def _is_prose(path: Path) -> bool:
    return path.suffix.lower() in PROSE_SUFFIXES and not path.stem.lower().startswith(_NOT_PROSE)


def package_docs(source: str, root: Path) -> list[Doc]:
    """The documents of one root: each package directory's code and prose, and its top-level modules."""
    docs = []
    entries = sorted(root.iterdir(), key=lambda p: p.name) if root.is_dir() else []
    modules = Doc("(modules)", "code", source)
    for entry in entries:
        if entry.is_symlink():
            continue
        if entry.is_file() and entry.suffix == ".py":
            text = _read(entry)
            if text is not None:
                modules.sections.append(_section(entry.name, text))
            continue
        if not entry.is_dir() or _skip_dir(entry.name):
            continue
        code, prose = Doc(entry.name, "code", source), Doc(entry.name, "prose", source)
        for f in _walk(entry):
            doc = code if f.suffix == ".py" else prose if _is_prose(f) else None
            text = _read(f) if doc is not None else None
            if text is not None:
                doc.sections.append(_section(f"{entry.name}/{f.relative_to(entry).as_posix()}", text))
        docs += [code, prose]
    return [modules, *docs]


def heldout_packages(names: list[str], fraction: float) -> set[str]:
    """round(fraction * len(names)) package names (at least one when fraction > 0), the first by
    the SHA-256 of the name: stable when other packages come or go."""
    if fraction <= 0 or not names:
        return set()
    n = min(len(names), max(1, round(fraction * len(names))))
    return set(sorted(names, key=lambda s: hashlib.sha256(s.encode("utf-8")).hexdigest())[:n])


def load_counter(spec: Optional[str]):
    """A function text sections -> token count, or None without a tokenizer."""
    if spec is None:
        return None
    from tokenizers import Tokenizer

    path = Path(spec)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"--tokenizer {spec}: no tokenizer.json there; pass a tokenizer directory or tokenizer.json")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises its own exception type for a bad file
        raise UserError(f"--tokenizer {file}: not a readable tokenizer.json ({str(e).splitlines()[0]})") from None

    def count(sections: list[str]) -> int:
        total = 0
        for i in range(0, len(sections), _BATCH):
            total += sum(len(e.ids) for e in tok.encode_batch(sections[i:i + _BATCH], add_special_tokens=False))
        return total

    return count


def _row(doc: Doc) -> dict:
    return {"text": doc.text, "package": doc.package, "kind": doc.kind, "source": doc.source,
            "files": len(doc.sections), "chars": len(doc.text), "tokens": doc.tokens}


def short_docs(docs: list[Doc], lo: int, hi: int) -> list[Doc]:
    """Each code file of `docs` with lo..hi characters, as a document of its own."""
    return [Doc(d.package, "file", d.source, [sec]) for d in docs if d.kind == "code" for sec in d.sections
            if lo <= len(sec) <= hi]


def _totals(docs: list[Doc]) -> dict:
    tokens = [d.tokens for d in docs]
    return {"documents": len(docs), "packages": len({d.package for d in docs}), "chars": sum(len(d.text) for d in docs),
            "tokens": None if None in tokens else sum(tokens)}


def build(out: Path, roots: list[tuple[str, Path]], *, min_chars: int, fraction: float,
          tokenizer: Optional[str], overwrite: bool, short_chars: tuple[int, int] = (2000, 40000), log=print) -> dict:
    target = Path(os.path.abspath(out))
    if target.exists() and not overwrite:
        raise UserError(f"{out}: already exists; pass --overwrite to replace it, or choose another OUT_DIR")
    for _, root in roots:
        if not root.is_dir():
            raise UserError(f"--roots {root}: not a directory")
    count = load_counter(tokenizer)
    docs = [d for source, root in roots for d in package_docs(source, root) if len(d.text) >= min_chars]
    if not docs:
        raise UserError(f"no document of at least --min-chars {min_chars} characters under "
                        f"{', '.join(str(r) for _, r in roots)}; lower --min-chars or add --roots")
    held = heldout_packages(sorted({d.package for d in docs}), fraction)
    train = [d for d in docs if d.package not in held]
    heldout = [d for d in docs if d.package in held]
    splits = {"train": train, "short": short_docs(train, *short_chars), "heldout": heldout}
    if count is not None:
        log(f"counting tokens of {sum(map(len, splits.values()))} documents")
        for d in (d for split in splits.values() for d in split):
            d.tokens = count(d.sections)
    manifest = {
        "roots": [{"source": s, "path": str(r)} for s, r in roots], "min_chars": min_chars,
        "short_chars": list(short_chars),
        "heldout_fraction": fraction, "tokenizer": tokenizer, "heldout_packages": sorted(held),
        "totals": {name: _totals(split) for name, split in splits.items()},
        "documents": {name: [{k: v for k, v in _row(d).items() if k != "text"} for d in split]
                      for name, split in splits.items()},
    }
    atomic.remove_stale(target.parent, atomic.note, name=target.name)
    tmp = atomic.make_temp_dir(target)
    try:
        with atomic.user_errors(out):
            for name, split in splits.items():
                with open(tmp / f"{name}.jsonl", "w", encoding="utf-8") as f:
                    for d in split:
                        f.write(json.dumps(_row(d), ensure_ascii=False) + "\n")
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
            atomic.swap_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="directory to write (train.jsonl, heldout.jsonl, manifest.json)")
    p.add_argument("--min-chars", type=int, default=60_000, help="drop documents shorter than this (default 60000)")
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="share of packages held out (default 0.1)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or tokenizer.json for the token counts")
    p.add_argument("--roots", type=Path, nargs="+", default=None, help="directories whose packages are read "
                   "(default: the stdlib and this environment's site-packages)")
    p.add_argument("--short-chars", type=int, nargs=2, default=(2000, 40000), metavar=("MIN", "MAX"),
                   help="characters of a file that is a short document (default 2000 40000)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    args = p.parse_args(argv)
    try:
        if args.min_chars < 1:
            raise UserError(f"--min-chars {args.min_chars}: must be a positive number of characters")
        if not 0 < args.short_chars[0] <= args.short_chars[1]:
            raise UserError(f"--short-chars {args.short_chars[0]} {args.short_chars[1]}: must be 0 < MIN <= MAX")
        if not 0 <= args.heldout_fraction < 1:
            raise UserError(f"--heldout-fraction {args.heldout_fraction}: must be in [0, 1)")
        roots = [(str(r), r) for r in args.roots] if args.roots else default_roots()
        m = build(args.out, roots, min_chars=args.min_chars, fraction=args.heldout_fraction, tokenizer=args.tokenizer,
                  overwrite=args.overwrite, short_chars=tuple(args.short_chars),
                  log=lambda line: print(line, file=sys.stderr))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, t in m["totals"].items():
        tokens = "-" if t["tokens"] is None else f"{t['tokens']:,}"
        print(f"{name}: {t['documents']} documents from {t['packages']} packages, {t['chars']:,} chars, "
              f"{tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
