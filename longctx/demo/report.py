"""The demo's own report: before/after tables per length, the ablation table, timings,
a before/after figure, summary.json and report.md in the run directory."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from longctx.demo.plan import EVAL_TASKS, DemoPlan

# variant key -> (label, what it is)
VARIANTS = {
    "a": ("(a) no extension", "the base model as trained at {L} tokens, plain RoPE"),
    "b": ("(b) scaling only", "the base weights with YaRN x{F} switched on, no training"),
    "c": ("(c) scaling + continued pretraining", "YaRN x{F} + {S} steps at {XL} tokens (cp=2, ZeRO-3)"),
    "d": ("(d) continued pretraining, plain RoPE", "the same {S} steps at {XL} tokens, RoPE unchanged"),
}


def vocabulary(plan: DemoPlan) -> str:
    return f"BPE-{plan.tokenizer_vocab} vocabulary" if plan.tokenizer_vocab else "byte vocabulary"


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def _len_header(plan: DemoPlan) -> str:
    return " | ".join(f"{L} ({m}x)" for L, m in zip(plan.lengths, plan.multipliers))


def describe(plan: DemoPlan, key: str) -> tuple[str, str]:
    label, what = VARIANTS[key]
    return label, what.format(L=plan.train_len, F=plan.factor, S=plan.extend_steps, XL=plan.extend_len)


def _fmt_se(x: Optional[float], se: Optional[float]) -> str:
    return _fmt(x) if se is None or x is None else f"{_fmt(x)} ± {se:.1f}"


def accuracy_table(plan: DemoPlan, tables: dict) -> list[str]:
    """Average over tasks per length (± its standard error), one row per variant."""
    lines = ["| variant | " + _len_header(plan) + " |", "|---|" + "---:|" * len(plan.lengths)]
    for key in sorted(tables):
        label, _ = describe(plan, key)
        t = tables[key]
        se = t.get("average_se", {})
        lines.append(f"| {label} | " + " | ".join(_fmt_se(t["average"][L], se.get(L)) for L in plan.lengths) + " |")
    return lines


def before_after_table(plan: DemoPlan, before: dict, after: dict) -> list[str]:
    """Per length: each task before -> after."""
    lines = ["| length | " + " | ".join(EVAL_TASKS) + " | **average** |", "|---|" + "---:|" * (len(EVAL_TASKS) + 1)]
    for L, m in zip(plan.lengths, plan.multipliers):
        cells = []
        for task in list(EVAL_TASKS) + ["average"]:
            b, a = before[task][L], after[task][L]
            cells.append("n/a" if b is None and a is None else f"{_fmt(b)} → {_fmt(a)}")
        lines.append(f"| {L} ({m}x) | " + " | ".join(cells) + " |")
    return lines


def console_table(plan: DemoPlan, before: dict, after: dict) -> str:
    """Plain-text before/after table for the terminal."""
    names = list(EVAL_TASKS) + ["average"]
    w = max(len(n) for n in names) + 2
    head = f"{'task':<{w}}" + "".join(f"{f'{L} ({m}x)':>16}" for L, m in zip(plan.lengths, plan.multipliers))
    rows = [head, "-" * len(head)]
    for task in names:
        cells = []
        for L in plan.lengths:
            b, a = before[task][L], after[task][L]
            cells.append(f"{'n/a' if b is None and a is None else _fmt(b) + ' -> ' + _fmt(a):>16}")
        rows.append(f"{task:<{w}}" + "".join(cells))
    return "\n".join(rows)


def plot_variants(plan: DemoPlan, tables: dict, path: Path) -> Path:
    from longctx.eval.plots import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"a": "o-", "b": "s--", "c": "o-", "d": "^--"}
    for key in sorted(tables):
        ys = [tables[key]["average"][L] for L in plan.lengths]
        ax.plot(plan.lengths, [float("nan") if y is None else y for y in ys], styles[key], label=describe(plan, key)[0])
    ax.axvline(plan.train_len, color="grey", lw=0.8, ls=":", label=f"base training length {plan.train_len}")
    ax.axvline(plan.extend_len, color="red", lw=0.8, ls=":", label=f"extension length {plan.extend_len}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(plan.lengths, [str(L) for L in plan.lengths])
    ax.set_ylim(-3, 103)
    ax.set_xlabel(f"context length ({vocabulary(plan).split()[0]} tokens)")
    ax.set_ylabel("retrieval accuracy (avg over tasks)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(out: Path, plan: DemoPlan, seed: int, tables: dict, timings: dict, extra: dict) -> Path:
    """report.md + summary.json + accuracy_vs_length.png in the run directory."""
    fig = plot_variants(plan, tables, out / "accuracy_vs_length.png")
    summary = {"plan": plan.name, "seed": seed, "lengths": plan.lengths, "multipliers": list(plan.multipliers),
               "train_len": plan.train_len, "extend_len": plan.extend_len,
               "scaled_rope": plan.scaled_rope(), "variants": {}, "timings_s": timings, **extra}
    for key, t in tables.items():
        label, what = describe(plan, key)
        summary["variants"][key] = {
            "label": label, "description": what,
            "scores": {task: {str(L): v for L, v in row.items()} for task, row in t.items() if task != "average_se"},
            "average_stderr": {str(L): v for L, v in t.get("average_se", {}).items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))

    rope = plan.scaled_rope()
    L, XL = plan.train_len, plan.extend_len
    lines = [f"# longctx demo: context extension {L} → {XL} tokens", "",
             f"- plan: `{plan.name}`{' (CI smoke run: budgets far too small for meaningful accuracy)' if plan.name == 'fast' else ''}; training seed {seed}; eval seed {plan.eval_seed} "
             f"({plan.samples} samples per task and length; {HEATMAP_NOTE.format(n=plan.heatmap_samples, d=len(plan.heatmap_depths))})",
             f"- model: {extra.get('parameters', '?'):,} parameters ({plan.num_layers} layers, d{plan.hidden_size}, "
             f"{plan.num_heads} heads x {plan.head_dim}, {vocabulary(plan)}), {plan.dtype}, RoPE theta {plan.rope_theta:g}",
             f"- base training: {' → '.join(str(s.seq_len) for s in plan.base_stages)} tokens "
             f"({' + '.join(str(s.steps) for s in plan.base_stages)} steps), answer tokens weighted x{plan.answer_loss_weight:g}",
             f"- corpora (synthetic task mix): {corpus_mixes(plan)}",
             f"- extension: `{json.dumps(rope)}`, max_position_embeddings {XL}; {plan.extend_steps} steps at "
             f"{XL} tokens on {plan.nproc} processes, cp={plan.cp_size}, ZeRO-{plan.zero_stage}", "",
             "## Retrieval accuracy (average over tasks, 0-100)", ""]
    lines += accuracy_table(plan, tables)
    lines += ["", "Variants: " + "; ".join(f"{describe(plan, k)[0]}: {describe(plan, k)[1]}" for k in sorted(tables)) + ".",
              f"At {L} tokens the average is over {len(EVAL_TASKS) - sum(1 for t in EVAL_TASKS if tables['a'][t][L] is None)} tasks "
              "(compact niah_multivalue needs ~389 tokens). ± is one standard error of the average over the "
              f"eval's samples ({plan.samples} per task and length): the test set's sampling noise alone; "
              "a different training seed moves the scores by more.", ""]
    if "c" in tables:
        lines += ["## Before → after extension, per task and length", ""]
        lines += before_after_table(plan, tables["a"], tables["c"])
        lines.append("")
    if extra.get("findings"):
        lines += ["## What the numbers show", ""] + [f"- {f}" for f in extra["findings"]] + [""]
    lines += ["## Wall time", "", "| step | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in timings.items()]
    lines += ["", "## Files", "",
              "- `configs/*.yaml`: the training configs (re-run one with `longctx train --config ...`; "
              "the extension under `torchrun --nproc_per_node 2 -m longctx train --config ...`)",
              "- `base/`, `extend/`" + (", `extend_plain/`" if "d" in tables else "") +
              ": training runs (resolved_config.yaml, metrics.jsonl, tb/, checkpoints/, hf/, train.log)",
              "- `eval/<variant>/`: results.json (every sample), report.md, heatmap_niah_single_1.png, scores_vs_length.png",
              f"- `{fig.name}`, `summary.json`", "",
              f"![accuracy vs length]({fig.name})", "",
              "![before](eval/a_base/heatmap_niah_single_1.png) ![after](eval/c_extended/heatmap_niah_single_1.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _mix(tasks: tuple, recall_multivalue: float, line_breaks: float = 0.0) -> str:
    parts = [f"{t} {w:g}" for t, w in tasks]
    if recall_multivalue and any(t == "recall" for t, _ in tasks):
        parts.append(f"{recall_multivalue:.0%} of recall keys multi-valued")
    if line_breaks and any(t != "recall" for t, _ in tasks):
        parts.append(f"{line_breaks:.0%} of the other documents with each needle on its own line")
    return ", ".join(parts)


def corpus_mixes(plan: DemoPlan) -> str:
    stages = [f"{s.seq_len}: {_mix(s.tasks, plan.recall_multivalue, plan.line_breaks)}" for s in plan.base_stages if s.tasks]
    return (f"base {_mix(plan.tasks, plan.recall_multivalue, plan.line_breaks)}" + (f" ({'; '.join(stages)})" if stages else "") +
            f"; extension {_mix(plan.extend_tasks, plan.extend_recall_multivalue, plan.extend_line_breaks)}" +
            _extension_extras(plan))


def _extension_extras(plan: DemoPlan) -> str:
    parts = []
    if plan.extend_dense_weight > 0:
        parts.append(f"{plan.extend_dense_weight:.0%} of rows dense niah ({plan.extend_dense_keys} keys, "
                     f"{plan.extend_dense_queries} questions)")
    return "".join(f", {p}" for p in parts)


HEATMAP_NOTE = "niah_single_1: {n} per depth x {d} depths"
