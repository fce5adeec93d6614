"""A chaos soak: drive tiny train and eval runs to their end through N random, seeded faults,
then check each against an uninterrupted run.

    python scripts/faults/chaos_soak.py --faults 100 --seed 1 --out docs/results/chaos.json --md chaos.md
    python scripts/faults/chaos_soak.py --faults 10 --seed 3 --configs 1          # one train configuration

Faults, at random moments (start-up, after a step, while a checkpoint is being written):
SIGKILL of one worker, of the whole job, of the launcher alone (its workers must be gone within
30 s); SIGTERM and SIGUSR1 (preemption); for the two-node configuration (two network namespaces,
root and `ip netns`; skipped with the reason elsewhere) a partitioned node and a lost node in turn
(chaos_nodes.py: both launchers, or the survivor, end within 3 x timeout_s with 86 and STALLED);
with several processes, after a step, a stall: SIGSTOP of
one worker, or one rank's data read held for good (every run has parallel.timeout_s=15; the
start must end by itself with the line naming the rank, STALLED and, under torchrun.sh, exit
86). Between starts: the newest checkpoint truncated or one bit
flipped, a half-written temporary checkpoint, a run lock or a data-cache lock left by a dead pid,
a full disk during a save (each run's directory is a size-limited tmpfs; root only, else not
drawn), a data file edited without data.allow_changed_sources (the start must stop with one
line; the file is then restored). After each fault the same command is started again
(checkpoint.resume=auto) until the run ends. Checks per run: exit 0 at the last step; every
step's loss and the final weights equal to an uninterrupted run's (fp32, <= 1e-6); an
evaluation's files byte-identical to an uninterrupted evaluation's; metrics.jsonl lists steps
1..N once each (strict JSON); no temporaries, locks, markers or processes left. Exit code 0 when
every run passes, 1 otherwise; 2 for bad options.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chaos_checks  # noqa: E402
import chaos_faults  # noqa: E402
import chaos_kit as kit  # noqa: E402
import chaos_nodes  # noqa: E402


class Soak:
    def __init__(self, work: Path, seed: int, configs: list[int], eval_share: float, only: Optional[list] = None):
        self.work, self.rng, self.configs, self.eval_share = work, random.Random(seed), configs, eval_share
        self.only = only  # the train fault kinds drawn (None: all)
        self.refs: dict = {}
        self.rows: list[dict] = []
        self.runs: list[dict] = []
        self.root = os.geteuid() == 0
        kit.write_inputs(work, seed)

    # ----------------------------------------------------------------- references
    def train_ref(self, ci: int) -> dict:
        if ci not in self.refs:
            cfg = kit.TRAIN_CONFIGS[ci]
            out = self.work / "refs" / f"train{ci}" / "run"
            out.parent.mkdir(parents=True)
            start = kit.Start(self.command(cfg, out), out.parent / "log", self.work)
            first = None
            while start.proc.poll() is None:
                if first is None and kit.logged_step(out, start.began):
                    first = time.time() - start.began
                time.sleep(0.05)
            if start.wait() != 0:
                raise SystemExit(f"error: the uninterrupted run of {cfg.name} failed: {start.log}")
            self.refs[ci] = {"losses": [r["loss"] for r in chaos_checks.strict_metrics(out)],
                             "weights": chaos_checks.final_weights(out), "startup_s": first or 5.0}
        return self.refs[ci]

    def eval_ref(self) -> dict:
        if "eval" not in self.refs:
            model = self.work / "model"
            code = ("import sys, longctx; from longctx.model import build_model, get_preset; "
                    "longctx.save_pretrained(build_model(get_preset('debug-tiny'), seed=0), sys.argv[1])")
            subprocess.run([kit.PY, "-c", code, str(model)], check=True, env=kit.env(), capture_output=True)
            out = self.work / "refs" / "eval"
            out.parent.mkdir(parents=True, exist_ok=True)
            began = time.time()
            start = kit.Start(self.eval_command(out), self.work / "refs" / "eval.log", self.work)
            if start.wait() != 0:
                raise SystemExit(f"error: the uninterrupted evaluation failed: {start.log}")
            self.refs["eval"] = {"out": out, "seconds": time.time() - began}
        return self.refs["eval"]

    def command(self, cfg: kit.TrainConfig, out: Path) -> list[str]:
        args = cfg.args(out, self.work)
        if cfg.launcher in ("torchrun.sh", "two nodes"):  # two nodes: its uninterrupted run on one
            return [str(kit.ROOT / "launch" / "torchrun.sh"), "--nproc-per-node", str(cfg.nproc), "--", *args]
        return [kit.PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(cfg.nproc),
                "-m", "longctx", *args]

    def eval_command(self, out: Path) -> list[str]:
        return [kit.PY, "-m", "longctx", "eval", "--model", str(self.work / "model"), "--out", str(out),
                *kit.EVAL_ARGS]

    # -------------------------------------------------------------------- a run
    def run(self, faults: int) -> int:
        """One run to its end through up to `faults` faults; returns how many landed."""
        index = len(self.runs)
        run_dir = self.work / "runs" / f"{index:03d}"
        logs = self.work / "runs" / f"{index:03d}-logs"
        run_dir.mkdir(parents=True)
        logs.mkdir()
        mounted = self.root and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={chaos_faults.TMPFS_SIZE}",
                                                "tmpfs", str(run_dir)], capture_output=True).returncode == 0
        began = time.time()
        try:
            if self.rng.random() < self.eval_share:
                record = self.eval_run(index, run_dir, logs, faults)
            else:
                record = self.train_run(index, run_dir, logs, faults, mounted)
            left = kit.leftover_processes(str(run_dir))
            if left:
                record["problems"].append(f"processes left running: {', '.join(left)}")
        finally:
            if mounted:
                subprocess.run(["umount", "-l", str(run_dir)], capture_output=True)
        record.update(index=index, seconds=round(time.time() - began, 1), ok=not record["problems"])
        self.runs.append(record)
        mark = "ok" if record["ok"] else "FAILED: " + "; ".join(record["problems"])
        print(f"run {index} ({record['config']}): {record['faults']} faults, {record['starts']} starts, "
              f"{record['seconds']} s: {mark}", flush=True)
        return record["faults"]

    def row(self, index: int, config: str, kind: str, when: str, rc, detail: str = "") -> dict:
        row = {"run": index, "config": config, "kind": kind, "when": when, "exit": rc, "detail": detail,
               "next_exit": None, "next_said": ""}
        self.rows.append(row)
        return row

    def train_run(self, index: int, run_dir: Path, logs: Path, faults: int, mounted: bool) -> dict:
        ci = self.rng.choice(self.configs)
        cfg, ref = kit.TRAIN_CONFIGS[ci], self.train_ref(ci)
        if cfg.launcher == "two nodes":
            return chaos_nodes.node_run(cfg, ref, self.work, index, run_dir, logs, faults, self.rng,
                                        lambda kind, when, exits, detail: self.row(index, cfg.name, kind, when,
                                                                                    exits[0], detail))
        out = run_dir / "run"
        kinds = (chaos_faults.DURING * 3 + list(chaos_faults.EDITS) + [chaos_faults.EDITED_DATA] * cfg.data_file
                 + [chaos_faults.FULL_DISK] * mounted + list(chaos_faults.STALLS) * (cfg.nproc > 1))
        if not cfg.cache:
            kinds.remove("stale cache lock")
        if self.only:
            kinds = [k for k in kinds if k in self.only]
            if not kinds:  # e.g. only stalls, for one process
                return {"kind": "train", "config": cfg.name, "faults": 0, "starts": 0, "max_loss_diff": 0.0,
                        "max_weight_diff": 0.0, "problems": [f"none of --kinds fits {cfg.name}"]}
        problems, waiting, starts, landed, rc = [], [], 0, 0, None
        while True:
            kind = self.rng.choice(kinds) if landed < faults else None
            if kind in chaos_faults.EDITS:
                detail = chaos_faults.EDITS[kind](out, self.rng)
                if detail is not None:
                    waiting.append(self.row(index, cfg.name, kind, "between starts", None, detail))
                    landed += 1
                continue
            if kind in (chaos_faults.EDITED_DATA, chaos_faults.FULL_DISK) and kit.newest_step(out) == 0:
                continue  # needs a checkpoint: an edit before one is just other data, a save needs a size
            left = kit.STEPS - kit.newest_step(out)  # steps this start trains
            if kind in chaos_faults.STALLS and left < 2:
                continue  # a stall comes after this start's first step (before it: the start-up limit)
            # (rank, batch) held: after the start's first step (one batch per step)
            hold = (self.rng.randrange(cfg.nproc), self.rng.randint(1, left - 1)) if kind == chaos_faults.HELD_READ \
                else None
            start = kit.Start(self.command(cfg, out), logs / f"start{starts:02d}.log", self.work,
                              chaos_faults.held_read_env(self.work, *hold) if hold else None)
            starts += 1
            if kind is None:
                rc, row = start.wait(), None
            else:
                if kind in chaos_faults.STALLS:
                    rc, when, detail = chaos_faults.stall(start, out, kind, hold, cfg.launcher, self.rng, problems)
                elif kind == chaos_faults.EDITED_DATA:
                    rc, when, detail = chaos_faults.edited_data(start, self.work, problems)
                elif kind == chaos_faults.FULL_DISK:
                    rc, when, detail = chaos_faults.full_disk(start, run_dir, out, self.work, problems)
                else:
                    rc, when, detail = chaos_faults.during(start, out, kind, cfg, self.rng, ref["startup_s"], problems)
                row = self.row(index, cfg.name, kind, when, rc, detail)
            for w in waiting:
                w.update(next_exit=rc, next_said=start.said())
            waiting = [row] if row is not None else []
            if row is not None and row["when"] != "missed":
                landed += 1
            if rc == 0 and kit.logged_step(out, 0) == kit.STEPS:
                break
            if starts > 4 * faults + 10:
                problems.append(f"gave up after {starts} starts")
                break
        verdict = chaos_checks.check_train(out, ref, rc)
        return {"kind": "train", "config": cfg.name, "faults": landed, "starts": starts,
                "problems": problems + verdict.problems, "max_loss_diff": verdict.max_loss_diff,
                "max_weight_diff": verdict.max_weight_diff}

    def eval_run(self, index: int, run_dir: Path, logs: Path, faults: int) -> dict:
        ref = self.eval_ref()
        out = run_dir / "eval"
        problems, waiting, starts, landed, rc = [], [], 0, 0, None
        while True:
            kind = self.rng.choice(chaos_faults.EVAL_FAULTS) if landed < faults else None
            start = kit.Start(self.eval_command(out), logs / f"start{starts:02d}.log", self.work)
            starts += 1
            row = None
            if kind is not None:
                time.sleep(self.rng.uniform(0.3, ref["seconds"]))
                cells = len(list((out / "cells").glob("*"))) if (out / "cells").is_dir() else 0
                if start.proc.poll() is None:
                    start.proc.send_signal(getattr(signal, kind))
                    when = f"{time.time() - start.began:.1f} s in, {cells} cell files on disk"
                else:
                    when = "missed"
                rc = start.wait()
                row = self.row(index, "eval, 1 proc", f"eval: {kind}", when, rc)
            else:
                rc = start.wait()
            for w in waiting:
                w.update(next_exit=rc, next_said=start.said())
            waiting = [row] if row is not None else []
            if row is not None and row["when"] != "missed":
                landed += 1
            if rc == 0 and (out / "results.json").exists():  # done: faults left go to the next run
                break
            if starts > 4 * faults + 10:
                problems.append(f"gave up after {starts} starts")
                break
        verdict = chaos_checks.check_eval(out, ref["out"], rc)
        return {"kind": "eval", "config": "eval, 1 proc", "faults": landed, "starts": starts,
                "problems": problems + verdict.problems}


# ----------------------------------------------------------------------- the report
def markdown(soak: Soak, seconds: float, argv: list[str]) -> str:
    rows, runs = [r for r in soak.rows if r["when"] != "missed"], soak.runs
    ok = all(r["ok"] for r in runs)
    by_kind = Counter(r["kind"] for r in rows)
    lines = [f"command: `python scripts/faults/chaos_soak.py {' '.join(argv)}`", "",
             f"{len(rows)} faults over {len(runs)} runs ({sum(r['starts'] for r in runs)} starts), "
             f"wall time {seconds / 60:.1f} min; every run's checks: {'passed' if ok else 'FAILED'}.", "",
             "| fault | count |", "|---|---:|", *[f"| {k} | {n} |" for k, n in sorted(by_kind.items())], "",
             "| run | configuration | faults | starts | seconds | max loss diff | max weight diff | checks |",
             "|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        diffs = (f"{r['max_loss_diff']:.1e} | {r['max_weight_diff']:.1e}" if r["kind"] == "train"
                 else "bytes | identical" if r["ok"] else "- | -")
        lines.append(f"| {r['index']} | {r['config']} | {r['faults']} | {r['starts']} | {r['seconds']} | {diffs} | "
                     f"{'ok' if r['ok'] else '; '.join(r['problems'])} |")
    lines += ["", "| run | fault | when | exit | detail | next start: exit | next start said |",
              "|---:|---|---|---|---|---|---|"]
    for r in rows:
        said = r["next_said"].replace("|", "\\|")
        detail = r["detail"].replace("|", "\\|")
        lines.append(f"| {r['run']} | {r['kind']} | {r['when']} | {'' if r['exit'] is None else r['exit']} | "
                     f"{detail} | {'' if r['next_exit'] is None else r['next_exit']} | {said} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=100, help="faults in all (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default=None,
                   help="train configurations to draw from, comma-separated indices (default: all): " +
                        "; ".join(f"{i}: {c.name}" for i, c in enumerate(kit.TRAIN_CONFIGS)))
    p.add_argument("--eval-share", type=float, default=0.2, help="share of runs that are evaluations (default 0.2)")
    p.add_argument("--faults-per-run", default="3,6", help="MIN,MAX faults of one run (default 3,6)")
    p.add_argument("--kinds", default=None, help="train fault kinds to draw, comma-separated (default: all): " +
                   ", ".join(chaos_faults.TRAIN_KINDS))
    p.add_argument("--work", default=None, help="working directory (default: a new temporary one, removed)")
    p.add_argument("--json", default=None, help="write the rows and runs here")
    p.add_argument("--md", default=None, help="write the tables here (markdown)")
    args = p.parse_args(argv)
    try:
        args.configs = ([int(c) for c in args.configs.split(",")] if args.configs
                        else list(range(len(kit.TRAIN_CONFIGS))))
        lo, hi = (int(x) for x in args.faults_per_run.split(","))
    except ValueError:
        p.exit(2, f"error: --configs / --faults-per-run: expected integers, got {args.configs!r} / "
                  f"{args.faults_per_run!r}\n")
    if args.faults < 1 or not 1 <= lo <= hi or not all(0 <= c < len(kit.TRAIN_CONFIGS) for c in args.configs) \
            or not 0 <= args.eval_share <= 1:
        p.exit(2, f"error: --faults >= 1, 1 <= MIN <= MAX, configs in 0-{len(kit.TRAIN_CONFIGS) - 1} and "
                  "0 <= --eval-share <= 1 are required\n")
    args.per_run = (lo, hi)
    nodes = [i for i in args.configs if kit.TRAIN_CONFIGS[i].launcher == "two nodes"]
    reason = chaos_nodes.unavailable_reason() if nodes else None
    if reason:  # the two-node configuration needs two network namespaces
        print(f"note: configuration {nodes[0]} ({kit.TRAIN_CONFIGS[nodes[0]].name}) skipped: {reason}", flush=True)
        args.configs = [i for i in args.configs if i not in nodes]
        if not args.configs:
            p.exit(0, "note: no configuration left to run\n")
    args.kinds = args.kinds.split(",") if args.kinds else None
    unknown = [k for k in args.kinds or [] if k not in chaos_faults.TRAIN_KINDS]
    if unknown:
        p.exit(2, f"error: --kinds: unknown {', '.join(map(repr, unknown))}; "
                  f"valid: {', '.join(chaos_faults.TRAIN_KINDS)}\n")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="chaos-soak-"))
    began = time.time()
    soak = Soak(work, args.seed, args.configs, args.eval_share, args.kinds)
    done = 0
    try:
        while done < args.faults:
            done += soak.run(min(soak.rng.randint(*args.per_run), args.faults - done))
            if not soak.runs[-1]["ok"] and not soak.runs[-1]["starts"]:
                break  # no fault of --kinds can be drawn here
    finally:
        seconds = time.time() - began
        text = markdown(soak, seconds, argv)
        if args.md:
            Path(args.md).write_text(text)
        if args.json:
            Path(args.json).write_text(json.dumps({"argv": argv, "seconds": round(seconds, 1), "rows": soak.rows,
                                                   "runs": soak.runs}, indent=1) + "\n")
        print(text)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["ok"] for r in soak.runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
