"""`longctx eval --mrcr SOURCE`: MRCR on the loaded model or a served one, resumable.

    answer = model_answerer(engine, tokenizer, max_new_tokens)        # in process (CP prefill under --cp)
    answer = endpoint_answerer(client, served_model, tokenizer, n)     # --endpoint-mode chat
    section, finished = run(cfg, answer, identity=..., stop=flag)
    add_to_outputs(out, section)                                        # results.json "mrcr", report.md

Each answered row is kept in OUT/mrcr/records.jsonl (rewritten by a rename after every row) for one
model (OUT/mrcr/identity.json); the same command rerun continues after the last one.
A row's generation budget is --max-new-tokens, else its answer's token count + 64.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from longctx.base.errors import UserError
from longctx.data.tokenizer import prepends_bos
from longctx.eval import mrcr
from longctx.eval.answers_dir import answers_dir
from longctx.eval.chat import own_template, render_conversation, special_tokens, tokenizer_dir
from longctx.eval.extra_sections import add_section
from longctx.storage import atomic

SECTION = "mrcr"
SLACK = 64  # new tokens beyond the answer's length when --max-new-tokens is unset


def _budget(tokenizer, row: dict, max_new_tokens: Optional[int]) -> tuple[int, int]:
    """(the answer's token count, the generation budget)."""
    n = len(tokenizer.encode(row["answer"]))
    return n, max_new_tokens or n + SLACK


def model_answerer(engine, tokenizer, max_new_tokens: Optional[int] = None) -> Callable[[dict], tuple[str, int]]:
    """Rows answered by greedy decoding after the tokenizer's own chat template."""
    directory = tokenizer_dir(getattr(tokenizer, "source", None))
    template, where = own_template(directory)
    if template is None:
        raise UserError(f"eval.mrcr: MRCR is a conversation: the tokenizer needs its own chat template "
                        f"(chat_template.jinja or tokenizer_config.json's \"chat_template\"); none in {directory}")
    specials = special_tokens(directory)
    bos = specials.get("bos_token")

    def answer(row: dict) -> tuple[str, int]:
        text = render_conversation(template, specials, mrcr.messages(row), where)
        ids = tokenizer.encode(text, add_bos=prepends_bos(tokenizer) and not (bos and text.startswith(bos)))
        n_answer, budget = _budget(tokenizer, row, max_new_tokens)
        return tokenizer.decode(engine.generate_ids([ids], budget)[0]), len(ids) + n_answer

    return answer


def endpoint_answerer(client, model: str, tokenizer, max_new_tokens: Optional[int] = None):
    """Rows sent as messages to the server's /chat/completions (its own template), greedy; the token
    count is the messages' text and the answer in our tokenizer (the template's tokens aside)."""
    def answer(row: dict) -> tuple[str, int]:
        msgs = mrcr.messages(row)
        n_answer, budget = _budget(tokenizer, row, max_new_tokens)
        body = {"model": model, "messages": msgs, "max_tokens": budget, "temperature": 0}
        reply = client.post("chat/completions", body)
        text = (reply.get("choices") or [{}])[0].get("message", {}).get("content") or ""
        tokens = sum(len(tokenizer.encode(m["content"])) for m in msgs) + n_answer
        return text, tokens

    return answer


def _store(out: Optional[str], identity: Optional[dict], overwrite: bool, main: bool) -> Optional[Path]:
    return answers_dir(out, SECTION, "MRCR", identity, overwrite, main)


def run(cfg, answer, *, identity: Optional[dict] = None, stop=None, main: bool = True,
        overwrite: bool = False) -> tuple[dict, bool]:
    """(results.json's "mrcr" section, whether every row was answered)."""
    rows = mrcr.load_rows(cfg.mrcr, cfg.mrcr_samples)
    d = _store(cfg.out, identity, overwrite, main)
    records_file = d / "records.jsonl" if d is not None else None
    done = []
    if records_file is not None and records_file.is_file():
        wanted = {r["index"] for r in rows}
        done = [r for r in map(json.loads, records_file.read_text().splitlines()) if r["index"] in wanted]
    kept = list(done)

    def keep(rec: dict) -> None:
        kept.append(rec)
        if main and records_file is not None:
            atomic.write_text(records_file, "".join(json.dumps(r) + "\n" for r in kept))

    records, finished = mrcr.run_rows(rows, answer, done=done, on_record=keep, stop=stop)
    return {"source": cfg.mrcr, "rows": len(rows), "summary": mrcr.summarize(records)}, finished


def add_to_outputs(out: Path, section: dict) -> None:
    """results.json gets the "mrcr" section, report.md its table (each rewritten by a rename)."""
    add_section(out, SECTION, section, "## MRCR", mrcr.render(section["summary"]))
