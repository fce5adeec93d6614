"""The report of benchmarks/bench_peers.py: its ranks' speed rows merged into one per (length,
contender), the thread policy it states, saved reports merged (--render), and the tables it
prints."""
from __future__ import annotations

import json
import os
import statistics

from benchlib.peer_checks import correctness_table, ratio_table, speed_summary, speed_table
from benchlib.peer_contenders import ALST, CP
from benchlib.report import timing_fields
from benchlib.timing import slowest_rank


def merge_speed(ranks: list[list[dict]]) -> list[dict]:
    """Per (T, impl): a step's time is the slowest rank's; memory is the largest rank's."""
    groups: dict = {}
    for rows in ranks:
        for r in rows:
            groups.setdefault((r["seq_len"], r["impl"]), []).append(r)
    out = []
    for (T, _), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        row = dict(max(ok, key=lambda r: r["peak_rss_gb"]) if ok else rs[0])
        row.pop("rank", None)
        if ok:
            step_s = slowest_rank([r["step_s"] for r in ok])
            row.update(speed_summary(step_s, T), **timing_fields(step_s, row.get("warmup")),
                       peak_rss_gb_per_rank=[r["peak_rss_gb"] for r in ok],
                       threads=sorted({t for r in ok for t in r.get("threads", ())}))
            limit_s = row["gemm_limit_s"] + row["attention_limit_s"]
            row["cpu_mfu"], row["cpu_mfu_fastest"] = limit_s / statistics.median(step_s), limit_s / min(step_s)
        out.append(row)
    return out


def thread_policy(args) -> dict:
    """The thread policy every contender ran under (the report's `thread_policy`)."""
    n = f"{args.threads_per_rank} thread{'s' if args.threads_per_rank > 1 else ''}"
    return {"threads_per_rank": args.threads_per_rank, "processes": args.world,
            "cores": os.cpu_count(), "oversubscribed": args.threads_per_rank * args.world > (os.cpu_count() or 1),
            "one_process_contenders": f"rank 0 with {n} while the other ranks wait",
            "machine_limits": f"measured with {n} on every rank at once",
            "env": {"OMP_NUM_THREADS": str(args.threads_per_rank), "MKL_NUM_THREADS": str(args.threads_per_rank)},
            "cpu_affinity": "none (the OS schedules)"}


def print_report(report: dict) -> None:
    if isinstance(report.get("correctness"), list):
        print("\nCorrectness: one fp32 step vs one process of transformers\n")
        print(correctness_table(report["correctness"]))
    if report.get("speed"):
        print(f"\nSpeed: {report.get('dtype', 'bfloat16')}, full activation checkpointing\n")
        print(speed_table(report["speed"]))
        print("\nlongctx (best of ring / ulysses / allgather) vs ALST (best of alst / alst-tiled)\n")
        print(ratio_table(report["speed"], CP, ALST))
        print("\nlongctx vs transformers, one process\n")
        print(ratio_table(report["speed"], ("ours",), ("hf",)))
    if report.get("max_len"):
        budget = report["max_len"][0]["budget_gb"]
        print(f"\n| impl | processes | longest T within {budget:g} GiB / rank | first failing T | "
              "peak RSS / rank at longest (GiB) |\n|---|---:|---:|---:|---:|")
        for r in report["max_len"]:
            peak = next((p["peak_rss_gb"] for p in r["probes"] if p["seq_len"] == r["max_len"]), None)
            print(f"| {r['impl']} | {r['processes']} | {r['max_len']} | {r['first_failing']} | "
                  f"{'—' if peak is None else round(peak, 2)} |")


def render(paths: list[str]) -> dict:
    """Several saved reports as one (speed summaries recomputed from the stored step times)."""
    merged: dict = {"commands": []}
    for path in paths:
        rep = json.load(open(path))
        run = len(merged["commands"])  # rows carry the index of the command that measured them
        merged["commands"] += rep.get("commands", [rep.get("command")])
        for key in ("world", "preset", "layers", "cores"):
            merged.setdefault(key, rep.get(key))
        if isinstance(rep.get("correctness"), list):
            merged["correctness"] = rep["correctness"]
        for row in rep.get("speed", []):
            if "step_s" in row:
                row.update(speed_summary(row["step_s"], row["seq_len"]),
                           **timing_fields(row["step_s"], row.get("warmup")))
            merged.setdefault("speed", []).append(dict(row, run=row.get("run", run)))
        merged.setdefault("max_len", []).extend(dict(r, run=r.get("run", run)) for r in rep.get("max_len", []))
    return merged
