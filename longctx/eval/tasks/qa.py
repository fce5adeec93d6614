"""Question answering (RULER qa_1 = SQuAD, qa_2 = HotpotQA) over many distractor documents.

The golden paragraph(s) of a question are mixed with distractors (for SQuAD first the other
paragraphs of the same article, then random ones) until the prompt fills the length. Scored
with string_match_part: any annotated answer counts. Data is read from local files; without
them the tasks are skipped with a message.

Accepted files: SQuAD v2 dev json ({"data": [{"paragraphs": [{"context", "qas": [...]}]}]}),
HotpotQA dev distractor json ([{"question", "answer", "context": [[title, [sentences]]]}]);
both may also be given as .jsonl with one such record per line.
"""
from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path
from typing import Optional

from longctx.base.errors import UserError
from longctx.eval.tasks.base import Draft, Task, TaskOptions

_TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and do not output "
             "any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question "
             "based on the given documents. Only give me the answer and do not output any other words.\n\n"
             "Question: {query}")
_PREFIX = " Answer:"
_DOC = "Document {i}:\n{doc}"


def _read_json_records(path: Path):
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not valid JSON or JSON lines ({e.msg} at line {e.lineno})") from None


@lru_cache(maxsize=4)
def load_squad(path: str) -> tuple[list[dict], list[str]]:
    """(questions, documents). Each question: query, outputs, gold doc ids, same-article doc ids."""
    data = _read_json_records(Path(path))
    articles = data["data"] if isinstance(data, dict) else data
    try:
        docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
        doc_id = {c: i for i, c in enumerate(docs)}
        qas = []
        for a in articles:
            article_docs = [doc_id[p["context"]] for p in a["paragraphs"]]
            for p in a["paragraphs"]:
                gold = doc_id[p["context"]]
                for q in p["qas"]:
                    if q.get("is_impossible", False) or not q.get("answers"):
                        continue
                    qas.append({"query": q["question"], "outputs": [x["text"] for x in q["answers"]],
                                "gold": [gold], "more": [d for d in article_docs if d != gold]})
    except (KeyError, TypeError) as e:
        raise UserError(f"{path}: not in SQuAD format (missing {e}); "
                        f"expected {{'data': [{{'paragraphs': [...]}}]}}") from None
    if not qas:
        raise UserError(f"{path}: no answerable questions found")
    return qas, docs


@lru_cache(maxsize=4)
def load_hotpotqa(path: str) -> tuple[list[dict], list[str]]:
    data = _read_json_records(Path(path))
    try:
        docs = sorted({f"{t}\n{''.join(s)}" for d in data for t, s in d["context"]})
        doc_id = {c: i for i, c in enumerate(docs)}
        qas = [{"query": d["question"], "outputs": [d["answer"]],
                "gold": [doc_id[f"{t}\n{''.join(s)}"] for t, s in d["context"]], "more": []} for d in data]
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: not in HotpotQA format ({e}); "
                        f"expected [{{'question', 'answer', 'context'}}]") from None
    if not qas:
        raise UserError(f"{path}: no questions found")
    return qas, docs


class QaDraft(Draft):
    def __init__(self, rng: random.Random, qas: list[dict], docs: list[str]):
        qa = qas[rng.randrange(len(qas))]
        self.query = qa["query"]
        self.outputs = list(qa["outputs"])
        self.answer_prefix = _PREFIX
        self.docs = docs
        self.gold = list(qa["gold"])
        more = [d for d in qa["more"] if d not in self.gold]
        taken = set(self.gold) | set(more)
        rest = [i for i in range(len(docs)) if i not in taken]
        rng.shuffle(more)
        rng.shuffle(rest)
        self.candidates = more + rest  # distractors in the order they are added
        keys = [rng.random() for _ in range(len(self.gold) + len(self.candidates))]
        self.sort_key = dict(zip(self.gold + self.candidates, keys))
        self.n_min, self.n_max = 0, len(self.candidates)
        self.meta = {"query": self.query}

    def render(self, n: int, fill: int) -> str:
        chosen = sorted(self.gold + self.candidates[:n], key=self.sort_key.__getitem__)
        texts = [self.docs[i] for i in chosen]
        if fill and n < len(self.candidates):  # filler: the start of the next distractor
            texts.append(" ".join(self.docs[self.candidates[n]].split(" ")[:fill]))
        context = "\n\n".join(_DOC.format(i=i + 1, doc=d) for i, d in enumerate(texts))
        return _TEMPLATE.format(context=context, query=self.query)

    def fill_max(self, n: int) -> int:
        if n >= len(self.candidates):
            return 0
        return len(self.docs[self.candidates[n]].split(" ")) - 1


class QaTask(Task):
    family = "qa"
    metric = "string_match_part"
    ruler_max_new_tokens = 32

    def __init__(self, name: str, dataset: str):
        self.name, self.dataset = name, dataset
        self.description = f"question answering over {dataset} paragraphs with distractors"

    def _path(self, options: TaskOptions) -> Optional[str]:
        return options.squad_path if self.dataset == "squad" else options.hotpotqa_path

    def unavailable_reason(self, options: TaskOptions) -> Optional[str]:
        path = self._path(options)
        flag = "--squad" if self.dataset == "squad" else "--hotpotqa"
        if path is None:
            return f"{self.name} skipped: no {self.dataset} file given (pass {flag} PATH to a local copy)"
        if not Path(path).is_file():
            return f"{self.name} skipped: {self.dataset} file {path} not found"
        return None

    def compact_max_new_tokens(self, tokenizer, options: TaskOptions) -> int:
        return self.ruler_max_new_tokens

    def prepare(self, tokenizer, target_length: int, options: TaskOptions, seed: int):
        path = self._path(options)
        return load_squad(str(path)) if self.dataset == "squad" else load_hotpotqa(str(path))

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> QaDraft:
        qas, docs = shared if shared is not None else self.prepare(None, target_length, options, 0)
        return QaDraft(rng, qas, docs)
