"""Endpoint backend benchmark (CPU): requests/s at --concurrency 1 vs 8 against a real server.

    .venv/bin/python benchmarks/bench_eval_endpoint.py --json served.json       # ~6 min on 2 cores
    .venv/bin/python benchmarks/bench_eval_endpoint.py --quick                  # smaller, a smoke run

A tiny fp32 model (benchlib/served.py) behind `transformers serve` on 127.0.0.1, once as it
starts by default and once with `--continuous-batching` (requests batched on the server). The
same RULER niah_single_1 prompts (fitted with the byte tokenizer) go through the eval's own
backend (longctx/eval/endpoint/backend.py: N requests in flight, greedy, the task budget),
the two concurrencies interleaved (benchlib.timing: A B A B rounds); before any timing a check
pass (which warms the server up too) compares concurrency 8's predictions with concurrency 1's,
and the two servers' with each other. Reported: requests/s
and generated tokens/s at the median and min time of one pass over the prompts, and the ratio
8 / 1 in the same run.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchlib.machine import package_versions
from benchlib.procs import free_port
from benchlib.report import markdown_table, timing_fields, write_json
from benchlib.served import ServedModel, write_tiny_model
from benchlib.timing import interleaved

from longctx.data.tokenizer import load_tokenizer
from longctx.eval.endpoint.backend import EndpointBackend
from longctx.eval.endpoint.client import EndpointClient
from longctx.eval.tasks import TaskOptions, build_samples

CONCURRENCY = (1, 8)
SERVERS = {"transformers serve": (), "transformers serve --continuous-batching": ("--continuous-batching",)}


def measure(server: ServedModel, samples: list, steps: int, warmup: int) -> tuple[list[dict], list[str]]:
    """(one row per concurrency, concurrency 1's predictions); the check pass warms the server up."""
    client = EndpointClient(server.url, concurrency=max(CONCURRENCY), timeout_s=600, retries=0)
    backends = {c: EndpointBackend(client, server.model, concurrency=c) for c in CONCURRENCY}
    try:
        answers = {c: [r["prediction"] for r in b.run_cell(samples).records] for c, b in backends.items()}
        same = answers[CONCURRENCY[0]] == answers[CONCURRENCY[-1]]
        runs = {c: (lambda b=b: b.run_cell(samples)) for c, b in backends.items()}
        timing = interleaved(runs, steps=steps, warmup=warmup)
        new_tokens = {c: b.totals["new_tokens"] / b.totals["requests"] for c, b in backends.items()}
    finally:
        client.close()
    rows = []
    for c in CONCURRENCY:
        t = timing[c]
        rows.append({"concurrency": c, "requests": len(samples), "predictions_equal_concurrency_1": same,
                     "requests_per_s_median": len(samples) / t.median_s, "requests_per_s_best": len(samples) / t.min_s,
                     "new_tokens_per_request": new_tokens[c],
                     "new_tokens_per_s_median": len(samples) * new_tokens[c] / t.median_s, **timing_fields(t)})
    return rows, answers[CONCURRENCY[0]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 prompts of 512 tokens, 1 timed round")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=0, help="untimed passes after the check pass")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.length, args.steps, args.warmup = 8, 512, 1, 0
    samples = build_samples("niah_single_1", load_tokenizer("byte"), args.length, args.samples, seed=0,
                            options=TaskOptions(max_new_tokens=32))
    results, predictions = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "hf")
        for name, extra in SERVERS.items():
            server = ServedModel(model, free_port(), log=Path(tmp) / "serve.log", extra=extra).start()
            try:
                rows, predictions[name] = measure(server, samples, args.steps, args.warmup)
            finally:
                server.stop()
            base = rows[0]["requests_per_s_median"]
            results += [dict(row, server=name, ratio_vs_concurrency_1=row["requests_per_s_median"] / base)
                        for row in rows]
    table = [[r["server"], r["concurrency"], r["requests"], f"{r['requests_per_s_median']:.2f}",
              f"{r['requests_per_s_best']:.2f}", f"{r['new_tokens_per_s_median']:.0f}",
              f"{r['ratio_vs_concurrency_1']:.2f}", "yes" if r["predictions_equal_concurrency_1"] else "NO"]
             for r in results]
    print(markdown_table(["server", "concurrency", "requests", "req/s (median)", "req/s (best)",
                          "gen tok/s (median)", "x vs concurrency 1", "same predictions"], table, "llrrrrrl"))
    same = len({tuple(p) for p in predictions.values()}) == 1
    print(f"predictions of the two servers equal: {'yes' if same else 'NO'}")
    if args.json:
        write_json(args.json, {"benchmark": "eval_endpoint", "length": args.length, "max_new_tokens": 32,
                               "task": "niah_single_1", "versions": package_versions(("torch", "transformers",
                                                                                      "httpx")),
                               "servers_predictions_equal": same, "rows": results})


if __name__ == "__main__":
    main()
