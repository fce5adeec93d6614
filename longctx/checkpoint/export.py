"""`longctx export`'s work: a training checkpoint, run directory or HF directory written as a
Hugging Face Llama directory with its tokenizer (the command line is longctx/commands/export.py)."""
from __future__ import annotations

import argparse
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import torch

from longctx.base.errors import UserError
from longctx.checkpoint import manifest
from longctx.checkpoint.adapter_export import export_adapter
from longctx.checkpoint.find import is_checkpoint, is_ds_only_checkpoint, resolve_model_dir, tokenizer_spec_for
from longctx.checkpoint.model import DTYPES, load_consolidated, trained_model, zero_masters
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.model.auto.model import load_auto_model
from longctx.model.auto.support import AutoModelSpec
from longctx.model.hf import export_target, load_pretrained, save_hf_weights
from longctx.model.hf_config import read_checkpoint_or_model_config
from longctx.storage import atomic, locks


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def check_out_dir(src: Path, out: Path, overwrite: bool) -> None:
    """Everything about --out that can be wrong, before any model is read."""
    src_abs, out_abs = src.resolve(), out.resolve()
    if _inside(out_abs, src_abs) or _inside(src_abs, out_abs):
        raise UserError(f"--out: {out} overlaps the checkpoint {src}; choose a directory outside it")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    if out.is_dir() and not overwrite:
        entries = sorted(p.name for p in out.iterdir())
        if entries:
            raise UserError(f"--out: {out} is not empty ({len(entries)} entries, e.g. {entries[0]!r}); choose a new "
                            "directory, or pass --overwrite to replace only the export's files and keep the rest")


def _fp32_masters(checkpoint: Path):
    """The ZeRO fp32 master weights (verified) of the checkpoint whose model/ is exported, or None."""
    if not is_checkpoint(checkpoint):
        return None
    problem = manifest.verify(checkpoint, under="ds")
    if problem:
        raise UserError(f"{checkpoint}: {problem}; use another checkpoint")
    masters = zero_masters(checkpoint)
    if masters is not None:
        print(f"exporting the fp32 master weights of {checkpoint / 'ds'}")
    return masters


def _tokenizer_spec(model_dir: Path) -> Optional[str]:
    """The tokenizer an HF directory carries (its recorded "byte" or its own files), or None."""
    try:
        return tokenizer_spec_for(model_dir, None)
    except UserError:
        return None  # a model directory without a tokenizer: the export has none either


def _note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr, flush=True)


def lock_path(target: Path) -> Path:
    """The lock of an export into `target`: beside it, so it is never part of the export."""
    return target.with_name(f".{target.name}.lock")


@contextmanager
def export_lock(target: Path, out: Path) -> Iterator[None]:
    """One export at a time into `target`. A live holder is refused (the second export would
    otherwise replace the first's files without --overwrite); a dead one on this host is
    taken over with a notice."""
    path, me = lock_path(target), locks.this_process()
    while not _try_take(path, me, target, out):
        holder = locks.read_holder(path)
        if holder is None:
            continue  # released between our attempt and the read
        alive = locks.is_alive(holder)
        if alive is False:
            _note(f"taking over {path}: its holder ({holder.describe()}) is no longer running")
            locks.remove_dead(path, holder)
            continue
        gone = "" if alive else f"; if {holder.host} is gone, remove {path}"
        raise UserError(f"--out: {out} is being written by another export ({holder.describe()}); wait for it to "
                        f"finish or choose another directory{gone}")
    try:
        yield
    finally:
        locks.release(path, me)


def _try_take(path: Path, me: locks.Holder, target: Path, out: Path) -> bool:
    try:
        return locks.try_take(path, me)
    except OSError as e:  # --out's directory cannot be written: say so before any model is read
        raise _write_failure(OSError(e.errno, e.strerror, str(out)), target, out) from None


