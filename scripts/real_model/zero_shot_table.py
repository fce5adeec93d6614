"""Zero-shot RoPE scalings of one model, measured: perplexity on held-out long documents and
RULER tasks at each length, for the model as shipped and with each scaling applied at eval time
(`longctx eval model_overrides.*`, no training).

    python scripts/real_model/zero_shot_table.py --model models/smollm2-135m-instruct \\
        --ppl-data data/longtext/heldout.jsonl --out eval/smollm2-zero-shot
    python scripts/real_model/zero_shot_table.py ... --phases ppl --ppl-lengths 2k,4k,8k,16k  # one part
    python scripts/real_model/zero_shot_table.py ... --report-only                            # tables from what exists
    python scripts/real_model/zero_shot_table.py ... -- --tokenizer byte --style compact      # more eval options
    python scripts/real_model/zero_shot_table.py --model runs/x --variants as-is ...          # a trained model as it is
    python scripts/real_model/zero_shot_table.py ... --variants yarn2 --tasks vt --part b     # beside a yarn2 run
    python scripts/real_model/zero_shot_table.py ... --report-only --from eval/other-run      # one table from two OUTs

Each (variant, phase) is one `longctx eval` into OUT/VARIANT/PHASE; its finished cells are kept,
so an interrupted run continues where it stopped when the same command is rerun. OUT/table.md
and OUT/zero_shot.png are rewritten (atomically) from every finished cell present after each
evaluation, so a partial run still has a table of what finished, and runs at other lengths or
tasks into the same OUT add to the table (results.json holds only its own run's cells).
`--part NAME` evaluates into OUT/VARIANT/PHASE.NAME, which has its own lock: a second process of
the same variant (other tasks or lengths) runs beside the first, and the table reads every part.
`--from DIR` adds the cells of another OUT to the table (it is read, never written). A (task,
length) of one variant present twice counts once when both are the same measurement (the same
cell key) and is an error when they differ, as is one variant computed from two models or with
two sets of overrides.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from longctx.base.errors import UserError  # noqa: E402
from longctx.eval.cells import CellStore  # noqa: E402
from longctx.storage import atomic  # noqa: E402

# name -> (label, rope_parameters override or None); all but dynamic NTK and as-is run with
# max_position_embeddings raised; as-is runs the model with no override (a trained model's own RoPE)
AS_IS = "as-is"
VARIANTS = {  # in the order they run
    "shipped": ("as shipped (plain RoPE past the pretraining length)", None),
    "yarn4": ("YaRN x4", {"rope_type": "yarn", "factor": 4.0}),
    "yarn2": ("YaRN x2", {"rope_type": "yarn", "factor": 2.0}),
    "linear4": ("linear PI x4", {"rope_type": "linear", "factor": 4.0}),
    "dynamic4": ("dynamic NTK (factor 4)", {"rope_type": "dynamic", "factor": 4.0}),
    AS_IS: ("as it is (its own RoPE, no model_overrides)", None),
}
DEFAULT_VARIANTS = [v for v in VARIANTS if v != AS_IS]  # as-is of a base model is "shipped" without the raise
RULER_TASKS = "niah_single_1,niah_single_2,niah_multikey_1,vt,fwe"


def flow(mapping: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def eval_command(args, variant: str, phase: str) -> list[str]:
    _, rope = VARIANTS[variant]
    cmd = [sys.executable, "-m", "longctx", "eval", "--model", args.model, "--out",
           str(args.out / variant / (f"{phase}.{args.part}" if args.part else phase)),
           "--dtype", args.dtype, "--seed", str(args.seed), "--max-batch-tokens", str(args.max_batch_tokens)]
    if variant != AS_IS and (rope is None or rope["rope_type"] != "dynamic"):  # dynamic NTK scales by itself
        cmd.append(f"model_overrides.max_position_embeddings={args.max_positions}")
    if rope is not None:
        cmd.append(f"model_overrides.rope_parameters={flow(rope)}")
    if args.quiet:
        cmd.append("--no-progress")
    cmd += args.eval_args
    if phase == "ppl":
        cmd += ["--suite", "ppl", "--ppl-data", args.ppl_data, "--lengths", args.ppl_lengths,
                "--ppl-windows", str(args.ppl_windows)]
    else:
        cmd += ["--tasks", args.tasks, "--lengths", args.ruler_lengths, "--samples", str(args.samples)]
    return cmd


def phase_dirs(roots: list, variant: str, phase: str) -> list[Path]:
    """ROOT/VARIANT/PHASE and its parts ROOT/VARIANT/PHASE.NAME, for each OUT in roots, that exist."""
    dirs = []
    for root in roots:
        dirs += [root / variant / phase] + sorted((root / variant).glob(f"{phase}.*"))
    return [d for d in dirs if d.is_dir()]


def finished_cells(roots: list, variant: str, phase: str) -> list[dict]:
    """The finished cells of (variant, phase) in every OUT of roots and every part, each
    measurement once (by its key). UserError when two differ for one (task, length), or when the
    variant's cells come from two models or two sets of overrides: they would not be one row."""
    by_cell: dict = {}  # (task, length) -> (cell, its directory)
    for where in phase_dirs(roots, variant, phase):
        for doc in CellStore(where, {}).read(notify=lambda _note: None).values():
            if not doc.get("complete"):
                continue
            name = (doc["task"], int(doc["length"]))
            seen = by_cell.setdefault(name, (doc, where))
            if seen[0]["key"] != doc["key"]:
                raise UserError(f"--from/--part: {variant}'s {name[0]} at {kfmt(name[1])} is in {seen[1]} and in "
                                f"{where}, computed from different samples, models or overrides; report them "
                                "from separate --out directories")
    docs = [doc for doc, _where in by_cell.values()]
    for field in ("model", "model_overrides"):
        values = {json.dumps(doc["identity"].get(field), sort_keys=True): where for doc, where in by_cell.values()}
        if len(values) > 1:
            raise UserError(f"--from/--part: {variant}'s {phase} cells under {' and '.join(map(str, values.values()))}"
                            f" differ in their {field.replace('_', ' ')}; one row holds one model and one scaling")
    return docs


