"""Data pipeline throughput on CPU.

    .venv/bin/python benchmarks/bench_data.py [--mb 8] [--seq-len 4096] [--vocab 8000]

Measures, on a generated local jsonl corpus (varied English-like sentences):
  * tokenize + pack MB/s (text bytes in / second) through the real loader (🤗 datasets
    source, windows, packing with document boundaries, batches as LongTensors), with the
    byte tokenizer and with a 🤗 fast BPE tokenizer trained here (no network), each next to
    the same tokenizer's bare `encode_batch` over the same texts (the baseline: the ratio is
    what reading, packing and batching cost on top of tokenization);
  * the same through streaming mode;
  * time to first batch: cold (no cache), building the cache, and with a warm cache.
Prints a markdown table (docs/data.md quotes it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from longctx.data import DataConfig, SourceConfig, build_loader, load_tokenizer  # noqa: E402
from longctx.data.filler import varied_sentence  # noqa: E402


def make_corpus(path: str, mb: float, seed: int = 0) -> list:
    rng = random.Random(seed)
    texts, size = [], 0
    while size < mb * 1e6:
        n = int(rng.lognormvariate(4.5, 1.2)) + 1  # sentences: median ~90, long tail
        t = " ".join(varied_sentence(rng) for _ in range(min(n, 4000)))
        texts.append(t)
        size += len(t.encode())
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return texts


def train_bpe(texts, vocab: int, directory: str) -> float:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t0 = time.perf_counter()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts[: max(1, len(texts) // 4)], trainer)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    return time.perf_counter() - t0


def drain(cfg, tok) -> tuple:
    t0 = time.perf_counter()
    loader = build_loader(cfg, tok, dp_rank=0, dp_size=1, seed=0)
    t_open = time.perf_counter() - t0
    tokens = rows = 0
    for b in loader:
        rows += b["input_ids"].shape[0]
        tokens += int((b["labels"] != -100).sum())
    return time.perf_counter() - t0, t_open, tokens, rows


def first_batch(cfg, tok) -> float:
    t0 = time.perf_counter()
    next(iter(build_loader(cfg, tok, dp_rank=0, dp_size=1, seed=0)))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=8.0, help="corpus size in MB")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = ap.parse_args()
    import datasets

    datasets.disable_progress_bars()
    work = args.dir or tempfile.mkdtemp(prefix="longctx-bench-data-")
    path = os.path.join(work, "corpus.jsonl")
    texts = make_corpus(path, args.mb)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    t_bpe = train_bpe(texts, args.vocab, os.path.join(work, "bpe"))
    got_vocab = load_tokenizer(os.path.join(work, "bpe")).vocab_size
    print(f"corpus: {len(texts)} documents, {mb:.1f} MB; "
          f"BPE (vocab {got_vocab} of {args.vocab} asked) trained in {t_bpe:.1f}s; "
          f"seq_len {args.seq_len}; {os.cpu_count()} CPUs", flush=True)
    base = dict(seq_len=args.seq_len, micro_batch_size=4, epochs=1, prefetch=0, progress=False,
                hf_cache_dir=os.path.join(work, "hf"))
    rows = []
    for name, spec in (("byte", "byte"), (f"BPE {got_vocab} (🤗 fast)", os.path.join(work, "bpe"))):
        tok = load_tokenizer(spec)
        t0 = time.perf_counter()
        for k in range(0, len(texts), 512):
            tok.encode_batch(texts[k : k + 512], add_bos=True, add_eos=True)
        t_tok = time.perf_counter() - t0
        drain(DataConfig(sources=[SourceConfig(path=path)], tokenizer=spec, **base), tok)  # warm 🤗's arrow cache
        t_all, t_open, ntok, nrows = drain(DataConfig(sources=[SourceConfig(path=path)], tokenizer=spec, **base), tok)
        t_str, _, ntok_s, _ = drain(DataConfig(sources=[SourceConfig(path=path)], tokenizer=spec, streaming=True,
                                               **base), tok)
        assert ntok_s == ntok
        rows.append((name, mb / t_tok, mb / t_all, (mb / t_all) / (mb / t_tok), mb / t_str, ntok / t_all / 1e6, nrows))
    print()
    print("| tokenizer | bare encode_batch MB/s | loader (tokenize+pack) MB/s | ratio | "
          "streaming MB/s | Mtokens/s | rows |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.2f} | {r[4]:.1f} | {r[5]:.2f} | {r[6]} |")

    tok = load_tokenizer("byte")
    cache_dir = os.path.join(work, "cache")
    cfg = DataConfig(sources=[SourceConfig(name="bench", path=path)], **{**base, "epochs": None, "prefetch": 2})
    t_cold = first_batch(cfg, tok)
    cfg_c = DataConfig(sources=[SourceConfig(name="bench", path=path)],
                       **{**base, "epochs": None, "prefetch": 2, "cache_dir": cache_dir})
    t_build = first_batch(cfg_c, tok)
    t_warm = min(first_batch(cfg_c, tok) for _ in range(3))
    print()
    print("| time to first batch (byte tokenizer) | seconds |")
    print("|---|---|")
    print(f"| no cache (opens the source, tokenizes one window) | {t_cold:.3f} |")
    print(f"| building the cache ({mb:.1f} MB, first run) | {t_build:.2f} |")
    print(f"| warm cache | {t_warm:.3f} |")


if __name__ == "__main__":
    main()
