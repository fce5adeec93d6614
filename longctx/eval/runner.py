"""Run tasks through a model: batched greedy decoding with the KV cache, optionally with the
prompt prefill split across a context-parallel group, data-parallel over samples.

    engine = Engine(model, tokenizer)                     # one process
    engine = Engine(model, tokenizer, cp_group=g)         # under torchrun, cp ranks in g
    records = run_samples(engine, samples)                # predictions + scores per sample
    done = run_cell(engine, cell_samples, stop=flag)      # one (task, length) cell, stoppable
    Engine(model, tokenizer, mode="teacher_forced")       # score prompt + reference in one forward

Ranks are arranged dp x cp (cp innermost, as longctx.parallel.mesh does). run_samples: dp
groups take interleaved shares of the samples and every rank gets all records. run_cell: the
cell's batches are fixed by the cell alone (sorted by prompt length, cut by the batch size),
dp group g takes batches g, g + dp, ...; after each round of dp batches every rank agrees
whether to stop, so a stopped cell's finished samples are whole batches, the same ones an
uninterrupted run computes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from longctx.data.tokenizer import prepends_bos
from longctx.eval.scoring import score_sample
from longctx.eval.sequence_rope import row_lengths
from longctx.eval.tasks import Sample
from longctx.eval.teacher_forced import forced_row, score_batch
from longctx.model.generate import RowStopped, generate
from longctx.parallel.cp_decode import cp_generate
from longctx.reporting.progress import Progress


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


@dataclass
class Engine:
    """A model + tokenizer that turns prompts into greedy continuations."""

    model: torch.nn.Module
    tokenizer: object
    cp_group: Optional[object] = None  # a process group of size > 1 enables CP prefill
    cp_impl: str = "ring"
    max_batch_tokens: int = 16384  # batch size = max(1, max_batch_tokens // prompt length)
    batch_size: Optional[int] = None  # fixed batch size (overrides max_batch_tokens)
    add_bos: bool = True
    stop_ids: Optional[Sequence[int]] = None  # every id that ends a row (None: the tokenizer's EOS)
    mode: str = "generate"  # or "teacher_forced" (eval/teacher_forced.py; one process per sample: no cp)
    stats: dict = field(default_factory=lambda: {"prompt_tokens": 0, "new_tokens": 0, "seconds": 0.0,
                                                 "peak_cache_bytes": 0})
    last_cache_bytes: int = 0  # this rank's KV cache of the last batch under cp

    @property
    def cp_size(self) -> int:
        return dist.get_world_size(self.cp_group) if self.cp_group is not None else 1

    def encode(self, text: str) -> list[int]:
        add_bos = self.add_bos and prepends_bos(self.tokenizer)
        return self.tokenizer.encode(text, add_bos=add_bos)

    def batch_for(self, length: int) -> int:
        if self.batch_size:
            return self.batch_size
        return max(1, self.max_batch_tokens // max(length, 1))

    @torch.no_grad()
    def generate_ids(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                     stopped: RowStopped = None) -> list[list[int]]:
        """Each prompt's greedy new tokens, cut before a stop id; `stopped`: a row's tokens so far
        -> done (model/generate.greedy_decode)."""
        eos = frozenset(self.stop_ids) if self.stop_ids is not None else getattr(self.tokenizer, "eos_id", None)
        pad = getattr(self.tokenizer, "pad_id", None)
        pad = 0 if pad is None else pad
        t0 = time.perf_counter()
        with row_lengths(self.model, [len(p) for p in prompts]):  # per-sequence dynamic / longrope RoPE
            if self.cp_size > 1:
                out, st = cp_generate(self.model, prompts, max_new_tokens, group=self.cp_group, impl=self.cp_impl,
                                      eos_id=eos, pad_id=pad, stopped=stopped)
                self.stats["peak_cache_bytes"] = max(self.stats["peak_cache_bytes"], st["cache_bytes"])
                self.last_cache_bytes = st["cache_bytes"]
            else:
                out = generate(self.model, prompts, max_new_tokens, eos_id=eos, pad_id=pad, stopped=stopped)
        self.stats["seconds"] += time.perf_counter() - t0
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["new_tokens"] += sum(len(o) for o in out)
        return out

    @torch.no_grad()
    def teacher_forced(self, samples: Sequence[Sample]) -> tuple[list[str], list[list[int]], list[dict]]:
        """(the argmax answers as text, their ids, the scores) of one forward of prompt + reference;
        a score is {"score": 0..100, "answer_tokens": n, "answer_tokens_right": k}."""
        rows = [forced_row(s, self.encode, lambda text: self.tokenizer.encode(text, add_bos=False)) for s in samples]
        pad = getattr(self.tokenizer, "pad_id", None)
        t0 = time.perf_counter()
        with row_lengths(self.model, [len(r.input_ids) for r in rows]):
            scored = score_batch(self.model, rows, 0 if pad is None else pad)
        self.stats["seconds"] += time.perf_counter() - t0
        self.stats["prompt_tokens"] += sum(len(r.input_ids) for r in rows)
        ids = [argmax for _, argmax, _ in scored]
        scores = [{"score": score, "answer_tokens": len(argmax), "answer_tokens_right": right}
                  for score, argmax, right in scored]
        return [self.tokenizer.decode(i) for i in ids], ids, scores

    def complete(self, samples: Sequence[Sample]) -> list[str]:
        """Greedy continuations (text, cut at the first stop string) of same-budget samples."""
        return self.complete_with_ids(samples)[0]

    def complete_with_ids(self, samples: Sequence[Sample]) -> tuple[list[str], list[list[int]]]:
        """(texts cut at the first stop string, raw generated token ids)."""
        budgets = {s.max_new_tokens for s in samples}
        assert len(budgets) == 1, "complete() takes samples that share one generation budget"
        ids = [self.encode(s.prompt) for s in samples]
        out = self.generate_ids(ids, budgets.pop())
        return [cut_at_stops(self.tokenizer.decode(o), s.stop) for s, o in zip(samples, out)], out


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """A continuation cut at its first stop string; a stop string right at the start is skipped
    (answers often follow a newline). The endpoint backend cuts the server's text the same way."""
    for stop in stops:
        cut = text.find(stop)
        if cut == 0 and text.strip():
            cut = text.find(stop, len(text) - len(text.lstrip()))
        if cut > 0:
            text = text[:cut]
    return text


