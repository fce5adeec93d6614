"""Host memory over a long run: each rank's resident set (RSS) of the demo's extension job.

The job is `longctx demo`'s extension config (runs/demo/configs/extend.yaml: the demo model at
1024 tokens, micro-batch 4 of packed synthetic documents, cp 2, ZeRO-3, validation with the
retrieval probe, checkpoints with HF exports) with `--steps` steps, started from a base model of
the demo's shape with random weights (memory does not depend on what the weights learned). The
job runs under torchrun as `longctx demo` runs it (2 processes of 1 thread); this script samples
each rank's RSS (VmRSS, not the peak) every `--every-s` seconds beside the step the run is at
(metrics.jsonl, one line a step). Reported per rank: the median RSS over the `--window` steps
before each of `--marks`, and the change from the first mark to the last; `flat` holds when
every rank changes by at most `--tolerance` (5%).

    python benchmarks/bench_host_memory.py --steps 2000 --marks 200,2000 --out docs/results/host_memory.json

`--env KEY=VALUE` sets the job's environment (e.g. MALLOC_ARENA_MAX=8, to compare with what
longctx sets by itself).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from benchlib.report import markdown_table, write_json


def base_model(demo, hf_dir: Path, tokenizer) -> None:
    """A model of the demo's base shape with random weights, saved as its base export."""
    from longctx import save_pretrained
    from longctx.model.config import get_preset
    from longctx.model.llama import build_model

    config = get_preset("debug-tiny", **demo.model_overrides(tokenizer), rope_parameters=demo.base_rope(),
                        max_position_embeddings=demo.train_len)
    save_pretrained(build_model(config, seed=0), hf_dir)


def job_config(work: Path, steps: int) -> Path:
    """The demo's extension config with `steps` steps and a metrics line every step."""
    from longctx.data.tokenizer import load_tokenizer
    from longctx.demo import jobs
    from longctx.demo.config import FULL
    from longctx.train.cpu_dtype import auto_dtype

    demo = dataclasses.replace(FULL, dtype=auto_dtype()[0])  # as `longctx demo` picks it on this CPU
    tokenizer = load_tokenizer("byte")
    base_model(demo, work / "base" / "hf", tokenizer)
    cfg = jobs.extend_config(demo, work / "extend", work / "base" / "hf", 0, demo.scaled_rope(), tokenizer)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps),
                              log=dataclasses.replace(cfg.log, every=1, progress=False))
    return jobs.write_config(cfg, work / "configs" / "extend.yaml")


def steps_done(metrics: Path) -> int:
    try:
        with open(metrics, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def rank_processes(launcher: psutil.Process) -> dict[int, psutil.Process]:
    """{rank: process} of torchrun's workers (their environment names the rank)."""
    found = {}
    for child in launcher.children(recursive=True):
        try:
            rank = child.environ().get("RANK")
        except (psutil.Error, OSError):
            continue
        if rank is not None and "longctx" in " ".join(child.cmdline()):
            found[int(rank)] = child
    return found


def run_job(config: Path, work: Path, every_s: float, env_extra: dict, report=None) -> list[dict]:
    """Run the job; [{time_s, step, rss: {rank: bytes}}] sampled while it runs. `report(samples)`:
    called every minute with the samples so far (a long run's partial result)."""
    from longctx.demo.jobs import _env, train_command

    env = {**_env(1), **env_extra}
    log = open(work / "train.log", "w")
    proc = subprocess.Popen(train_command(config, 2), stdout=log, stderr=subprocess.STDOUT, env=env)
    launcher, ranks, samples, t0 = psutil.Process(proc.pid), {}, [], time.monotonic()
    reported = t0
    metrics = work / "extend" / "metrics.jsonl"
    try:
        while proc.poll() is None:
            if len(ranks) < 2:
                ranks = rank_processes(launcher)
            rss = {}
            for rank, p in ranks.items():
                try:
                    rss[rank] = p.memory_info().rss
                except psutil.Error:
                    pass
            if rss:
                samples.append({"time_s": round(time.monotonic() - t0, 1), "step": steps_done(metrics), "rss": rss})
            if report is not None and time.monotonic() - reported >= 60:
                reported = time.monotonic()
                report(samples)
            time.sleep(every_s)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        log.close()
    if proc.returncode != 0:
        sys.exit(f"the job exited with {proc.returncode}; see {work / 'train.log'}")
    return samples


def at_marks(samples: list[dict], marks: list[int], window: int) -> dict:
    """{rank: {mark: median RSS over the samples taken in steps (mark - window, mark]}}."""
    ranks = sorted({r for s in samples for r in s["rss"]})
    out = {}
    for rank in ranks:
        out[rank] = {}
        for mark in marks:
            values = [s["rss"][rank] for s in samples if mark - window < s["step"] <= mark and rank in s["rss"]]
            out[rank][mark] = statistics.median(values) if values else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--marks", default="200,2000", help="steps at which RSS is read (the first is the baseline)")
    ap.add_argument("--window", type=int, default=20, help="steps before each mark whose samples are averaged")
    ap.add_argument("--every-s", type=float, default=1.0)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the job's environment")
    ap.add_argument("--work", default=None, help="the job's folder (default: a temporary one, removed)")
    ap.add_argument("--out", default=None, help="JSON file (default: stdout only)")
    args = ap.parse_args()
    marks = [int(m) for m in args.marks.split(",")]
    env_extra = dict(kv.split("=", 1) for kv in args.env)
    t0 = time.time()

    def report(samples: list[dict], done: bool = False) -> None:
        summary(args, marks, env_extra, samples, time.time() - t0, done)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        samples = run_job(job_config(work, args.steps), work, args.every_s, env_extra, report)
    report(samples, done=True)


def summary(args, marks: list[int], env_extra: dict, samples: list[dict], wall: float, done: bool) -> None:
    """The table (when done) and the JSON file (partial while the job runs: `done` false)."""
    table = at_marks(samples, marks, args.window)
    changes = {rank: (v[marks[-1]] / v[marks[0]] - 1) if v[marks[0]] and v[marks[-1]] else None
               for rank, v in table.items()}
    flat = all(c is not None and abs(c) <= args.tolerance for c in changes.values())
    if done:
        gib = 1 << 30
        rows = [[rank, *(f"{v[m] / gib:.3f}" if v[m] else "-" for m in marks),
                 f"{changes[rank]:+.1%}" if changes[rank] is not None else "-"] for rank, v in table.items()]
        print(markdown_table(["rank", *(f"RSS GiB at step {m}" for m in marks), "change"], rows,
                             "r" * (len(marks) + 2)))
        print(f"flat (every rank within {args.tolerance:.0%}): {flat}; {wall:.0f} s")
    if args.out:
        write_json(args.out, {"command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
                              "done": done, "steps": args.steps,
                              "last_step": max((s["step"] for s in samples), default=0), "marks": marks,
                              "window": args.window, "env": env_extra,
                              "rss_bytes": {str(r): {str(m): v for m, v in t.items()} for r, t in table.items()},
                              "change": {str(r): c for r, c in changes.items()}, "tolerance": args.tolerance,
                              "flat": flat, "wall_s": round(wall), "samples": samples})


if __name__ == "__main__":
    main()
