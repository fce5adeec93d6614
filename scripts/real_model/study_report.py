"""The report of scripts/real_model/real_model_study.py, from its finished cells only: markdown, JSON and PNG
heatmaps (written atomically). Every mean is shown with its standard error and every difference
with its 95% paired-bootstrap interval, both from longctx/eval/paired.py."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from zero_shot_table import finished_cells, kfmt  # noqa: E402

from longctx.eval import paired  # noqa: E402
from longctx.storage import atomic  # noqa: E402


def collect(out: Path, names) -> dict:
    """{variant: {"grid"|"tasks": {(task, length, index): record}, "dtypes": {(phase, length): dtype},
    "ppl": {(group, length): cell}}}."""
    data = {}
    for name in names:
        d = {"grid": {}, "tasks": {}, "dtypes": {}, "ppl": {}}
        for phase in ("grid", "tasks"):
            for doc in finished_cells([out], name, phase):
                for rec in doc.get("records", []):
                    d[phase][(rec["task"], int(rec["target_length"]), int(rec["index"]))] = rec
                d["dtypes"][(phase, int(doc["length"]))] = (doc.get("identity") or {}).get("dtype", "?")
        for f in sorted((out / name / "ppl").glob("*/*.json")):
            cell = json.loads(f.read_text())
            if cell.get("windows"):
                d["ppl"][(cell["group"], int(cell["length"]))] = cell
        data[name] = d
    return data


def _scores(recs: dict, length: int, task=None) -> dict:
    return {k: float(r["score"]) for k, r in recs.items() if k[1] == length and (task is None or k[0] == task)}


def _by_task(key):
    return key[0]


def _depth_of(recs):
    return lambda key: recs[key].get("depth")


def _nll(cell) -> dict:
    return {(w["doc"], w["end"]): w["nll"] / w["tokens"] for w in cell["windows"]}


def compute(args, variants: dict, data: dict) -> dict:
    boot = {"resamples": args.resamples, "seed": args.seed}
    comps = [(b, args.reference) for b in variants if b != args.reference]
    comps += [tuple(c.split(":", 1)) for c in args.compare]
    comps = [(b, a) for b, a in comps if b in data and a in data]
    res = {"tasks": {}, "grid": {}, "ppl": {}, "diffs": {"tasks": {}, "grid": {}, "ppl": {}}, "dtypes": {}}
    for name, d in data.items():
        res["dtypes"][name] = {f"{ph} {kfmt(n)}": dt for (ph, n), dt in sorted(d["dtypes"].items())}
        for length in sorted({k[1] for k in d["tasks"]}):
            s = _scores(d["tasks"], length)
            tasks = sorted({k[0] for k in s})
            row = {t: paired.summarize([[v for k, v in s.items() if k[0] == t]], **boot) for t in tasks}
            row["mean"] = paired.summarize([[v for k, v in s.items() if k[0] == t] for t in tasks], **boot)
            res["tasks"].setdefault(name, {})[length] = row
        for length in sorted({k[1] for k in d["grid"]}):
            s = _scores(d["grid"], length)
            depths = sorted({d["grid"][k].get("depth") for k in s}, key=lambda x: (x is None, x))
            cells = {str(dp): paired.summarize([[v for k, v in s.items() if d["grid"][k].get("depth") == dp]], **boot)
                     for dp in depths}
            cells["mean"] = paired.summarize([[v for k, v in s.items() if d["grid"][k].get("depth") == dp]
                                              for dp in depths], **boot)
            res["grid"].setdefault(name, {})[length] = cells
        for (group, length), cell in sorted(d["ppl"].items()):
            res["ppl"].setdefault(name, {}).setdefault(group, {})[length] = {
                "ppl": cell["ppl"], "windows": len(cell["windows"]), "documents": cell["documents"],
                "dtype": cell["dtype"]}
    for b, a in comps:
        label = f"{b} - {a}"
        for length in sorted({k[1] for k in data[a]["tasks"]} & {k[1] for k in data[b]["tasks"]}):
            sa, sb = _scores(data[a]["tasks"], length), _scores(data[b]["tasks"], length)
            ta, tb = data[a]["tasks"], data[b]["tasks"]
            row = {t: paired.paired_difference(_scores(ta, length, t), _scores(tb, length, t), **boot)
                   for t in sorted({k[0] for k in sa} & {k[0] for k in sb})}
            row["mean"] = paired.paired_difference(sa, sb, stratum_of=_by_task, **boot)
            res["diffs"]["tasks"].setdefault(label, {})[length] = row
        for length in sorted({k[1] for k in data[a]["grid"]} & {k[1] for k in data[b]["grid"]}):
            sa, sb = _scores(data[a]["grid"], length), _scores(data[b]["grid"], length)
            res["diffs"]["grid"].setdefault(label, {})[length] = paired.paired_difference(
                sa, sb, stratum_of=_depth_of(data[a]["grid"]), **boot)
        for gl in sorted(set(data[a]["ppl"]) & set(data[b]["ppl"])):
            d = paired.paired_difference(_nll(data[a]["ppl"][gl]), _nll(data[b]["ppl"][gl]), **boot)
            res["diffs"]["ppl"].setdefault(label, {}).setdefault(gl[0], {})[gl[1]] = d
    return res


def _md_table(header: list, rows: list) -> list:
    if not rows:
        return []
    return (["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
            + ["| " + " | ".join(r) + " |" for r in rows] + [""])


def _nats(d: dict) -> str:
    return f"{d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]"


def render(args, variants: dict, res: dict) -> str:
    label = {n: v["label"] for n, v in variants.items()}
    lines = [f"Model: `{args.model}`" + "".join(f"; {n}: `{v['model']}`" for n, v in variants.items() if v["trained"])
             + f". Seed {args.seed}: every variant scores the same samples. Scores 0-100; a mean is "
             f"\"mean ± s.e. (n)\", a difference \"B - A [95% interval]\" from a paired bootstrap with "
             f"{args.resamples} resamples (longctx/eval/paired.py); means over tasks or depths weigh each once.", ""]
    lines += ["## Retrieval on the depth x length grid", ""]
    glens = sorted({n for r in res["grid"].values() for n in r})
    lines += _md_table(["variant"] + [kfmt(n) for n in glens],
                       [[label[v]] + [f"{paired.fmt_mean(r[n]['mean'])} ({r[n]['mean']['n']})" if n in r else "-"
                                      for n in glens] for v, r in res["grid"].items() if r])
    lines += _md_table(["difference"] + [kfmt(n) for n in glens],
                       [[c] + [paired.fmt_diff(r[n]) if n in r else "-" for n in glens]
                        for c, r in res["diffs"]["grid"].items()])
    lines += ["## RULER tasks", ""]
    tlens = sorted({n for r in res["tasks"].values() for n in r})
    for n in tlens:
        tasks = sorted({t for r in res["tasks"].values() for t in r.get(n, {}) if t != "mean"})
        lines += [f"### {kfmt(n)}", ""]
        lines += _md_table(["variant"] + tasks + ["mean over tasks"],
                           [[label[v]] + [f"{paired.fmt_mean(r[n][t])} ({r[n][t]['n']})" if t in r[n] else "-"
                                          for t in tasks + ["mean"]] for v, r in res["tasks"].items() if n in r])
        lines += _md_table(["difference"] + tasks + ["mean over tasks"],
                           [[c] + [paired.fmt_diff(r[n][t]) if t in r[n] else "-" for t in tasks + ["mean"]]
                            for c, r in res["diffs"]["tasks"].items() if n in r])
    if res["ppl"]:
        lines += ["## Perplexity with fixed targets", "",
                  f"The last {args.ppl_target} tokens of windows ending at {args.ppl_positions} positions of every "
                  "held-out document at least as long as the longest window: the same tokens at every length.", ""]
        for group in sorted({g for r in res["ppl"].values() for g in r}):
            plens = sorted({n for r in res["ppl"].values() for n in r.get(group, {})})
            lines += [f"### {group}", ""]
            lines += _md_table(["variant"] + [kfmt(n) for n in plens],
                               [[label[v]] + [f"{r[group][n]['ppl']:.3f}" if n in r.get(group, {}) else "-"
                                              for n in plens] for v, r in res["ppl"].items() if group in r])
            first = next(r[group][n] for r in res["ppl"].values() if group in r for n in r[group])
            lines += [f"{first['windows']} windows from {first['documents']} documents.", ""]
            lines += _md_table(["Δ NLL/token (nats)"] + [kfmt(n) for n in plens],
                               [[c] + [_nats(r[group][n]) if n in r.get(group, {}) else "-" for n in plens]
                                for c, r in res["diffs"]["ppl"].items() if group in r])
    lines += ["## dtype per cell", ""]
    lines += [f"- {label[v]}: " + ", ".join(f"{k} {dt}" for k, dt in cells.items())
              for v, cells in res["dtypes"].items() if cells]
    return "\n".join(lines) + "\n"


def _heatmap(path: Path, title: str, depths: list, lengths: list, value, diverging: bool) -> None:
    import numpy as np
    grid = np.array([[value(d, n) for n in lengths] for d in depths], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 4))
    im = ax.imshow(grid, cmap="RdBu" if diverging else "viridis", vmin=-100 if diverging else 0, vmax=100,
                   aspect="auto", origin="upper")
    ax.set_xticks(range(len(lengths)), [kfmt(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    with atomic.result_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def plots(report: Path, variants: dict, data: dict, reference: str) -> list:
    written = []
    for name, d in data.items():
        recs = d["grid"]
        if not recs:
            continue
        depths = sorted({r.get("depth") for r in recs.values() if r.get("depth") is not None})
        lengths = sorted({k[1] for k in recs})

        def mean(rs, dp, n):
            vals = [float(r["score"]) for k, r in rs.items() if k[1] == n and r.get("depth") == dp]
            return sum(vals) / len(vals) if vals else float("nan")
        path = report.parent / f"{report.stem}-grid-{name}.png"
        _heatmap(path, f"{variants[name]['label']}: mean score", depths, lengths,
                 lambda dp, n: mean(recs, dp, n), False)
        written.append(path)
        ref = data.get(reference, {}).get("grid")
        if name != reference and ref:
            shared = {k for k in recs if k in ref}

            def diff(dp, n):
                ks = [k for k in shared if k[1] == n and recs[k].get("depth") == dp]
                return (sum(float(recs[k]["score"]) - float(ref[k]["score"]) for k in ks) / len(ks)
                        if ks else float("nan"))
            path = report.parent / f"{report.stem}-grid-diff-{name}.png"
            _heatmap(path, f"{variants[name]['label']} - {reference}: paired mean difference", depths, lengths, diff,
                     True)
            written.append(path)
    return written


def write(args, variants: dict, report: Path) -> str:
    data = collect(args.out, variants)
    res = compute(args, variants, data)
    text = render(args, variants, res)
    report.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_result(report, text)
    atomic.write_json(report.with_suffix(".json"), _jsonable(res))
    plots(report, variants, data, args.reference)
    return text


def _jsonable(obj):
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else str(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