def dp_layout(cp_size: int) -> tuple[int, int]:
    """(dp_size, dp_rank) of this process (1, 0 without torch.distributed)."""
    if not _is_dist():
        return 1, 0
    world, rank = dist.get_world_size(), dist.get_rank()
    return world // cp_size, rank // cp_size


def run_samples(engine: Engine, samples: Sequence[Sample], *, progress: bool = True, desc: str = "eval",
                predictor: Optional[Callable[[Sample], str]] = None) -> list[dict]:
    """Predict and score every sample; returns per-sample records (on every rank: gathered).

    `predictor` replaces the model (an oracle or a baseline for checks) when given.
    """
    if engine.mode != "generate":
        raise ValueError(f"run_samples generates; mode {engine.mode!r} runs through run_cell")
    dp_size, dp_rank = dp_layout(engine.cp_size)
    mine = [s for i, s in enumerate(samples) if i % dp_size == dp_rank]
    is_main = not _is_dist() or dist.get_rank() == 0
    bar = Progress(len(samples), desc, "sample", enabled=progress and is_main)
    records = []
    groups: dict = {}
    for s in mine:
        groups.setdefault((s.max_new_tokens, s.target_length), []).append(s)
    for (_, length), group in sorted(groups.items(), key=lambda kv: kv[0][1]):
        group = sorted(group, key=lambda s: s.prompt_tokens)
        bs = engine.batch_for(length)
        for i in range(0, len(group), bs):
            batch = group[i:i + bs]
            if predictor:
                preds, ids = [predictor(s) for s in batch], [None] * len(batch)
            else:
                preds, ids = engine.complete_with_ids(batch)
            for s, p, g in zip(batch, preds, ids):
                records.append(sample_record(s, p, g))
            # rank 0 counts for all dp groups (they move at the same pace)
            bar.update(min(len(batch) * dp_size, bar.total - bar.n))
    bar.update(bar.total - bar.n)
    bar.close()
    if _is_dist() and dp_size > 1:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, records)
        seen, records = set(), []
        for part in gathered:  # cp ranks of one dp group hold identical records
            for r in part:
                key = (r["task"], r["target_length"], r["index"])
                if key not in seen:
                    seen.add(key)
                    records.append(r)
    records.sort(key=lambda r: (r["task"], r["target_length"], r["index"]))
    return records