def load(roots: list, variant: str, phase: str):
    """Every finished cell of (variant, phase) under roots (OUT, then each --from), as a
    results.json would hold them ({"samples": [...], "ppl": {"rows": [...]}}); None when none."""
    done = finished_cells(roots, variant, phase)
    if not done:
        return None
    ppl = [doc for doc in done if "row" in doc]
    return {"samples": [rec for doc in done for rec in doc.get("records", [])],
            "ppl": {"rows": [doc["row"] for doc in ppl],
                    "windows": sorted({doc["cell"]["windows"] for doc in ppl}),
                    "documents": sorted({name for doc in ppl for name in doc["cell"]["documents"] or {}})}}


def ppl_rows(res) -> dict:
    """{length: perplexity} from load()."""
    return {int(r["length"]): float(r["ppl"]) for r in ((res or {}).get("ppl") or {}).get("rows", [])}


def ruler_rows(res) -> dict:
    """{length: (mean score over tasks, its standard error, samples)} from the records."""
    by_len: dict = {}
    for rec in (res or {}).get("samples", []):
        by_len.setdefault(int(rec["target_length"]), []).append(float(rec["score"]))
    out = {}
    for length, scores in by_len.items():
        n = len(scores)
        mean = sum(scores) / n
        var = sum((s - mean) ** 2 for s in scores) / (n - 1) if n > 1 else 0.0
        out[length] = (mean, math.sqrt(var / n), n)
    return out


def per_task(res) -> dict:
    """{(task, length): mean score}."""
    return {k: sum(v) / len(v) for k, v in _cells(res).items()}


def _counts(ruler_results: dict) -> str:
    """The samples per (task, length) cell the RULER results hold, over every variant ("4", "2-4")."""
    counts = [len(v) for res in ruler_results.values() for v in _cells(res).values()]
    return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"


def _cells(res) -> dict:
    cells: dict = {}
    for rec in (res or {}).get("samples", []):
        cells.setdefault((rec["task"], int(rec["target_length"])), []).append(float(rec["score"]))
    return cells


def _mean_se(mean: float, se: float, n: int) -> str:
    return f"{mean:.1f} ± {se:.1f}" if n > 1 else f"{mean:.1f} (1 sample)"


def _tasks_at(tasks: dict) -> dict:
    """{length: the tasks a variant has finished at it} from per_task()."""
    out: dict = {}
    for task, length in tasks:
        out.setdefault(length, set()).add(task)
    return out


