"""The demo's own report: before/after tables per length, the ablation table, what each
extension run cost (full against adapter), timings, a before/after figure, summary.json and
report.md in the run directory."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, Optional

from longctx.demo.config import EVAL_TASKS, DemoConfig
from longctx.demo.training_curves import training_section
from longctx.eval.plots import pyplot, save_png
from longctx.eval.report import write_markdown
from longctx.storage import atomic

# variant key -> (label, what it is)
VARIANTS = {
    "a": ("(a) no extension", "the base model as trained at {L} tokens, plain RoPE"),
    "b": ("(b) scaling only", "the base weights with YaRN x{F} switched on, no training"),
    "c": ("(c) scaling + continued pretraining", "YaRN x{F} + {S} steps at {XL} tokens (cp=2, ZeRO-3)"),
    "d": ("(d) continued pretraining, plain RoPE", "the same {S} steps at {XL} tokens, RoPE unchanged"),
    "e": ("(e) scaling + adapter", "YaRN x{F} + the same {S} steps at {XL} tokens training only {A}"),
}


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def _len_header(demo: DemoConfig) -> str:
    return " | ".join(f"{L} ({m}x)" for L, m in zip(demo.lengths, demo.multipliers))


def describe(demo: DemoConfig, key: str) -> tuple[str, str]:
    label, what = VARIANTS[key]
    return label, what.format(L=demo.train_len, F=demo.factor, S=demo.extend_steps, XL=demo.extend_len,
                              A=adapter_summary(demo))


def adapter_summary(demo: DemoConfig) -> str:
    """What the adapter run trains, in words."""
    also = f" + {', '.join(demo.adapter_trainable)}" if demo.adapter_trainable else ""
    return f"LoRA r{demo.adapter_r} (alpha {demo.adapter_alpha:g}) on {', '.join(demo.adapter_targets)}{also}"


def cost_table(demo: DemoConfig, runs: dict) -> list[str]:
    """One row per extension run (costs.run_cost): what it trained, its retrieval at the
    extension length, and what it cost in memory and time."""
    XL = demo.extend_len
    lines = [f"| run | trained parameters | retrieval at {demo.factor}x ({XL}) | peak memory per rank (GiB) "
             "| wall time (s) | tokens/s |", "|---|---:|---:|---:|---:|---:|"]
    for run in runs.values():
        share = 100 * run["trained_parameters"] / run["model_parameters"]
        lines.append(f"| {describe(demo, run['variant'])[0]} | {run['trained_parameters']:,} ({share:.1f}%) | "
                     f"{_fmt_se(run['retrieval_at_extend_len'], run['retrieval_at_extend_len_stderr'])} | "
                     f"{run['peak_memory_gb_per_rank']:.2f} | {run['wall_seconds']:.0f} | "
                     f"{run['tokens_per_s']:,.0f} |")
    return lines


COST_NOTE = ("Both runs are the same job ({S} steps at {XL} tokens, {N} processes, cp={CP}, ZeRO-{Z}, the same "
             "data, learning rate and validations); the adapter run trains only {A}, every other weight frozen (no "
             "gradients, no optimizer state). Trained parameters: of the model's, the LoRA factors included (as the "
             "trainer counts). Peak memory: rank 0's, the largest over the steps (the ranks hold equal shards); on a "
             "CPU the process's peak RSS, the Python, torch and DeepSpeed runtime included (in the adapter run PEFT "
             "and what it imports too), on a GPU the CUDA peak allocation. Wall time: the training job from launch "
             "to its export (start-up, validations, checkpoints included). Tokens/s: row positions per second of "
             "step time, the first step (warm-up) left out.")


def _fmt_se(x: Optional[float], se: Optional[float]) -> str:
    return _fmt(x) if se is None or x is None else f"{_fmt(x)} ± {se:.1f}"


def accuracy_table(demo: DemoConfig, tables: dict) -> list[str]:
    """Average over tasks per length (± its standard error), one row per variant."""
    lines = ["| variant | " + _len_header(demo) + " |", "|---|" + "---:|" * len(demo.lengths)]
    for key in sorted(tables):
        label, _ = describe(demo, key)
        t = tables[key]
        se = t.get("average_se", {})
        lines.append(f"| {label} | " + " | ".join(_fmt_se(t["average"][L], se.get(L)) for L in demo.lengths) + " |")
    return lines


def before_after_table(demo: DemoConfig, before: dict, after: dict) -> list[str]:
    """Per length: each task before -> after."""
    lines = ["| length | " + " | ".join(EVAL_TASKS) + " | **average** |", "|---|" + "---:|" * (len(EVAL_TASKS) + 1)]
    for L, m in zip(demo.lengths, demo.multipliers):
        cells = []
        for task in list(EVAL_TASKS) + ["average"]:
            b, a = before[task][L], after[task][L]
            cells.append("n/a" if b is None and a is None else f"{_fmt(b)} → {_fmt(a)}")
        lines.append(f"| {L} ({m}x) | " + " | ".join(cells) + " |")
    return lines


def console_table(demo: DemoConfig, before: dict, after: dict) -> str:
    """Plain-text before/after table for the terminal."""
    names = list(EVAL_TASKS) + ["average"]
    w = max(len(n) for n in names) + 2
    head = f"{'task':<{w}}" + "".join(f"{f'{L} ({m}x)':>16}" for L, m in zip(demo.lengths, demo.multipliers))
    rows = [head, "-" * len(head)]
    for task in names:
        cells = []
        for L in demo.lengths:
            b, a = before[task][L], after[task][L]
            cells.append(f"{'n/a' if b is None and a is None else _fmt(b) + ' -> ' + _fmt(a):>16}")
        rows.append(f"{task:<{w}}" + "".join(cells))
    return "\n".join(rows)


def _legend(demo: DemoConfig, key: str, runs: dict) -> str:
    """A variant's legend entry; an extension run's with its cost (trained share, memory, time)."""
    label = describe(demo, key)[0]
    run = next((r for r in runs.values() if r["variant"] == key), None)
    if run is None:
        return label
    share = 100 * run["trained_parameters"] / run["model_parameters"]
    return (f"{label}: {share:.1f}% trained, {run['peak_memory_gb_per_rank']:.2f} GiB/rank, "
            f"{run['wall_seconds']:.0f} s, {run['tokens_per_s']:,.0f} tok/s")


def plot_variants(demo: DemoConfig, tables: dict, path: Path, runs: Optional[dict] = None) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"a": "o-", "b": "s--", "c": "o-", "d": "^--", "e": "d-."}
    for key in sorted(tables):
        ys = [tables[key]["average"][L] for L in demo.lengths]
        ax.plot(demo.lengths, [float("nan") if y is None else y for y in ys], styles[key],
                label=_legend(demo, key, runs or {}))
    ax.axvline(demo.train_len, color="grey", lw=0.8, ls=":", label=f"base training length {demo.train_len}")
    ax.axvline(demo.extend_len, color="red", lw=0.8, ls=":", label=f"extension length {demo.extend_len}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(demo.lengths, [str(L) for L in demo.lengths])
    ax.set_ylim(-3, 103)
    ax.set_xlabel("context length (byte tokens)")
    ax.set_ylabel("retrieval accuracy (avg over tasks)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path)


def write_report(out: Path, demo: DemoConfig, seed: int, tables: dict, timings: dict, extra: dict) -> Path:
    """report.md + summary.json + accuracy_vs_length.png in the run directory."""
    fig = plot_variants(demo, tables, out / "accuracy_vs_length.png", extra.get("runs"))
    summary = {"plan": demo.name, "seed": seed, "lengths": demo.lengths, "multipliers": list(demo.multipliers),
               "train_len": demo.train_len, "extend_len": demo.extend_len,
               "scaled_rope": demo.scaled_rope(), "variants": {}, "timings_s": timings, **extra}
    for key, t in tables.items():
        label, what = describe(demo, key)
        summary["variants"][key] = {
            "label": label, "description": what,
            "scores": {task: {str(L): v for L, v in row.items()} for task, row in t.items() if task != "average_se"},
            "average_stderr": {str(L): v for L, v in t.get("average_se", {}).items()}}
    atomic.write_result(out / "summary.json", json.dumps(summary, indent=1))

    rope = demo.scaled_rope()
    L, XL = demo.train_len, demo.extend_len
    lines = [f"# longctx demo: context extension {L} → {XL} tokens", "",
             f"- plan: `{demo.name}`"
             f"{' (CI smoke run: budgets far too small for meaningful accuracy)' if demo.name == 'fast' else ''}; "
             f"training seed {seed}; eval seed {demo.eval_seed} "
             f"({demo.samples} samples per task and length; "
             f"{HEATMAP_NOTE.format(n=demo.heatmap_samples, d=len(demo.heatmap_depths))})",
             f"- model: {extra.get('parameters', '?'):,} parameters ({demo.num_layers} layers, d{demo.hidden_size}, "
             f"{demo.num_heads} heads x {demo.head_dim}, byte vocabulary), {demo.dtype}, "
             f"RoPE theta {demo.rope_theta:g}",
             f"- base training: {' → '.join(str(s.seq_len) for s in demo.base_stages)} tokens "
             f"({' + '.join(str(s.steps) for s in demo.base_stages)} steps), "
             f"answer tokens weighted x{demo.answer_loss_weight:g}",
             f"- corpora (synthetic task mix): {corpus_mixes(demo)}",
             f"- extension: `{json.dumps(rope)}`, max_position_embeddings {XL}; {demo.extend_steps} steps at "
             f"{XL} tokens on {demo.nproc} processes, cp={demo.cp_size}, ZeRO-{demo.zero_stage}"
             + (f"; (e) the same job training only {adapter_summary(demo)}" if "e" in tables else ""), "",
             "## Retrieval accuracy (average over tasks, 0-100)", ""]
    lines += accuracy_table(demo, tables)
    lines += ["",
              "Variants: " + "; ".join(f"{describe(demo, k)[0]}: {describe(demo, k)[1]}" for k in sorted(tables)) + ".",
              f"At {L} tokens the average is over "
              f"{len(EVAL_TASKS) - sum(1 for t in EVAL_TASKS if tables['a'][t][L] is None)} tasks "
              "(compact niah_multivalue needs ~389 tokens). ± is one standard error of the average over the "
              f"eval's samples ({demo.samples} per task and length): the test set's sampling noise alone; "
              "a different training seed moves the scores by more.", ""]
    if "c" in tables:
        lines += ["## Before → after extension, per task and length", ""]
        lines += before_after_table(demo, tables["a"], tables["c"])
        lines.append("")
    runs = extra.get("runs") or {}
    if runs:
        lines += ["## What each extension cost", ""] + cost_table(demo, runs) + [""]
        if "adapter" in runs:
            lines += [COST_NOTE.format(S=demo.extend_steps, XL=XL, N=demo.nproc, CP=demo.cp_size, Z=demo.zero_stage,
                                       A=adapter_summary(demo)), ""]
    if extra.get("findings"):
        lines += ["## What the numbers show", ""] + [f"- {f}" for f in extra["findings"]] + [""]
    lines += training_section(out / "extend", "extend", L)
    lines += ["## Wall time", "", "| step | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in timings.items()]
    lines += ["", "## Files", "",
              "- `configs/*.yaml`: the training configs (re-run one with `longctx train --config ...`; "
              "the extension under `torchrun --nproc_per_node 2 -m longctx train --config ...`)",
              "- `base/`, `extend/`" + (", `extend_adapter/`" if "e" in tables else "")
              + (", `extend_plain/`" if "d" in tables else "") +
              ": training runs (resolved_config.yaml, metrics.jsonl, tb/, checkpoints/, hf/, train.log; "
              "`extend/`: validation.jsonl, validation.png, probe.png"
              + ("; `extend_adapter/hf`: the merged model, `extend_adapter/adapter`: its PEFT adapter" if "e" in tables
                 else "") + ")",
              "- `eval/<variant>/`: results.json (every sample), report.md, heatmap_niah_single_1.png, "
              "scores_vs_length.png",
              f"- `{fig.name}`, `summary.json`", "",
              f"![accuracy vs length]({fig.name})", "",
              "![before](eval/a_base/heatmap_niah_single_1.png) "
              "![after](eval/c_extended/heatmap_niah_single_1.png)", ""]
    return write_markdown(out / "report.md", "\n".join(lines))


def _mix(tasks: Dict[str, float], recall_multivalue: float, line_breaks: float = 0.0) -> str:
    parts = [f"{t} {w:g}" for t, w in tasks.items()]
    if recall_multivalue and "recall" in tasks:
        parts.append(f"{recall_multivalue:.0%} of recall keys multi-valued")
    if line_breaks and any(t != "recall" for t in tasks):
        parts.append(f"{line_breaks:.0%} of the other documents with each needle on its own line")
    return ", ".join(parts)


def corpus_mixes(demo: DemoConfig) -> str:
    stages = [f"{s.seq_len}: {_mix(s.tasks, demo.recall_multivalue, demo.line_breaks)}"
              for s in demo.base_stages if s.tasks]
    return (f"base {_mix(demo.tasks, demo.recall_multivalue, demo.line_breaks)}"
            + (f" ({'; '.join(stages)})" if stages else "") +
            f"; extension {_mix(demo.extend_tasks, demo.extend_recall_multivalue, demo.extend_line_breaks)}")


HEATMAP_NOTE = "niah_single_1: {n} per depth x {d} depths"
