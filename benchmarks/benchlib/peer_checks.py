"""Correctness of a contender against the reference (single-process transformers) and the
summaries benchmarks/bench_peers.py prints: pure functions of tensors and rows."""
from __future__ import annotations

import statistics

# fp32, one step: a correct parallel step differs from one process by reduction order only
# (~1e-6 relative); a wrong aggregation or a missing reduction shows as >= 1e-2.
GRAD_TOLERANCE = 1e-4


def compare_grads(grads: dict, ref: dict) -> dict:
    """Per-tensor relative error of the gradient and of its norm vs the reference.

    grads / ref: {hf parameter name: tensor}. Returns the worst tensor of each measure and the
    names missing on either side (a parameter without a gradient is an error, not a skip)."""
    missing = sorted(set(ref) ^ set(grads))
    worst_err, worst_norm = (0.0, None), (0.0, None)
    for name in sorted(set(ref) & set(grads)):
        g, r = grads[name].double(), ref[name].double()
        r_norm = float(r.norm()) or 1.0
        err = float((g - r).norm()) / r_norm
        norm_err = abs(float(g.norm()) - float(r.norm())) / r_norm
        if err > worst_err[0] or worst_err[1] is None:
            worst_err = (err, name)
        if norm_err > worst_norm[0] or worst_norm[1] is None:
            worst_norm = (norm_err, name)
    common = sorted(set(ref) & set(grads))
    total = sum(float(grads[n].double().norm()) ** 2 for n in common) ** 0.5
    total_ref = sum(float(ref[n].double().norm()) ** 2 for n in common) ** 0.5
    return {"norm_ratio": total / (total_ref or 1.0), "max_grad_rel_err": worst_err[0], "worst_grad": worst_err[1],
            "max_norm_rel_err": worst_norm[0], "worst_norm": worst_norm[1], "missing": missing}


def grad_norms(grads: dict) -> dict:
    return {n: float(g.double().norm()) for n, g in grads.items()}


def correctness_row(name: str, loss: float, ref_loss: float, grads: dict, ref: dict) -> dict:
    cmp = compare_grads(grads, ref)
    ok = (not cmp["missing"] and cmp["max_grad_rel_err"] <= GRAD_TOLERANCE
          and abs(loss - ref_loss) <= GRAD_TOLERANCE * abs(ref_loss))
    return {"impl": name, "loss": loss, "loss_diff": loss - ref_loss, **cmp, "correct": ok,
            "grad_norms": grad_norms(grads)}


def speed_summary(step_times: list[float], tokens: int) -> dict:
    """tokens/s at the median step time, at the fastest step (the least disturbed by other load
    on a shared machine) and at the slowest."""
    return {"step_s": step_times, "tokens_per_s_median": tokens / statistics.median(step_times),
            "tokens_per_s_fastest": tokens / min(step_times), "tokens_per_s_min": tokens / max(step_times)}


def correctness_table(rows: list[dict]) -> str:
    lines = ["| impl | loss | loss - ref | grad norm / ref | max grad rel. err (tensor) | "
             "max grad-norm rel. err (tensor) "
             "| correct |", "|---|---:|---:|---:|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | failed: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['impl']} | {r['loss']:.6f} | {r['loss_diff']:+.1e} | {r['norm_ratio']:.4f} | "
                     f"{r['max_grad_rel_err']:.1e} "
                     f"({r['worst_grad']}) | {r['max_norm_rel_err']:.1e} ({r['worst_norm']}) | "
                     f"{'yes' if r['correct'] else 'NO'}"
                     f"{' (missing ' + ', '.join(r['missing']) + ')' if r['missing'] else ''} |")
    return "\n".join(lines)


def speed_table(rows: list[dict]) -> str:
    lines = ["| T | impl | processes | tok/s median | tok/s fastest | peak RSS / rank GiB | step peak growth GiB "
             "| CPU MFU median / fastest |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['seq_len']} | {r['impl']} | {r['processes']} | failed: {r['error']} | | | | |")
            continue
        mfu = f"{r['cpu_mfu']:.2f} / {r['cpu_mfu_fastest']:.2f}" if r.get("cpu_mfu") is not None else "—"
        lines.append(f"| {r['seq_len']} | {r['impl']} | {r['processes']} | {r['tokens_per_s_median']:.0f} | "
                     f"{r['tokens_per_s_fastest']:.0f} | {r['peak_rss_gb']:.2f} | {r['step_growth_gb']:.2f} | {mfu} |")
    return "\n".join(lines)


def ratio_table(rows: list[dict], ours: tuple[str, ...], peers: tuple[str, ...]) -> str:
    """Best of `ours` over best of `peers` per length, speed (median tok/s) and peak memory."""
    lines = ["| T | best longctx | best peer | speed ratio (median) | speed ratio (fastest steps) | memory ratio |",
             "|---:|---|---|---:|---:|---:|"]
    for T, run in sorted({(r["seq_len"], r.get("run", 0)) for r in rows}):
        at = [r for r in rows if r["seq_len"] == T and r.get("run", 0) == run and "error" not in r]
        mine = [r for r in at if r["impl"] in ours]
        theirs = [r for r in at if r["impl"] in peers]
        if not mine or not theirs:
            continue
        a = max(mine, key=lambda r: r["tokens_per_s_median"])
        b = max(theirs, key=lambda r: r["tokens_per_s_median"])
        mem_a = min(r["peak_rss_gb"] for r in mine)
        mem_b = min(r["peak_rss_gb"] for r in theirs)
        fa = max(r["tokens_per_s_fastest"] for r in mine)
        fb = max(r["tokens_per_s_fastest"] for r in theirs)
        lines.append(f"| {T} | {a['impl']} | {b['impl']} | {a['tokens_per_s_median'] / b['tokens_per_s_median']:.2f}x "
                     f"| {fa / fb:.2f}x | {mem_a / mem_b:.2f}x |")
    return "\n".join(lines)
