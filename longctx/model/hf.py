"""Hugging Face checkpoints of the supported families (Llama, Mistral, Qwen2, Qwen3) in and out
(config.json + safetensors, single or sharded)."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from longctx.attention import AttentionFn, sdpa_attention
from longctx.base.errors import UserError
from longctx.model.auto.support import AutoModelSpec
from longctx.model.config import ModelConfig
from longctx.model.hf_config import config_to_hf, read_hf_config
from longctx.model.llama import Transformer
from longctx.storage import atomic


# ------------------------------------------------------------------------------ names
def to_hf_key(key: str) -> str:
    return key if key.startswith("lm_head.") else f"model.{key}"


def from_hf_key(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key


# ----------------------------------------------------------------------------- loading
def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise UserError(f"{index}: not a valid safetensors index ({e})") from None
        files = sorted({path / name for name in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise UserError(f"{f}: listed in {index.name} but missing")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    if (path / "pytorch_model.bin").is_file():
        return [path / "pytorch_model.bin"]
    raise UserError(f"{path}: no weights found; "
                    "expected model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def _iter_tensors(files: list[Path]):
    for f in files:
        if f.suffix == ".bin":
            for k, v in torch.load(f, map_location="cpu", weights_only=True).items():
                yield f, k, v
            continue
        try:
            with safe_open(str(f), framework="pt") as handle:
                for k in handle.keys():
                    yield f, k, handle.get_tensor(k)
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise UserError(f"{f}: cannot read safetensors file ({e})") from None


def load_pretrained(path: str | os.PathLike, dtype: Optional[torch.dtype] = None,
                    attn_fn: Optional[AttentionFn] = None, device: str | torch.device = "cpu",
                    config: Optional[ModelConfig] = None) -> Transformer:
    """Load a local HF directory of a supported family. `config` may override the stored one (e.g. new RoPE
    parameters for continued pretraining) as long as the shapes agree."""
    path = Path(path)
    stored = read_hf_config(path)
    cfg = config if config is not None else stored
    files = _weight_files(path)
    with torch.device("meta"):
        model = Transformer(cfg, attn_fn or sdpa_attention)
    expected = {to_hf_key(k): v for k, v in model.state_dict().items()}
    state = {}
    for f, key, tensor in _iter_tensors(files):
        if key.endswith("rotary_emb.inv_freq"):
            continue  # old checkpoints stored RoPE buffers; we recompute them
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if key not in expected:
            raise UserError(f"{f}: unexpected tensor {key!r} for a {cfg.model_type} model with this config.json "
                            f"({_config_summary(cfg)})")
        want = tuple(expected[key].shape)
        if tuple(tensor.shape) != want:
            raise UserError(f"{f}: tensor {key!r} has shape {list(tensor.shape)}, config.json implies {list(want)}")
        state[from_hf_key(key)] = tensor.to(device=device, dtype=dtype or tensor.dtype)
    missing = sorted(set(expected) - {to_hf_key(k) for k in state})
    if missing:
        raise UserError(f"{path}: weights are missing tensor {missing[0]!r} (and {len(missing) - 1} more)"
                        if len(missing) > 1 else f"{path}: weights are missing tensor {missing[0]!r}")
    model.load_state_dict(state, strict=True, assign=True)
    return model


def _config_summary(cfg: ModelConfig) -> str:
    """The fields that decide which tensors exist, as the error for an unexpected one shows them."""
    return (f"attention_bias={cfg.attention_bias}, qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}, "
            f"mlp_bias={cfg.mlp_bias}, tie_word_embeddings={cfg.tie_word_embeddings}").lower()


# ------------------------------------------------------------------------------ saving
def _shards(state: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards, current, size = [], {}, 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[key] = tensor
        size += nbytes
    shards.append(current)
    return shards


# the tokenizer files an export may hold (longctx/data/hf_tokenizer.py writes them)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                    "vocab.json", "merges.txt")


class TokenizerWriter(Protocol):
    """Writes a tokenizer's files into an export (longctx.data.hf_tokenizer.TokenizerFiles)."""

    def write(self, directory: Path, max_length: int) -> dict:
        """Write the files; return the config.json entries that match them (bos/eos/pad ids)."""


def generation_config(hf_config: dict) -> dict:
    """generation_config.json as transformers derives it from a config.json."""
    out: dict = {"_from_model_config": True}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if hf_config.get(key) is not None:
            out[key] = hf_config[key]
    return out


# what an export writes: with an existing target these are replaced (or dropped when this
# export does not write them, e.g. shards of an earlier export); every other entry is kept
_EXPORT_FILE = re.compile(r"(config\.json|generation_config\.json|model\.safetensors(\.index\.json)?"
                          r"|model-\d{5}-of-\d{5}\.safetensors|" + "|".join(map(re.escape, _TOKENIZER_FILES)) + ")")


def export_files_in(path: Path) -> list[Path]:
    """The files in `path` that an export writes (and so would replace)."""
    return sorted(f for f in path.iterdir() if f.is_file() and _EXPORT_FILE.fullmatch(f.name)) if path.is_dir() else []


