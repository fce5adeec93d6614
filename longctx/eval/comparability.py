"""Whether a RULER score from this eval can be put next to a published one, and why not.

    verdict = assess(records, options, tokenizer=tok, model_dir=path, skipped=skipped)
    verdict == {"ruler_comparable": False, "departures": ["built-in essay haystack ...", ...]}

A score is comparable only for RULER's own prepared prompts (`ruler_data`: prepare.py's files,
so RULER's essays, QA, words and model template) of all 13 tasks with RULER's 500 samples per
task and length, RULER's budgets and a subword tokenizer. Our generator's prompts (and files
--write-data wrote) are always a departure, with the others they have (data, style, grids,
chat template). Each departure is one short sentence naming what closes it in its mode.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from longctx.data.tokenizer import ByteTokenizer
from longctx.eval.haystack import SINGLE_WORDS
from longctx.eval.tasks import RULER_TASKS, TASKS, TaskOptions
from longctx.eval.tasks.base import resolve_chat_template

RULER_SAMPLES = 500
ESSAY_TASKS = [t for t in RULER_TASKS if getattr(TASKS[t], "haystack", None) == "essay"]


def model_has_chat_template(model_dir: Optional[str | Path]) -> bool:
    """The model ships a chat template (tokenizer_config.json's "chat_template", or a
    chat_template.jinja file): a chat model, evaluated by RULER through that template."""
    if model_dir is None:
        return False
    d = Path(model_dir)
    if (d / "chat_template.jinja").is_file():
        return True
    cfg = d / "tokenizer_config.json"
    try:
        return bool(json.loads(cfg.read_text()).get("chat_template")) if cfg.is_file() else False
    except (OSError, ValueError):
        return False


def _data_departures(tasks: set, options: TaskOptions, records: Sequence[dict]) -> list[str]:
    """Haystack and word data that differ from RULER's (our generator only)."""
    out = []
    essay = [t for t in ESSAY_TASKS if t in tasks]
    if essay and options.essay_path is None:
        out.append(f"built-in essay haystack for {', '.join(essay)} (a ~1,000-word text repeated; RULER uses "
                   "Paul Graham's essays: pass essay=FILE)")
    # words a cwe list used (distinct + filler); the built-in ones less the example's 10 are real
    cwe_words = [r.get("meta", {}).get("haystack_units", 0) + r.get("meta", {}).get("filler_words", 0)
                 for r in records if r["task"] == "cwe"]
    if cwe_words and options.words_path is None and max(cwe_words) > len(SINGLE_WORDS) - 10:
        out.append(f"cwe past {len(SINGLE_WORDS)} words uses made-up words (RULER uses real English words: "
                   "pass words=english_words.json)")
    return out


GENERATOR = ("prompts from longctx's generator, not RULER's prepare.py (RULER's own: run its prepare.py and pass "
             "ruler_data=DIR)")
WRITTEN = ("prompts written by longctx eval --write-data, not RULER's prepare.py (RULER's own: run its prepare.py "
           "and pass ruler_data=DIR)")


def _run_departures(tasks: set, options: TaskOptions, records: Sequence[dict], tokenizer,
                    chat_model: bool, generated: bool) -> list[str]:
    """The run's own choices; each hint names what closes it in this mode (generated: our
    prompts, else RULER's prepared data, whose tasks, samples and template prepare.py sets)."""
    out = []
    missing = [t for t in RULER_TASKS if t not in tasks]
    qa_missing = [t for t in ("qa_1", "qa_2") if t in missing]
    if qa_missing and generated:
        out.append(f"{' and '.join(qa_missing)} not evaluated (pass squad=FILE / hotpotqa=FILE)")
    if missing:
        how = "" if generated else "; prepare them with RULER's prepare.py into ruler_data"
        out.append(f"{13 - len(missing)} of RULER's 13 tasks evaluated (missing: {', '.join(missing)}{how})")
    extra = sorted(tasks - set(RULER_TASKS))
    if extra:
        out.append(f"the averages include tasks outside RULER's 13 ({', '.join(extra)}; leave them out of tasks)")
    counts: dict = {}
    for r in records:
        counts[(r["task"], r["target_length"])] = counts.get((r["task"], r["target_length"]), 0) + 1
    if counts and min(counts.values()) < RULER_SAMPLES:
        how = f"samples={RULER_SAMPLES}" if generated else f"prepare.py --num_samples {RULER_SAMPLES}"
        out.append(f"{min(counts.values())} samples per task and length (RULER uses {RULER_SAMPLES}: {how})")
    if generated and options.style != "ruler":
        out.append(f"style={options.style} (shorter templates and budgets than RULER's; style=ruler)")
    if options.max_new_tokens is not None:
        out.append(f"max_new_tokens={options.max_new_tokens} overrides RULER's per-task budgets (leave it unset)")
    if generated and options.num_digits not in (None, 7):
        out.append(f"num_digits={options.num_digits} (RULER's needle values have 7 digits; leave it unset)")
    if generated and any(r.get("depth") is not None for r in records):
        out.append("needles at controlled depths (a grid); RULER places them at random depths (suite ruler, no depths)")
    if generated and chat_model and resolve_chat_template(options.chat_template) == "{input}":
        out.append("no chat template for a chat model (RULER wraps every prompt in the model's template: "
                   "leave chat_template unset, or chat_template=auto)")
    if isinstance(tokenizer, ByteTokenizer):
        out.append("byte tokenizer: lengths count bytes, so a prompt holds ~4x less text than RULER's at "
                   "the same length")
    return out


def assess(records: Sequence[dict], options: TaskOptions = TaskOptions(), *, tokenizer=None,
           model_dir: Optional[str | Path] = None, ruler_data: bool = False) -> dict:
    """{"ruler_comparable": bool, "departures": [str, ...]} for an eval's per-sample records.

    ruler_data: the prompts came from prepared files (their essays, QA, words and model
    template are the files', so only the run's own choices can depart); files that
    --write-data wrote are our generator's prompts still. Our generator is always a departure."""
    tasks = {r["task"] for r in records}
    written = ruler_data and any(r.get("meta", {}).get("generator") == "longctx" for r in records)
    departures = [] if ruler_data else [GENERATOR] + _data_departures(tasks, options, records)
    if written:
        departures.append(WRITTEN)
    departures += _run_departures(tasks, options, records, tokenizer, model_has_chat_template(model_dir),
                                  generated=not ruler_data)
    return {"ruler_comparable": not departures, "departures": departures}


def warning_line(verdict: dict) -> Optional[str]:
    """The one line the CLI prints when the scores are not comparable (None when they are)."""
    if verdict["ruler_comparable"]:
        return None
    return ("warning: not comparable with published RULER numbers: " + "; ".join(verdict["departures"])
            + " (results.json 'departures')")
