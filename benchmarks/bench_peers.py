"""longctx vs its peers, side by side on one machine: DeepSpeed ALST on transformers (Ulysses
sequence parallelism, with and without TiledMLP + TiledFusedLogitsLoss), longctx context
parallelism (ring, ulysses, allgather), and one process of transformers and of longctx.

    .venv/bin/python benchmarks/bench_peers.py --lengths 8192 --world 2 --out docs/results/bench_peers.json
    .venv/bin/python benchmarks/bench_peers.py --max-len --budget-gb 8 --world 2

One HF checkpoint is loaded by every contender: the bench-44m shape with random weights (made
once by this script), or with `--init-from DIR` a Hugging Face Llama directory's shape and
weights (`--random-weights`: its shape alone; benchmarks/benchlib/model.py); every contender
trains on the same batch. The run, in one group of `--world` gloo processes:
  1. correctness (fp32, one step at --check-len): loss and per-tensor gradients of each contender
     vs one process of transformers (the multi-rank gradients are DeepSpeed's reduced ones);
  2. speed (--dtype, default bf16, ZeRO-1 for the multi-rank contenders, full activation checkpointing): for each
     length every contender is built and stepped once, warmed up (--warmup), then timed in
     interleaved rounds (A B C A B C ..., benchlib.timing) so drifts in machine load hit all alike; tokens/s at the
     median and the slowest step. Thread policy (`--threads-per-rank N`, default 1, recorded as
     the report's `thread_policy` and each row's `threads`): every process of every contender
     runs N intra-op threads, one-process contenders (on rank 0, the other ranks waiting) too.
     Memory per rank: the contender's resident state (RSS added by building
     it and by its first step: weights, gradients, optimizer state, engine buffers) plus the
     step's peak growth (VmHWM reset at the step's start, minus RSS then); big blocks are mmapped
     (mallopt) so freed tensors leave RSS at once. CPU MFU: the time longctx's own operations of the
     step (each linear layer, the chunked loss, the attention kernel, each at its exact shape)
     take at their best on this machine, over the step's measured time
     (benchlib.cpu_limits.measure_cpu_limits, on all ranks at once, between rounds).
`--max-len`: for each contender, the longest T (doubling, then bisection over real one-step
runs, each a fresh process group) whose peak RSS per rank (VmHWM of the whole process) stays
within --budget-gb; a rank that crosses the budget is stopped at once by a watchdog.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from benchlib.cpu_limits import best_limits, cpu_limit_fraction, measure_cpu_limits
from benchlib.machine import machine_facts
from benchlib.memory import peak_rss_bytes, reset_peak, rss_bytes
from benchlib.model import add_model_args, base_config, check_model_args, model_source, write_checkpoint
from benchlib.peer_checks import correctness_row, speed_summary, speed_table
from benchlib.peer_contenders import (
    ALL_IMPLS,
    SINGLE,
    add_contender_args,
    build_contender,
    build_order,
    contender_options,
    make_batch,
)
from benchlib.peer_report import merge_speed, print_report, render, thread_policy
from benchlib.procs import init_rank, spawn_group
from benchlib.report import timing_fields, write_json
from benchlib.timing import DEFAULT_STEPS, DEFAULT_WARMUP, interleaved

from longctx.model.hf import read_hf_config

GiB = 2**30
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
OVER_BUDGET = 3  # a probe's exit code when its watchdog stopped it


# ------------------------------------------------------------------------------ one rank
def _free(*objs) -> None:
    del objs
    gc.collect()


def _run_step(c, inputs, rank: int):
    """One training step of `c` on this rank (rank 0 alone for one-process contenders), under the
    run's thread policy. Returns (seconds, loss, peak RSS growth bytes, intra-op threads seen at
    its start and end), or Nones where it did not run."""
    if c.single and rank != 0:
        return None, None, None, None
    threads = {torch.get_num_threads()}
    base = rss_bytes()
    reset_peak()
    t0 = time.perf_counter()
    loss = c.forward_backward(inputs)
    c.optimizer_step()
    dt = time.perf_counter() - t0
    growth = peak_rss_bytes() - base
    threads.add(torch.get_num_threads())  # a library that changed it inside the step shows here
    return dt, loss, growth, sorted(threads)


def _correctness(args, ckpt, rank, world):
    batch = make_batch(args.vocab, args.check_len, seed=1)
    ref = None
    if rank == 0:
        c = build_contender("hf", ckpt, torch.float32, world)
        ref_loss = c.forward_backward(c.prepare(batch))
        ref = (ref_loss, c.named_grads())
        _free(c)
    rows = []
    for name in build_order(args.impls):
        if name == "hf":
            if rank == 0:
                rows.append(correctness_row("hf", ref[0], ref[0], ref[1], ref[1]))
            continue
        dist.barrier()
        try:
            c = build_contender(name, ckpt, torch.float32, world, **contender_options(args))
            if not c.single or rank == 0:
                loss = c.forward_backward(c.prepare(batch))
                grads = c.named_grads()
                if rank == 0:
                    rows.append(correctness_row(name, loss, ref[0], grads, ref[1]))
            _free(c)
        except Exception as e:  # noqa: BLE001 - raised alike on every rank (configuration, shapes)
            if rank == 0:
                rows.append({"impl": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})
    return rows


def _speed(args, ckpt, rank, world, threads, T):
    cfg = read_hf_config(ckpt)  # the shape every contender loads
    limits: dict = {}

    def measure_limits():  # the machine's best rates seen in the run, measured between rounds
        for key, cp in (("multi", world), ("single", 1)):
            dist.barrier()
            if cp == 1 and (rank != 0 or not any(n in SINGLE for n in args.impls)):
                continue
            torch.set_num_threads(threads)  # the same policy as the steps
            new = measure_cpu_limits(cfg, T, cp, dtype=args.dtype, seconds=args.limit_seconds,
                                     loss_chunk_size=args.loss_chunk)
            limits[key] = best_limits(limits.get(key), new)

    measure_limits()
    batch = make_batch(cfg.vocab_size, T, seed=0)
    built, inputs, state, results = {}, {}, {}, {}
    for name in build_order(args.impls):  # build, then one warm-up step (allocates gradients, optimizer state)
        dist.barrier()
        rss0 = rss_bytes()
        try:
            built[name] = build_contender(name, ckpt, args.dtype, world, **contender_options(args))
            inputs[name] = built[name].prepare(batch)
            dt, loss, growth, seen = _run_step(built[name], inputs[name], rank)
            results[name] = {"growth": [], "loss": loss, "warmup_s": dt, "threads": set(seen or ())}
        except Exception as e:  # noqa: BLE001 - a peer that fails is a row, not the end of the run
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
            built.pop(name, None)
        gc.collect()
        state[name] = rss_bytes() - rss0
    names = [n for n in args.impls if n in built]
    base: dict = {}

    def before(name):  # outside the clock: the round's machine limits, then all ranks start together
        if name == names[0]:
            measure_limits()
        dist.barrier()
        torch.set_num_threads(threads)
        base[name] = rss_bytes()
        reset_peak()
        results[name]["threads"].add(torch.get_num_threads())

    def after(name):
        if runs_here(name):
            results[name]["growth"].append(peak_rss_bytes() - base[name])
            results[name]["threads"].add(torch.get_num_threads())  # a library that changed it shows here

    def runs_here(name):  # one-process contenders run on rank 0, the other ranks wait
        return rank == 0 or not built[name].single

    def step(name):
        if runs_here(name):
            built[name].forward_backward(inputs[name])
            built[name].optimizer_step()

    timings = interleaved({n: (lambda n=n: step(n)) for n in names}, steps=args.steps, warmup=args.warmup,
                          before=before, after=after)
    out = []
    for name in args.impls:
        res = results[name]
        row = {"seq_len": T, "impl": name, "processes": 1 if name in SINGLE else world, "rank": rank}
        if "error" in res:
            out.append({**row, "error": res["error"]})
            continue
        if not runs_here(name):
            continue  # a one-process contender on ranks > 0
        times = timings[name].times
        lim = limits["single" if name in SINGLE else "multi"]
        row.update(speed_summary(times, T), **timing_fields(timings[name]), loss=res["loss"], warmup_s=res["warmup_s"],
                   state_gb=state[name] / GiB, step_growth_gb=max(res["growth"]) / GiB,
                   peak_rss_gb=(state[name] + max(res["growth"])) / GiB, limits=lim,
                   threads=sorted(res["threads"]), interop_threads=torch.get_num_interop_threads(),
                   **cpu_limit_fraction(lim, statistics.median(times)))
        out.append(row)
    _free(built, inputs)
    return out


def _probe(args, ckpt, rank, world, threads, name, T):
    """One real step of `name` at T; a watchdog stops the process when its RSS high-water mark
    (VmHWM: it also holds spikes between two looks) passes the budget."""
    budget = args.budget_gb * GiB

    def watch():
        while True:
            if peak_rss_bytes() > budget:
                os._exit(OVER_BUDGET)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    c = build_contender(name, ckpt, args.dtype, world, **contender_options(args))
    dt, loss, _, _ = _run_step(c, c.prepare(make_batch(args.vocab, T)), rank)
    return [{"impl": name, "seq_len": T, "rank": rank, "peak_rss_gb": peak_rss_bytes() / GiB, "step_s": dt,
             "loss": loss}]


def _worker(rank, world, port, threads, args, ckpt, job):
    init_rank(rank, world, port, threads, deepspeed=True)
    if job[0] == "check":
        return _correctness(args, ckpt, rank, world)
    if job[0] == "speed":
        return _speed(args, ckpt, rank, world, threads, job[1])
    return _probe(args, ckpt, rank, world, threads, job[1], job[2])


def run_group(args, ckpt, world, job, timeout=None):
    """Spawn `world` gloo ranks for `job`; returns (every rank's rows, None) or (None, why)."""
    threads = args.threads_per_rank
    # the children start with the policy's threads (torch, OpenMP and MKL read these at start-up)
    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return spawn_group(_worker, world, args=(threads, args, ckpt, job), timeout=timeout,
                       exit_reasons={OVER_BUDGET: "over budget"})


# ------------------------------------------------------------------------------ modes
def max_len_search(args, ckpt, name, log) -> dict:
    world = 1 if name in SINGLE else args.world
    grain = 1024 * world
    probes = []

    def fits(T):
        ranks, err = run_group(args, ckpt, world, ("probe", name, T), timeout=args.probe_timeout)
        peak = max(r[0]["peak_rss_gb"] for r in ranks) if ranks else None
        if peak is not None and peak > args.budget_gb:  # the last spike came after the watchdog's last look
            ranks, err = None, "over budget"
        probes.append({"seq_len": T, "fits": ranks is not None, "peak_rss_gb": peak, "why": err})
        log(f"# max-len {name} T={T}: {'fits' if ranks else err} peak {peak}")
        return ranks is not None, err

    lo, hi, T = 0, None, min(args.max_len_start, args.max_len_cap)
    while hi is None:  # double from the start, the cap the last length probed
        ok, err = fits(T)
        if not ok:
            hi = T
            break
        lo, T = T, min(2 * T, args.max_len_cap) // grain * grain
        if T <= lo:
            break
    if hi is not None and probes[-1]["why"] != "timeout":
        while hi - lo > max(grain, int(lo * args.max_len_resolution)):
            mid = (lo + hi) // 2 // grain * grain
            if mid <= lo:
                break
            ok, err = fits(mid)
            if ok:
                lo = mid
            else:
                hi = mid
                if err == "timeout":
                    break
    return {"impl": name, "processes": world, "budget_gb": args.budget_gb, "max_len": lo, "first_failing": hi,
            "probes": probes}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="8192", help="comma list of sequence lengths (tokens per step)")
    p.add_argument("--world", type=int, default=2, help="processes of the multi-rank contenders")
    p.add_argument("--impls", default=",".join(ALL_IMPLS), help=f"comma list of {', '.join(ALL_IMPLS)}")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="timed steps per contender and length")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help="untimed steps per contender after its first (building) step")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                   help="dtype of the speed and --max-len steps (fp32 master weights under bf16); the report's "
                        "`machine` says whether this CPU has bf16 instructions")
    p.add_argument("--check-len", type=int, default=1024, help="sequence length of the fp32 correctness step")
    p.add_argument("--no-check", action="store_true")
    add_model_args(p)
    add_contender_args(p)
    p.add_argument("--threads-per-rank", type=int, default=1,
                   help="intra-op threads of every process of every contender (one-process contenders too)")
    p.add_argument("--limit-seconds", type=float, default=0.5, help="measuring time of each machine-limit rate")
    p.add_argument("--max-len", action="store_true", help="find each contender's longest T within --budget-gb")
    p.add_argument("--budget-gb", type=float, default=8.0, help="per-rank peak RSS budget of --max-len (GiB)")
    p.add_argument("--max-len-start", type=int, default=8192)
    p.add_argument("--max-len-cap", type=int, default=1 << 20, help="the longest T probed (doubling stops there)")
    p.add_argument("--max-len-resolution", type=float, default=0.125, help="stop bisecting within this fraction")
    p.add_argument("--probe-timeout", type=float, default=900.0, help="seconds per --max-len probe")
    p.add_argument("--out", help="write the rows (JSON) here")
    p.add_argument("--render", nargs="+", metavar="JSON",
                   help="print (and with --out merge) saved reports; runs nothing")
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.impls = args.impls.split(",")
    args.dtype_name, args.dtype = args.dtype, DTYPES[args.dtype]
    bad = [n for n in args.impls if n not in ALL_IMPLS]
    if bad:
        p.error(f"--impls: unknown {', '.join(bad)}; valid: {', '.join(ALL_IMPLS)}")
    if args.threads_per_rank < 1:
        p.error(f"--threads-per-rank: {args.threads_per_rank}; valid: an integer >= 1")
    if args.steps < 1 or args.warmup < 0:
        p.error(f"--steps {args.steps} --warmup {args.warmup}; valid: steps >= 1, warmup >= 0")
    args.max_position = max(args.lengths + [args.check_len, args.max_len_cap if args.max_len else 0])
    if not args.render:
        check_model_args(args)
        args.vocab = base_config(args).vocab_size
    return args


