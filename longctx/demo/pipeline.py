"""`longctx demo` end to end: train short -> evaluate -> extend (cp=2, ZeRO-3) -> re-evaluate
-> extend again training only an adapter (LoRA + embeddings and norms) -> evaluate it -> report;
with `ablation`, also (b) scaling only and (d) the same continued pretraining with plain RoPE.

Run directory (self-contained):
    demo.json                 what was run (demo, seed, argv), written first
    configs/*.yaml            the training configs of each job
    base/  extend/  extend_adapter/  [extend_plain/]   training runs: metrics.jsonl, tb/, checkpoints/,
                              hf/ (extend_adapter/: the merged model, its PEFT adapter in adapter/), train.log
    [scaled/hf]               variant (b): base weights + YaRN, no training
    eval/{a_base,c_extended,e_adapter,[b_scaled,d_plain]}/   results.json, report.md, heatmap, curves
    report.md  summary.json  accuracy_vs_length.png
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path

from longctx.config.adapter import AdapterSection
from longctx.data import load_tokenizer
from longctx.demo import costs, evaluation, jobs, report
from longctx.demo.config import DemoConfig

MARKER = "demo.json"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def findings(demo: DemoConfig, tables: dict, noise: float = 5.0, runs: dict | None = None) -> list[str]:
    """Plain statements read off the tables (scores; `runs`: the cost rows, costs.run_cost). Two
    scores differ only by more than two standard errors of their difference (from the eval
    samples), or by more than `noise` points when the tables carry no standard errors."""
    L4 = demo.extend_len
    avg = {k: t["average"] for k, t in tables.items()}
    se = {k: t.get("average_se", {}) for k, t in tables.items()}
    out = []

    def pm(key: str, L: int) -> str:
        s = se[key].get(L)
        return f"{avg[key][L]:.0f}" if s is None else f"{avg[key][L]:.0f} ± {s:.0f}"

    def cmp(x: str, y: str, L: int) -> str:
        dx, dy = avg[x][L], avg[y][L]
        if dx is None or dy is None:
            return "n/a"
        d = dx - dy
        sx, sy = se[x].get(L), se[y].get(L)
        limit = noise if sx is None or sy is None else 2 * math.hypot(sx, sy)
        return "no measurable difference" if abs(d) <= limit else (f"+{d:.0f} points" if d > 0 else f"{d:.0f} points")

    a1 = avg["a"].get(demo.train_len)
    if a1 is not None and a1 < 50:
        out.append(f"The base model scores only {a1:.0f} at its own training length ({demo.train_len}): it has not "
                   "learned retrieval yet, so the comparisons below say little about context extension.")
    a4, c4 = avg["a"].get(L4), avg.get("c", {}).get(L4)
    if a4 is not None:
        out.append(f"Without extension the model scores {pm('a', L4)} at {demo.factor}x ({L4} tokens) "
                   f"vs {avg['a'][demo.train_len]:.0f} at its training length.")
    if c4 is not None:
        out.append(f"After YaRN x{demo.factor} + {demo.extend_steps} steps at {L4} tokens: "
                   f"{pm('c', L4)} at {demo.factor}x; at {demo.train_len} tokens {avg['c'][demo.train_len]:.0f} "
                   f"(base: {avg['a'][demo.train_len]:.0f}).")
        L8 = demo.lengths[-1]
        if L8 > L4:
            out.append(f"At {L8} tokens (beyond the extension length) (c) scores {avg['c'][L8]:.0f}.")
    if "e" in avg and "c" in avg and avg["e"].get(L4) is not None and runs and {"full", "adapter"} <= set(runs):
        full, lora = runs["full"], runs["adapter"]
        out.append(f"The adapter run (e) trains {lora['trained_parameters']:,} of {lora['model_parameters']:,} "
                   f"parameters ({100 * lora['trained_parameters'] / lora['model_parameters']:.1f}%) and scores "
                   f"{pm('e', L4)} at {demo.factor}x against the full run's {pm('c', L4)} "
                   f"({cmp('e', 'c', L4)}); rank 0's peak memory {lora['peak_memory_gb_per_rank']:.2f} against "
                   f"{full['peak_memory_gb_per_rank']:.2f} GiB, {lora['tokens_per_s']:,.0f} against "
                   f"{full['tokens_per_s']:,.0f} tokens/s.")
    if "b" in avg:
        per = ", ".join(f"{L}: {cmp('b', 'a', L)}" for L in demo.lengths)
        out.append(f"Scaling alone (b) vs no extension (a), per length: {per}.")
    if "d" in avg and "c" in avg:
        per = ", ".join(f"{L}: {cmp('c', 'd', L)}" for L in demo.lengths)
        out.append(f"YaRN + training (c) vs the same training with plain RoPE (d), per length: {per}. "
                   f"A difference counts only beyond two standard errors of the eval samples ({demo.samples} per "
                   "task and length); training seeds differ by more "
                   "(a rerun with the same seed reproduces every score).")
    return out


def run_demo(demo: DemoConfig, out: Path, *, seed: int = 0, ablation: bool = False, adapter: bool = True,
             argv: list | None = None) -> int:
    t_all = time.time()
    _fresh_run_dir(out, {"plan": demo.name, "seed": seed, "ablation": ablation, "adapter": adapter,
                         "argv": argv or [], "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    timings: dict = {}
    tables: dict = {}
    runs: dict = {}
    n_steps = 4 + (2 if adapter else 0) + (2 if ablation else 0)
    counter = iter(range(1, n_steps + 1))

    def step(text: str) -> tuple[int, float]:
        i = next(counter)
        _say(f"\n[{i}/{n_steps}] {text}")
        return i, time.time()

    tokenizer = load_tokenizer("byte")
    i, t = step(f"train a {demo.num_layers}-layer model (byte vocabulary) at {demo.train_len} tokens "
                f"(curriculum {' -> '.join(str(s.seq_len) for s in demo.base_stages)}), "
                f"{demo.base_nproc} data-parallel processes")
    cfg = jobs.write_config(jobs.base_config(demo, out / "base", seed, tokenizer), out / "configs" / "base.yaml")
    jobs.run_training(cfg, out / "base", nproc=demo.base_nproc, log_name="train.log")
    timings[f"{i} train base"] = time.time() - t

    i, t = step(f"evaluate the base model at {', '.join(map(str, demo.lengths))} tokens")
    tables["a"], params = _evaluate(demo, out / "base" / "hf", out / "eval" / "a_base", "(a) base")
    timings[f"{i} eval base"] = time.time() - t

    layout = f"torchrun {demo.nproc} processes, cp={demo.cp_size}, ZeRO-{demo.zero_stage}"
    i, t = step(f"extend: YaRN x{demo.factor} + {demo.extend_steps} steps at {demo.extend_len} tokens, {layout}")
    _extend(demo, out, "extend", seed, demo.scaled_rope(), tokenizer)
    extend_key = f"{i} extend (cp={demo.cp_size}, ZeRO-{demo.zero_stage})"
    timings[extend_key] = time.time() - t

    i, t = step("re-evaluate the extended model")
    tables["c"], _ = _evaluate(demo, out / "extend" / "hf", out / "eval" / "c_extended", "(c) extended")
    timings[f"{i} eval extended"] = time.time() - t
    runs["full"] = costs.run_cost("c", out / "extend", out / "base" / "hf", None, seed, timings[extend_key],
                                  tables["c"], demo.extend_len)
    _say("\nretrieval score before -> after extension (0-100):\n"
         + report.console_table(demo, tables["a"], tables["c"]))

    if adapter:
        i, t = step(f"extend with an adapter: the same job training only {report.adapter_summary(demo)}, "
                    f"the rest frozen ({layout})")
        _extend(demo, out, "extend_adapter", seed, demo.scaled_rope(), tokenizer, adapter=demo.adapter())
        adapter_key = f"{i} extend with adapter (cp={demo.cp_size}, ZeRO-{demo.zero_stage})"
        timings[adapter_key] = time.time() - t

        i, t = step("evaluate the adapter-extended model")
        tables["e"], _ = _evaluate(demo, out / "extend_adapter" / "hf", out / "eval" / "e_adapter", "(e) adapter")
        timings[f"{i} eval adapter"] = time.time() - t
        runs["adapter"] = costs.run_cost("e", out / "extend_adapter", out / "base" / "hf", demo.adapter(), seed,
                                         timings[adapter_key], tables["e"], demo.extend_len)
    timings["demo total"] = time.time() - t_all

    if ablation:
        t_abl = time.time()
        i, t = step(f"ablation (b): base weights + YaRN x{demo.factor}, no training")
        jobs.save_scaled_only(out / "base" / "hf", out / "scaled" / "hf", demo.scaled_rope(), demo.extend_len)
        tables["b"], _ = _evaluate(demo, out / "scaled" / "hf", out / "eval" / "b_scaled", "(b) scaled")
        timings[f"{i} ablation (b) eval"] = time.time() - t

        i, t = step(f"ablation (d): the same {demo.extend_steps} steps at {demo.extend_len} tokens with plain RoPE")
        _extend(demo, out, "extend_plain", seed, demo.base_rope(), tokenizer)
        tables["d"], _ = _evaluate(demo, out / "extend_plain" / "hf", out / "eval" / "d_plain", "(d) plain")
        timings[f"{i} ablation (d) train + eval"] = time.time() - t
        timings["ablation total"] = time.time() - t_abl
        timings["all"] = time.time() - t_all
    return _finish(demo, out, seed, tables, timings, params, runs, ablation)


def _fresh_run_dir(out: Path, record: dict) -> None:
    """An empty run directory holding only the marker (with what is run)."""
    jobs.check_out_dir(out, MARKER)
    if out.is_dir():
        shutil.rmtree(out)  # a previous demo run (it has the marker): start clean
    out.mkdir(parents=True)
    (out / MARKER).write_text(json.dumps(record, indent=1))


def _extend(demo: DemoConfig, out: Path, name: str, seed: int, rope: dict, tokenizer,
            adapter: AdapterSection | None = None) -> None:
    """Continued pretraining from the base model's export with `rope` (training only `adapter`
    when given), into out/name."""
    cfg = jobs.write_config(jobs.extend_config(demo, out / name, out / "base" / "hf", seed, rope, tokenizer,
                                               adapter=adapter),
                            out / "configs" / f"{name}.yaml")
    jobs.run_training(cfg, out / name, nproc=demo.nproc, log_name="train.log")


def _evaluate(demo: DemoConfig, model_dir: Path, out_dir: Path, label: str) -> tuple[dict, int]:
    """(score table, parameter count) of one variant."""
    res = evaluation.evaluate_model(model_dir, demo, out_dir, label=label)
    return evaluation.score_table(res["summary"], demo.lengths), res["parameters"]


def _finish(demo: DemoConfig, out: Path, seed: int, tables: dict, timings: dict, params: int, runs: dict,
            ablation: bool) -> int:
    facts = findings(demo, tables, runs=runs)
    path = report.write_report(out, demo, seed, tables, timings, {"parameters": params, "findings": facts,
                                                                  "runs": runs})
    _say("\n" + "\n".join(report.accuracy_table(demo, tables)))
    _say("\n" + "\n".join(report.cost_table(demo, runs)))
    _say("\n" + "\n".join(f"- {f}" for f in facts))
    _say(f"\ndemo wall time {timings['demo total']:.0f} s"
         + (f", ablation {timings['ablation total']:.0f} s" if ablation else "") + f"; report: {path}")
    return 0