def _coverage(tasks: dict) -> tuple:
    """({variant: {length: its finished tasks}}, {length: every task any variant finished}) from
    {variant: per_task()}."""
    done = {v: _tasks_at(t) for v, t in tasks.items()}
    lengths = {n for d in done.values() for n in d}
    return done, {n: {t for d in done.values() for t in d.get(n, ())} for n in lengths}


def _ruler_cell(row: dict, done: dict, every: dict, n: int) -> str:
    """A variant's mean at length n, marked when it covers fewer tasks than another variant's
    (a mean over other tasks is not comparable)."""
    if n not in row:
        return "-"
    text = _mean_se(*row[n])
    return text if done[n] >= every[n] else f"{text} ({len(done[n])} of {len(every[n])} tasks)"


def kfmt(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _table(title: str, columns: list, rows: dict, cells) -> list:
    """A markdown table (and a blank line) with one row per variant that has results, in
    VARIANTS order; nothing when no variant has any."""
    if not columns:
        return []
    lines = [f"| {title} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(cells(rows[v])) + " |" for v, (label, _) in VARIANTS.items() if rows[v]]
    return lines + [""]


def load_all(roots: list) -> dict:
    """{phase: {variant: load()}}: each cell file read once per report."""
    return {phase: {v: load(roots, v, phase) for v in VARIANTS} for phase in ("ppl", "ruler")}


def _ppl_source(args, ppl_results: dict) -> str:
    """What the perplexity cells read, from the cells themselves (a report needs no --ppl-data)."""
    ppl = [res["ppl"] for res in ppl_results.values() if res]
    windows = ", ".join(str(w) for w in sorted({w for p in ppl for w in p["windows"]}))
    source = (f"`{args.ppl_data}`" if args.ppl_data
              else ", ".join(f"`{d}`" for d in sorted({d for p in ppl for d in p["documents"]})))
    return f"; perplexity on {source} (windows per length: {windows}, each the first L tokens of a held-out document)"


def render(args, results: dict) -> str:
    ppl = {v: ppl_rows(res) for v, res in results["ppl"].items()}
    ruler = {v: ruler_rows(res) for v, res in results["ruler"].items()}
    tasks = {v: per_task(res) for v, res in results["ruler"].items()}
    plens = sorted({n for r in ppl.values() for n in r})
    rlens = sorted({n for r in ruler.values() for n in r})
    names = sorted({t for r in tasks.values() for t, _ in r})
    lines = [f"Model: `{args.model}`" + (_ppl_source(args, results["ppl"]) if plens else "")
             + (f"; RULER: mean score (0-100) over the tasks {', '.join(names)} (samples per task and length: "
                f"{_counts(results['ruler'])}), ± its standard error over samples" if rlens else "") + ".", ""]
    lines += _table("perplexity", [kfmt(n) for n in plens], ppl,
                    lambda row: [f"{row[n]:.2f}" if n in row else "-" for n in plens])
    done, every = _coverage(tasks)
    ruler_text = {v: [_ruler_cell(ruler[v], done[v], every, n) for n in rlens] if ruler[v] else None for v in ruler}
    lines += _table("RULER (mean ± s.e.)", [kfmt(n) for n in rlens], ruler_text, lambda texts: texts)
    lines += _table("per task", [f"{t} {kfmt(n)}" for n in rlens for t in names], tasks,
                    lambda row: [f"{row[(t, n)]:.0f}" if (t, n) in row else "-" for n in rlens for t in names])
    return "\n".join(lines)


def plot(args, results: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    done, every = _coverage({v: per_task(res) for v, res in results["ruler"].items()})
    partial = False
    for v, (label, _) in VARIANTS.items():
        p = ppl_rows(results["ppl"][v])
        if p:
            xs = sorted(p)
            axes[0].plot(xs, [p[x] for x in xs], marker="o", label=label)
        r = ruler_rows(results["ruler"][v])
        if r:
            xs = sorted(r)
            line = axes[1].errorbar(xs, [r[x][0] for x in xs], yerr=[r[x][1] for x in xs], marker="o", capsize=3,
                                    label=label)[0]
            # a mean over fewer tasks than another variant's at that length: a hollow marker
            hollow = [x for x in xs if done[v][x] < every[x]]
            if hollow:
                partial = True
                axes[1].plot(hollow, [r[x][0] for x in hollow], linestyle="none", marker="o", markersize=9,
                             markerfacecolor="white", markeredgecolor=line.get_color())
    ruler_title = "RULER mean score" + ("\n(hollow: over fewer tasks than another variant)" if partial else "")
    for ax, title in zip(axes, ("perplexity on held-out documents", ruler_title)):
        ax.set_xscale("log", base=2)
        ax.axvline(args.pretrained_length, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[1].set_ylim(-5, 105)
    legend_axes = [ax for ax in axes if ax.get_legend_handles_labels()[0]]  # none before the first result
    if legend_axes:
        legend_axes[0].legend(fontsize=7)
    fig.tight_layout()
    with atomic.result_file(path) as tmp:  # a unique temporary: two runs may report into one OUT
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def roots(args) -> list:
    """The OUT directories a table reads: OUT, then each --from."""
    return [args.out, *args.sources]


def report(args) -> None:
    results = load_all(roots(args))  # a UserError here leaves OUT as it was
    args.out.mkdir(parents=True, exist_ok=True)
    text = render(args, results)
    atomic.write_result(args.out / "table.md", text)
    plot(args, results, args.out / "zero_shot.png")
    print(text, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--ppl-data", help="held-out long documents (.jsonl/.txt); needed for the ppl phase")
    p.add_argument("--out", type=Path, default=Path("eval/zero-shot"))
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"subset of {', '.join(VARIANTS)}")
    p.add_argument("--phases", default="ppl,ruler", help="ppl, ruler or both, in this order")
    p.add_argument("--ppl-lengths", default="2k,4k,8k,16k,32k")
    p.add_argument("--ppl-windows", type=int, default=2)
    p.add_argument("--ruler-lengths", default="4k,8k,16k")
    p.add_argument("--tasks", default=RULER_TASKS)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-positions", type=int, default=32768, help="max_position_embeddings every variant runs with")
    p.add_argument("--pretrained-length", type=int, default=8192, help="drawn as a line in the plot")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch-tokens", type=int, default=16384)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--report-only", action="store_true", help="write the table and plot from the results present")
    p.add_argument("--part", help="evaluate into OUT/VARIANT/PHASE.PART: a second process beside a run of the same "
                                  "variant (letters, digits, - and _)")
    p.add_argument("--from", dest="sources", type=Path, action="append", default=[], metavar="DIR",
                   help="another OUT whose cells join the table (read only; repeatable)")
    p.add_argument("eval_args", nargs="*", help="after --: options passed to every longctx eval")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        print(f"error: --variants: unknown {', '.join(bad)}; valid: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if any(x not in ("ppl", "ruler") for x in phases):
        print(f"error: --phases: {args.phases!r}; valid: ppl, ruler", file=sys.stderr)
        return 2
    if not Path(args.model).is_dir():
        print(f"error: --model: {args.model} is not a directory (scripts/real_model/smollm2.py makes one)",
              file=sys.stderr)
        return 2
    if "ppl" in phases and not args.ppl_data and not args.report_only:
        print("error: --ppl-data: needed for the ppl phase (scripts/real_model/long_text.py makes one)",
              file=sys.stderr)
        return 2
    if args.ppl_data and not Path(args.ppl_data).exists():
        print(f"error: --ppl-data: {args.ppl_data} does not exist (scripts/real_model/long_text.py makes one)",
              file=sys.stderr)
        return 2
    if args.part is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", args.part):
        print(f"error: --part: {args.part!r}; valid: letters, digits, - and _", file=sys.stderr)
        return 2
    missing = [str(d) for d in args.sources if not d.is_dir()]
    if missing:
        print(f"error: --from: {', '.join(missing)} is not a directory (an --out of this script)", file=sys.stderr)
        return 2
    try:
        if not args.report_only:
            load_all(roots(args))  # the cells agree, before any evaluation (a report checks that itself)
        return run(args, variants, phases)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args, variants: list, phases: list) -> int:
    if not args.report_only:
        for phase in phases:
            for v in variants:
                cmd = eval_command(args, v, phase)
                print(f"[{v} {phase}] " + " ".join(cmd[1:]), flush=True)
                rc = subprocess.call(cmd)
                if rc != 0:
                    report(args)
                    print(f"error: {v} {phase}: longctx eval exited {rc}", file=sys.stderr)
                    return rc
                report(args)
    report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