def main(argv=None):
    args = parse(argv)
    if args.render:
        report = render(args.render)
        print_report(report)
        if args.out:
            write_json(args.out, report)
        return
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    report = {"world": args.world, "preset": args.preset, "layers": args.layers, "cores": os.cpu_count(),
              "model": model_source(args), "dtype": args.dtype_name, "thread_policy": thread_policy(args),
              "machine": machine_facts(),
              "command": "python benchmarks/bench_peers.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "hf")
        report["model_config"] = write_checkpoint(args, ckpt, args.max_position).to_dict()
        if args.max_len:
            report["max_len"] = [max_len_search(args, ckpt, name, log) for name in args.impls]
        else:
            if not args.no_check:
                ranks, err = run_group(args, ckpt, args.world, ("check",))
                report["correctness"] = ranks[0] if ranks else err
                log(f"correctness (fp32, T={args.check_len}): " + ("done" if ranks else f"failed: {err}"))
            report["speed"] = []
            for T in args.lengths:  # a fresh group per length (see peer_contenders.build_order)
                ranks, err = run_group(args, ckpt, args.world, ("speed", T))
                if ranks is None:
                    sys.exit(f"speed run at T={T} failed: {err}")
                report["speed"] += merge_speed(ranks)
                log(speed_table([r for r in report["speed"] if r["seq_len"] == T]))
    print_report(report)
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
