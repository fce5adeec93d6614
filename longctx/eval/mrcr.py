"""MRCR (OpenAI's multi-round co-reference set): find the i-th of several near-identical answers
in a long conversation and reproduce it after a random prefix.

    rows = load_rows("openai/mrcr")   # or a local .parquet / .jsonl / .json file or folder of them
    score = grade(response, row["answer"], row["random_string_to_prepend"])

A row has the set's columns: `prompt` (the conversation, a JSON list of {role, content}),
`answer`, `random_string_to_prepend`, `n_needles`, `desired_msg_index`, `total_messages`,
`n_chars`. The score is the set's own: 0 when the response does not start with the random
prefix, else difflib's SequenceMatcher ratio of the response and the answer, each without the
prefix. Rows are binned by their token count (the conversation as the model reads it plus the
answer, with the model's tokenizer) into the set's bins (4k-8k, ..., 512k-1M; a first bin below
4k for small models) and reported per bin and needle count.

In process the model's own chat template renders the conversation and greedy decoding with the
KV cache answers (runner.Engine: CP prefill under --cp); over --endpoint-mode chat the messages
go to the server's /chat/completions as they are.
"""
from __future__ import annotations

import json
from difflib import SequenceMatcher
from pathlib import Path
from typing import Callable, Optional, Sequence

from longctx.base.errors import UserError
from longctx.eval.paired import standard_error

COLUMNS = ("prompt", "answer", "random_string_to_prepend", "n_needles", "desired_msg_index", "total_messages",
           "n_chars")
BIN_EDGES = (0, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)  # tokens
SUFFIXES = (".parquet", ".jsonl", ".json")


def grade(response: str, answer: str, prefix: str) -> float:
    """The set's score in [0, 1]: the required prefix, then the sequence ratio without it."""
    if not response.startswith(prefix):
        return 0.0
    return float(SequenceMatcher(None, response[len(prefix):], answer[len(prefix):]
                                 if answer.startswith(prefix) else answer).ratio())


def bin_of(tokens: int) -> str:
    """"4k-8k" for 4096 <= tokens < 8192 (the last bin takes everything above it)."""
    for lo, hi in zip(BIN_EDGES, BIN_EDGES[1:]):
        if tokens < hi or hi == BIN_EDGES[-1]:
            return f"{_k(lo)}-{_k(hi)}"
    raise AssertionError(tokens)


def _k(n: int) -> str:
    return "0" if n == 0 else f"{n // 1024}k" if n < 1048576 else "1M"


def _files(source: str) -> list[Path]:
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
    if source.count("/") == 1 and not source.startswith((".", "/")):  # a Hub id
        from huggingface_hub import snapshot_download

        try:
            local = snapshot_download(source, repo_type="dataset", allow_patterns=[f"*{s}" for s in SUFFIXES])
        except Exception as e:  # the hub's errors are many; one line names the id
            raise UserError(f"eval.mrcr: cannot download the dataset {source} ({type(e).__name__}: {e})") from None
        return _files(local)
    raise UserError(f"eval.mrcr: {source} is neither a file, a folder nor a Hub dataset id (openai/mrcr)")


def _read(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data if isinstance(data, list) else [data]


def load_rows(source: str, limit: Optional[int] = None) -> list[dict]:
    """The set's rows from its files (sorted by name, in file order), each with its `index`; the
    first `limit` only. UserError naming a missing column."""
    rows = []
    for path in _files(source):
        for row in _read(path):
            missing = [c for c in COLUMNS if c not in row]
            if missing:
                raise UserError(f"eval.mrcr: {path} lacks the column(s) {', '.join(missing)} (MRCR's columns: "
                                f"{', '.join(COLUMNS)})")
            rows.append(dict(row, index=len(rows)))
    if not rows:
        raise UserError(f"eval.mrcr: {source} holds no rows (.parquet, .jsonl or .json files)")
    return rows[:limit] if limit else rows


def messages(row: dict) -> list[dict]:
    conversation = row["prompt"]
    return json.loads(conversation) if isinstance(conversation, str) else list(conversation)


def run_rows(rows: Sequence[dict], answer: Callable[[dict], tuple[str, int]], *, done: Sequence[dict] = (),
             on_record: Optional[Callable[[dict], None]] = None, stop=None) -> tuple[list[dict], bool]:
    """(records, finished): each row answered by `answer(row)` -> (response, token count) and graded;
    rows whose index is in `done` are kept as they are. `stop` (agreed()) is asked after each row."""
    records = list(done)
    have = {r["index"] for r in done}
    for row in rows:
        if row["index"] in have:
            continue
        response, tokens = answer(row)
        rec = {"index": row["index"], "n_needles": int(row["n_needles"]), "tokens": tokens, "bin": bin_of(tokens),
               "score": grade(response, row["answer"], row["random_string_to_prepend"]), "response": response}
        records.append(rec)
        if on_record is not None:
            on_record(rec)
        if stop is not None and stop.agreed():
            return sorted(records, key=lambda r: r["index"]), False
    return sorted(records, key=lambda r: r["index"]), True


def summarize(records: Sequence[dict]) -> dict:
    """Mean score (0-100) and its s.e. overall, by bin, by needle count and by both."""
    def stat(scores):
        return {"score": 100 * sum(scores) / len(scores), "se": 100 * standard_error([scores]), "n": len(scores)}

    groups: dict = {}
    for r in records:
        for key in (("all",), ("bin", r["bin"]), ("needles", r["n_needles"]), ("cell", r["bin"], r["n_needles"])):
            groups.setdefault(key, []).append(r["score"])
    return {"all": stat(groups[("all",)]) if records else None,
            "by_bin": {k[1]: stat(v) for k, v in groups.items() if k[0] == "bin"},
            "by_needles": {str(k[1]): stat(v) for k, v in groups.items() if k[0] == "needles"},
            "by_bin_and_needles": {f"{k[1]}/{k[2]}": stat(v) for k, v in groups.items() if k[0] == "cell"}}


def render(summary: dict) -> str:
    """report.md's MRCR section: a bin x needle-count table of mean scores."""
    bins = sorted(summary["by_bin"], key=lambda b: BIN_EDGES.index(_edge(b)))
    needles = sorted(summary["by_needles"], key=int)
    lines = ["## MRCR", "", f"score (0-100, the set's prefix + sequence ratio): {summary['all']['score']:.1f} ± "
             f"{summary['all']['se']:.1f} over {summary['all']['n']} samples", "",
             "| tokens | " + " | ".join(f"{n} needles" for n in needles) + " | all |",
             "|---|" + "---:|" * (len(needles) + 1)]
    for b in bins:
        cells = [summary["by_bin_and_needles"].get(f"{b}/{n}") for n in needles]
        row = [f"{c['score']:.1f} (n={c['n']})" if c else "-" for c in cells]
        lines.append(f"| {b} | " + " | ".join(row) + f" | {summary['by_bin'][b]['score']:.1f} |")
    return "\n".join(lines) + "\n"


def _edge(name: str) -> int:
    return _tokens(name.split("-")[0])


def bin_end(name: str) -> int:
    """"4k-8k" -> 8192 (a bin's upper end in tokens)."""
    return _tokens(name.split("-")[1])


def _tokens(text: str) -> int:
    return 0 if text == "0" else 1048576 if text == "1M" else int(text[:-1]) * 1024
