"""Data pipeline throughput on CPU.

    .venv/bin/python benchmarks/bench_data.py [--mb 8] [--seq-len 4096] [--vocab 8000] [--repeats 5]

Measures, on a generated local jsonl corpus (varied English-like sentences):
  * tokenize + pack MB/s (text bytes in / second) through the real loader (🤗 datasets
    source, windows, packing with document boundaries, batches as LongTensors), with the
    byte tokenizer and with a 🤗 fast BPE tokenizer trained here (no network), each next to
    the same tokenizer's bare `encode_batch` over the same texts (the baseline: the ratio is
    what reading, packing and batching cost on top of tokenization);
  * the same through streaming mode;
  * time to first batch: cold (no cache), building the cache (a fresh cache directory each
    time), and with a warm cache.
Each table's contenders run interleaved (benchlib.timing): `--warmup` untimed runs each (default 1,
which also warms 🤗's arrow cache), then `--repeats` timed rounds; rates are at the median time. Prints
markdown tables (docs/data.md quotes them); `--json PATH` writes them with the timing fields.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from benchlib.report import markdown_table, timing_fields, write_json
from benchlib.timing import DEFAULT_STEPS, DEFAULT_WARMUP, interleaved

from longctx.data import DataConfig, SourceConfig, build_loader, load_tokenizer
from longctx.data.filler import varied_sentence


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


def drain(cfg, tok) -> tuple[int, int]:
    """Read the loader to its end: (label tokens, rows)."""
    tokens = rows = 0
    for b in build_loader(cfg, tok, dp_rank=0, dp_size=1, seed=0):
        rows += b["input_ids"].shape[0]
        tokens += int((b["labels"] != -100).sum())
    return tokens, rows


def first_batch(cfg, tok) -> None:
    next(iter(build_loader(cfg, tok, dp_rank=0, dp_size=1, seed=0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=8.0, help="corpus size in MB")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=DEFAULT_STEPS, help="timed runs per contender")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed runs per contender first")
    ap.add_argument("--json", help="also write the tables here")
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
    rows, report = [], {"mb": mb, "documents": len(texts), "throughput": [], "first_batch": []}
    for name, spec in (("byte", "byte"), (f"BPE {got_vocab} (🤗 fast)", os.path.join(work, "bpe"))):
        tok = load_tokenizer(spec)
        counts = {}

        def encode_all(tok=tok):
            for k in range(0, len(texts), 512):
                tok.encode_batch(texts[k : k + 512], add_bos=True, add_eos=True)

        def loader(streaming, spec=spec, tok=tok):
            def run():
                cfg = DataConfig(sources=[SourceConfig(path=path)], tokenizer=spec, streaming=streaming, **base)
                counts[streaming] = drain(cfg, tok)
            return run

        t = interleaved({"bare encode_batch": encode_all, "loader": loader(False), "streaming": loader(True)},
                        steps=args.repeats, warmup=args.warmup)
        assert counts[True][0] == counts[False][0]
        ntok, nrows = counts[False]
        enc, load, stream = (mb / t[k].median_s for k in ("bare encode_batch", "loader", "streaming"))
        rows.append([name, f"{enc:.1f}", f"{load:.1f}", f"{load / enc:.2f}", f"{stream:.1f}",
                     f"{ntok / t['loader'].median_s / 1e6:.2f}", nrows])
        report["throughput"].append({"tokenizer": name, "tokens": ntok, "rows": nrows,
                                     **{k: timing_fields(v) for k, v in t.items()}})
    print()
    print(markdown_table(["tokenizer", "bare encode_batch MB/s", "loader (tokenize+pack) MB/s", "ratio",
                          "streaming MB/s", "Mtokens/s", "rows"], rows))

    tok = load_tokenizer("byte")
    cache_dirs = iter(os.path.join(work, f"cache{i}") for i in range(10**9))

    def cfg(cache_dir=None):
        return DataConfig(sources=[SourceConfig(name="bench", path=path)],
                          **{**base, "epochs": None, "prefetch": 2, "cache_dir": cache_dir})

    warm_dir = os.path.join(work, "cache")
    first_batch(cfg(warm_dir), tok)  # builds the warm contender's cache
    cases = {"no cache (opens the source, tokenizes one window)": lambda: first_batch(cfg(), tok),
             f"building the cache ({mb:.1f} MB, a fresh directory)": lambda: first_batch(cfg(next(cache_dirs)), tok),
             "warm cache": lambda: first_batch(cfg(warm_dir), tok)}
    t = interleaved(cases, steps=args.repeats, warmup=args.warmup)
    print()
    print(markdown_table(["time to first batch (byte tokenizer)", "seconds (median)", "min"],
                         [[k, f"{v.median_s:.3f}", f"{v.min_s:.3f}"] for k, v in t.items()]))
    report["first_batch"] = [{"case": k, **timing_fields(v)} for k, v in t.items()]
    print(f"\n{args.warmup} warm-up + {args.repeats} timed runs per contender, interleaved")
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