def export_target(path: str | os.PathLike) -> Path:
    """The absolute directory an export into `path` replaces (a symlink's target: the link
    stays); its temporary siblings live beside it."""
    target = Path(os.path.abspath(path))
    return target.resolve() if target.is_symlink() else target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def _writing(file: Path) -> Iterator[None]:
    """A failed write of `file` is an OSError that names it (safetensors' errors included)."""
    try:
        yield
    except Exception as e:
        err = atomic.os_error(e)
        if err is None:
            raise
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror, str(file)) from None


def _link_tree(src: Path, dst: Path) -> None:
    """`src` at `dst`: files hard-linked (copied where links fail), symlinks as symlinks."""
    with _writing(dst):
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            os.mkdir(dst)
            for child in src.iterdir():
                _link_tree(child, dst / child.name)
            shutil.copystat(src, dst)
        else:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


def _keep_others(path: Path, tmp: Path) -> None:
    """Link into `tmp` every entry of `path` that is not an export file."""
    for entry in path.iterdir():
        if not _EXPORT_FILE.fullmatch(entry.name):  # export files: this export's, or stale ones of an earlier one
            _link_tree(entry, tmp / entry.name)


def _install(tmp: Path, path: Path) -> None:
    """Make the finished export in `tmp` be `path`. An existing `path` is replaced whole, by a
    swap (atomic.swap_directory), with its other files (README, notes) linked into the new
    directory first: a reader sees the old export or the new one, never a mix."""
    mode = 0o666 & ~_umask()
    for f in tmp.iterdir():
        f.chmod(mode)  # safetensors writes 0600; an export is for teammates and serving jobs too
    if path.is_dir():
        _keep_others(path, tmp)
        tmp.chmod(stat.S_IMODE(path.stat().st_mode))  # the directory keeps its mode (group, setgid)
    atomic.swap_directory(tmp, path)


def _save_shard(tensors: dict[str, torch.Tensor], file: Path) -> None:
    with _writing(file):
        save_file(tensors, str(file), metadata={"format": "pt"})


def _write_json(file: Path, obj: dict) -> None:
    with _writing(file):
        file.write_text(json.dumps(obj, indent=2))


def save_pretrained(model: Transformer, path: str | os.PathLike, *, dtype: Optional[torch.dtype] = None,
                    max_shard_bytes: int = 5 * 2**30, tokenizer: Optional[TokenizerWriter] = None) -> Path:
    """Write an HF directory of the model's family: built in a temporary sibling, then swapped into place (see
    _install: an existing directory keeps every file that is not an export file). A failed
    write raises an OSError that names the file and leaves `path` as it was."""
    return save_hf_weights(model.state_dict(), model.config, path, dtype=dtype, max_shard_bytes=max_shard_bytes,
                           tokenizer=tokenizer)


def save_hf_weights(state_dict: dict[str, torch.Tensor], config: ModelConfig, path: str | os.PathLike, *,
                    dtype: Optional[torch.dtype] = None, max_shard_bytes: int = 5 * 2**30,
                    tokenizer: Optional[TokenizerWriter] = None) -> Path:
    """Like save_pretrained, from our-named weights (e.g. gathered from ZeRO-3 shards).

    `tokenizer` writes its files next to the weights (so transformers and evaluation find it
    without flags); config.json and generation_config.json take its special token ids.
    Temporaries of `path` that a dead process left beside it are removed first, with a note."""
    target = export_target(path)
    atomic.remove_stale(target.parent, atomic.note, name=target.name)  # what a killed export left beside it
    tmp = atomic.make_temp_dir(target)
    try:
        state = {}
        own_names = isinstance(config, AutoModelSpec)  # transformers-path weights carry their HF names
        for key, tensor in state_dict.items():
            if key == "lm_head.weight" and config.tie_word_embeddings:
                continue
            t = tensor.detach().to("cpu")
            state[key if own_names else to_hf_key(key)] = (t.to(dtype) if dtype is not None else t).contiguous()
        out_dtype = next(iter(state.values())).dtype
        shards = _shards(state, max_shard_bytes)
        if len(shards) == 1:
            _save_shard(shards[0], tmp / "model.safetensors")
        else:
            weight_map, total = {}, 0
            for i, shard in enumerate(shards, 1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                _save_shard(shard, tmp / name)
                for key, t in shard.items():
                    weight_map[key] = name
                    total += t.numel() * t.element_size()
            _write_json(tmp / "model.safetensors.index.json",
                        {"metadata": {"total_size": total}, "weight_map": weight_map})
        hf_config = config_to_hf(config, out_dtype)
        if tokenizer is not None:
            with _writing(tmp):
                hf_config.update(tokenizer.write(tmp, config.max_position_embeddings))
        _write_json(tmp / "generation_config.json", generation_config(hf_config))
        _write_json(tmp / "config.json", hf_config)
        _install(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Path(path)
