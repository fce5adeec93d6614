"""A llama GGUF file (any quantization transformers reads) as a plain Hugging Face directory.

    check = convert(Path("model.gguf"), Path("out_dir"), overwrite=False)

transformers dequantizes the GGUF (`from_pretrained(dir, gguf_file=...)`), but the model it
returns keeps a `quantization_config` and `save_pretrained` refuses it; the weights are copied
into a plain `LlamaForCausalLM` built from the same config without it (the keys match). The
directory holds config.json, model.safetensors (float32: the dequantized values exactly), the
tokenizer built from the GGUF's metadata (tokenizer.json, tokenizer_config.json, the chat
template) and generation_config.json with every end-of-sequence/turn id. Before it is
installed, longctx loads it and its logits on a short prompt are compared with transformers'
GGUF-loaded model; the result is longctx_check.json in the directory.

The directory is built in a temporary sibling and renamed into place (longctx.storage.atomic).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

import longctx
from longctx.base.errors import UserError
from longctx.model.generate import generate
from longctx.storage import atomic

CHECK_FILE = "longctx_check.json"
CHECK_PROMPT = "The capital of France is"
TOLERANCE = 1e-3  # max |logit difference| in float32 (logits are O(10); observed differences are ~1e-5)
# transformers has no split for llama.cpp's `smollm` pre-tokenizer and falls back to GPT-2's;
# the model was trained with single digits split off first (its original tokenizer.json)
PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
}
# ids the GGUF may name besides eos; control tokens spelled like this end a document or turn too
_END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
_END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "</s>")
_DROP_CONFIG = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


def gguf_metadata(path: Path) -> dict:
    """The GGUF's scalar and string metadata (arrays are left out) and its pre-tokenizer name."""
    from gguf import GGUFReader  # the `gguf` package; transformers needs it for GGUF files anyway

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError/struct errors for files that are not GGUF
        raise UserError(f"{path}: not a readable GGUF file ({e})") from None
    meta = {}
    for key, field in reader.fields.items():
        if len(field.data) == 1:
            meta[key] = field.contents()
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    types = reader.fields.get("tokenizer.ggml.token_type")
    if tokens is not None and types is not None:
        control = [i for i, t in enumerate(types.contents()) if t == 3]
        names = tokens.contents()
        meta["_control_tokens"] = {i: names[i] for i in control}
    return meta


def end_ids(meta: dict) -> list[int]:
    """Every id that ends generation: the GGUF's eos/eot/eom, then the control tokens that end
    a document or a turn (e.g. <|endoftext|> besides a chat model's <|im_end|>)."""
    ids = [int(meta[k]) for k in _END_KEYS if k in meta]
    ids += [i for i, name in sorted(meta.get("_control_tokens", {}).items()) if name in _END_TOKENS]
    return list(dict.fromkeys(ids))


def load_gguf(path: Path):
    """(transformers model in float32, tokenizer) from the GGUF file `path`."""
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: transformers cannot load this GGUF ({str(e).splitlines()[0]})") from None
    if model.config.model_type != "llama":
        raise UserError(f"{path}: architecture {model.config.model_type!r} is not supported; valid: llama")
    return model.eval(), tok


def plain_model(gguf_model) -> LlamaForCausalLM:
    """The same weights in a LlamaForCausalLM whose config has no quantization_config."""
    cfg = {k: v for k, v in gguf_model.config.to_dict().items() if k not in _DROP_CONFIG}
    cfg["architectures"] = ["LlamaForCausalLM"]
    plain = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    return plain.eval()


def _fix_tokenizer(tok, meta: dict, max_length: int):
    make = PRE_TOKENIZERS.get(meta.get("tokenizer.ggml.pre"))
    if make is not None:
        tok.backend_tokenizer.pre_tokenizer = make()
    tok.model_max_length = max_length
    return tok