def check_space(weights: dict, config, dtype: Optional[torch.dtype], target: Path, out: Path) -> None:
    """Refuse an export that cannot fit, before writing any of it (an --overwrite export needs
    the full new size too: the old one stays until the swap)."""
    need = sum(t.numel() * (dtype or t.dtype).itemsize for k, t in weights.items()
               if not (k == "lm_head.weight" and config.tie_word_embeddings))
    free = atomic.free_bytes(target.parent)
    if free is not None and free < need:
        raise UserError(f"--out: {out} needs ~{atomic.human_size(need)} for the weights, {atomic.human_size(free)} "
                        "free on its disk; free some space or choose another directory")


def _write_failure(e: OSError, target: Path, out: Path) -> UserError:
    """One line naming the file as it will be in --out (not in the temporary sibling)."""
    where = Path(e.filename) if e.filename else out
    for tmp in (where, *where.parents):
        if tmp.parent == target.parent and atomic.owner_of(tmp) is not None:
            where = out / where.relative_to(tmp)
            break
    return UserError(f"--out: {atomic.write_error(OSError(e.errno, e.strerror, str(where)), out)}")


class _Terminated(BaseException):
    """SIGTERM arrived: unwinds like Ctrl-C, so the temporary sibling and the lock go too."""


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    def stop(signum, frame):
        raise _Terminated()
    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    src, out = Path(args.checkpoint), Path(args.out)
    check_out_dir(src, out, args.overwrite)
    if getattr(args, "adapter", False):
        if not src.is_dir():
            raise UserError(f"--checkpoint: {src} is not a directory (an adapter run's directory or checkpoint)")
        with export_lock(export_target(out), out):
            check_out_dir(src, out, args.overwrite)
            origin = export_adapter(src, out)
        print(f"exported the PEFT adapter of {origin} -> {out}")
        return 0
    model_dir = resolve_model_dir(src, field="--checkpoint")  # a checkpoint: COMPLETE, matching its manifest
    try:
        with _sigterm_unwinds():
            _locked_export(src, out, model_dir, args)
    except _Terminated:
        print(f"error: export stopped by SIGTERM; nothing of it is half-written in {out}", file=sys.stderr)
        return 128 + signal.SIGTERM
    print(f"exported {model_dir} -> {out}")
    return 0


def _locked_export(src: Path, out: Path, model_dir: Path, args: argparse.Namespace) -> None:
    target = export_target(out)
    with export_lock(target, out):
        atomic.remove_stale(target.parent, _note, name=target.name)
        check_out_dir(src, out, args.overwrite)  # again, holding --out: an export may have finished meanwhile
        weights, config, dtype, tokenizer = _weights(model_dir, args.dtype)
        check_space(weights, config, dtype, target, out)
        try:
            save_hf_weights(weights, config, out, dtype=dtype, tokenizer=tokenizer)
        except OSError as e:
            raise _write_failure(e, target, out) from None


def _weights(model_dir: Path, dtype_name: Optional[str]):
    """(weights, model config, dtype, tokenizer writer) of what is exported."""
    dtype = DTYPES[dtype_name] if dtype_name else None
    if is_ds_only_checkpoint(model_dir):
        trained = trained_model(model_dir)
        tokenizer = TokenizerFiles(trained.tokenizer) if trained.tokenizer else None
        print(f"consolidating the ZeRO shards of {model_dir / 'ds'} (the checkpoint has no model/ export)")
        weights = load_consolidated(model_dir, trained.config).state_dict()
        config, dtype = trained.config, dtype or trained.dtype
    else:
        spec = _tokenizer_spec(model_dir)
        tokenizer = TokenizerFiles(spec) if spec else None
        weights = _fp32_masters(model_dir.parent) if dtype == torch.float32 else None
        config = read_checkpoint_or_model_config(model_dir)
        if weights is None:
            weights = (load_auto_model(model_dir, config) if isinstance(config, AutoModelSpec)
                       else load_pretrained(model_dir)).state_dict()
    return weights, config, dtype, tokenizer
