"""`longctx eval --write-data DIR`: our prompts in RULER's prepared-data layout, no weights.

    files, skipped = write_prompts(cfg)     # DIR/<L>/data/<task>/validation.jsonl

The prompts are fitted to the lengths with the evaluated model's tokenizer (its directory's
tokenizer files, or cfg.tokenizer), exactly as an eval would generate them.
"""
from __future__ import annotations

from pathlib import Path

from longctx.base.errors import UserError
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.chat import with_chat_template
from longctx.eval.config import TOKENIZER_FIELD, EvalConfig, select
from longctx.eval.model_io import load_tokenizer_for, resolve_model_dir
from longctx.eval.prepare import generate_all
from longctx.eval.ruler_format import DATA_FILE, write_ruler_data


def _tokenizer(cfg: EvalConfig):
    if cfg.model:
        return load_tokenizer_for(resolve_model_dir(cfg.model, cfg.revision), cfg.tokenizer)
    return load_tokenizer(cfg.tokenizer, field=TOKENIZER_FIELD)


def write_prompts(cfg: EvalConfig) -> tuple[list[str], list[str]]:
    """(files written, skip messages for tasks whose data is missing); never overwrites a file."""
    tokenizer = _tokenizer(cfg)
    _, cfg = with_chat_template(cfg, tokenizer)  # unset or "auto": the tokenizer's own template
    run = select(cfg)
    root = Path(cfg.write_data)
    taken = [root / str(L) / "data" / t / DATA_FILE for L in run.lengths for t in run.tasks]
    existing = [p for p in taken if p.exists()]
    if existing:
        raise UserError(f"eval.write_data: {existing[0]} exists; write into an empty directory")
    samples, skipped = generate_all(run.tasks, run.lengths, cfg.samples, tokenizer, seed=cfg.seed,
                                    options=run.options, depths=run.grids)
    if not samples:
        raise UserError("eval.tasks: nothing to write (" + "; ".join(skipped) + ")")
    return write_ruler_data(root, samples, tokenizer), skipped  # lengths as RULER counts them