def _portable_tokenizer_config(path: Path, meta: dict) -> None:
    """Name the tokenizer class every transformers version reads (5.x writes its own alias,
    TokenizersBackend, which 4.x does not know), state the GGUF's add_bos/add_eos flags (a
    reader that is not told may add a BOS the model never saw), and drop the keys only the
    writer's session meant."""
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{key}" in meta:
            cfg[key] = bool(meta[f"tokenizer.ggml.{key}"])
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@torch.no_grad()
def compare(out_dir: Path, gguf_model, tok, prompt: str = CHECK_PROMPT, max_new_tokens: int = 8) -> dict:
    """longctx's model loaded from `out_dir` vs transformers' GGUF-loaded model on `prompt`:
    the max abs logit difference, and both greedy continuations."""
    ours = longctx.load_pretrained(out_dir, dtype=torch.float32).eval()
    ids = tok(prompt).input_ids
    x = torch.tensor([ids])  # (1, T)
    theirs = gguf_model(x).logits.float()  # (1, T, V)
    mine = ours(x).float()  # (1, T, V)
    diff = (mine - theirs).abs().max().item()
    stop = gguf_model.generation_config.eos_token_id
    stop = stop[0] if isinstance(stop, list) else stop
    our_new = generate(ours, [ids], max_new_tokens, eos_id=stop)[0]
    their_new = gguf_model.generate(x, max_new_tokens=max_new_tokens, do_sample=False)[0, len(ids):].tolist()
    their_new = their_new[:their_new.index(stop)] if stop in their_new else their_new
    return {"prompt": prompt, "prompt_tokens": len(ids), "max_abs_logit_diff": diff, "tolerance": TOLERANCE,
            "ok": diff <= TOLERANCE, "dtype": "float32", "greedy_longctx": tok.decode(our_new),
            "greedy_transformers": tok.decode(their_new), "greedy_equal": our_new == their_new}


def check_target(out: Path, overwrite: bool) -> Path:
    target = Path(os.path.abspath(out))
    if target.exists() and not overwrite:
        raise UserError(f"{out}: already exists; pass --overwrite to replace it, or choose another OUT")
    if target.exists() and not target.is_dir():
        raise UserError(f"{out}: exists and is not a directory; choose another OUT")
    return target


def convert(gguf_path: Path, out: Path, *, overwrite: bool = False, source: Optional[dict] = None,
            log=print) -> dict:
    """Write the HF directory `out` from `gguf_path`; returns the check (also in out/CHECK_FILE).
    A failed check (logits beyond TOLERANCE) is a UserError and leaves `out` as it was."""
    target = check_target(out, overwrite)
    if not gguf_path.is_file():
        raise UserError(f"--gguf {gguf_path}: no such file")
    meta = gguf_metadata(gguf_path)
    log(f"dequantizing {gguf_path.name} with transformers")
    gguf_model, tok = load_gguf(gguf_path)
    plain = plain_model(gguf_model)
    eos = end_ids(meta) or [plain.config.eos_token_id]
    plain.generation_config = GenerationConfig(bos_token_id=plain.config.bos_token_id, eos_token_id=eos,
                                               pad_token_id=plain.config.pad_token_id)
    tok = _fix_tokenizer(tok, meta, plain.config.max_position_embeddings)
    atomic.remove_stale(target.parent, atomic.note, name=target.name)
    tmp = atomic.make_temp_dir(target)
    try:
        with atomic.user_errors(out):
            plain.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            _portable_tokenizer_config(tmp / "tokenizer_config.json", meta)
        log("comparing longctx's logits with transformers' GGUF-loaded model")
        check = compare(tmp, gguf_model, tok)
        check["source"] = {"gguf": gguf_path.name, "gguf_sha256": sha256(gguf_path), **(source or {})}
        check["generation_eos_token_id"] = eos
        if not check["ok"]:
            raise UserError(f"{out}: longctx's logits differ from transformers' by {check['max_abs_logit_diff']:.3g} "
                            f"(> {TOLERANCE}); not written")
        (tmp / CHECK_FILE).write_text(json.dumps(check, indent=2) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o666 & ~_umask())  # safetensors writes 0600; the model is for teammates too
        atomic.swap_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return check