def cell_batches(samples: Sequence[Sample], batch_size: int) -> list[list[Sample]]:
    """A cell's batches: its samples sorted by prompt length (then index), cut every batch_size."""
    ordered = sorted(samples, key=lambda s: (s.prompt_tokens, s.index))
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


@dataclass
class CellRun:
    records: list  # the finished samples' records, by index (on every rank)
    stats: dict  # prompt_tokens, new_tokens, peak_cache_bytes (deterministic) and seconds
    finished: bool  # every sample given was run
    stop: bool  # the ranks agreed to stop (a preemption signal)


def run_cell(engine: Engine, samples: Sequence[Sample], *, stop=None, bar: Optional[Progress] = None,
             predictor: Optional[Callable[[Sample], str]] = None) -> CellRun:
    """Predict and score the samples of one (task, length) cell (or what is left of one).

    `stop`: an object whose collective agreed() says whether to stop (PreemptionFlag); it is
    asked after every round of dp batches, so all ranks stop after the same batch."""
    dp_size, dp_rank = dp_layout(engine.cp_size)
    batches = cell_batches(samples, engine.batch_for(samples[0].target_length)) if samples else []
    records: list = []
    stats = {"prompt_tokens": 0, "new_tokens": 0, "peak_cache_bytes": 0, "seconds": 0.0}
    stopped, done = False, 0
    for r in range(0, len(batches), dp_size):
        round_ = batches[r:r + dp_size]
        if dp_rank < len(round_):
            batch = round_[dp_rank]
            before = dict(engine.stats)
            engine.last_cache_bytes = 0
            scores = [None] * len(batch)  # None: scored from the prediction text (generation)
            if predictor:
                preds, ids = [predictor(s) for s in batch], [None] * len(batch)
            elif engine.mode == "teacher_forced":
                preds, ids, scores = engine.teacher_forced(batch)
            else:
                preds, ids = engine.complete_with_ids(batch)
            for key in ("prompt_tokens", "new_tokens", "seconds"):
                stats[key] += engine.stats[key] - before[key]
            stats["peak_cache_bytes"] = max(stats["peak_cache_bytes"], engine.last_cache_bytes)
            records += [sample_record(s, p, g, sc) for s, p, g, sc in zip(batch, preds, ids, scores)]
        done = r + len(round_)
        if bar is not None:
            bar.update(sum(len(b) for b in round_))
        if stop is not None and stop.agreed():
            stopped = True
            break
    records, stats = _gather_cell(records, stats, engine.cp_size)
    return CellRun(sorted(records, key=lambda x: x["index"]), stats, done == len(batches), stopped)


def _gather_cell(records: list, stats: dict, cp_size: int) -> tuple[list, dict]:
    """Every rank's records of the cell, once each; counts from one rank per dp group (its cp
    ranks ran the same batches), the peak cache over all ranks, the slowest group's seconds."""
    if not _is_dist() or dist.get_world_size() == 1:
        return records, stats
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (records, stats))
    seen, out = set(), []
    total = {"prompt_tokens": 0, "new_tokens": 0, "peak_cache_bytes": 0, "seconds": 0.0}
    for rank, (recs, st) in enumerate(parts):
        for rec in recs:
            if rec["index"] not in seen:
                seen.add(rec["index"])
                out.append(rec)
        if rank % cp_size == 0:
            total["prompt_tokens"] += st["prompt_tokens"]
            total["new_tokens"] += st["new_tokens"]
        total["peak_cache_bytes"] = max(total["peak_cache_bytes"], st["peak_cache_bytes"])
        total["seconds"] = max(total["seconds"], st["seconds"])
    return out, total


def sample_record(s: Sample, pred: str, generated_ids: Optional[list] = None, forced: Optional[dict] = None) -> dict:
    """forced: teacher_forced's score and answer token counts (None: the prediction text is scored)."""
    return {
        "generated_ids": generated_ids,
        "task": s.task, "target_length": s.target_length, "index": s.index, "depth": s.depth,
        "prompt_tokens": s.prompt_tokens, "max_new_tokens": s.max_new_tokens, "metric": s.metric,
        "outputs": s.outputs, "prediction": pred,
        "score": score_sample(s.metric, pred, s.outputs) if forced is None else forced["score"],
        "answer_prefix": s.answer_prefix, "meta": s.meta,
        **({k: v for k, v in forced.items() if k != "score"} if forced else {}),
    }
