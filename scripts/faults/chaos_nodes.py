"""The chaos soak's node faults (scripts/faults/chaos_soak.py): a run of the two-node
configuration, started on two network namespaces (two_nodes.py) until it ends, through a
partitioned node and a lost node in turn, each at a random step. Each fault must end every
surviving launcher by itself within 3 x parallel.timeout_s with exit 86, a stall line and
STALLED, and leave no process; the finished run is checked against an uninterrupted one as
every soak run is (chaos_checks.check_train)."""
from __future__ import annotations

import random
from pathlib import Path

import chaos_checks
import chaos_kit as kit
import netns
import two_nodes

PORT = 29700  # in each start's own namespaces: never taken by anything else


def node_run(cfg: kit.TrainConfig, ref: dict, work: Path, index: int, run_dir: Path, logs: Path, faults: int,
             rng: random.Random, row) -> dict:
    """One run of `cfg` (launcher "two nodes") through `faults` node faults; `row(kind, when, exits,
    detail)` records a fault as the soak's table does."""
    out = run_dir / "run"
    env = two_nodes.launcher_env(kit.PY, work / "ext")
    problems, starts, landed, exits = [], 0, 0, None
    while True:
        kind = two_nodes.NODE_FAULTS[landed % 2] if landed < faults else None
        first = kit.newest_step(out) + 1
        start_logs = logs / f"start{starts:02d}"
        start_logs.mkdir()
        with netns.TwoNodes(f"lcs{index % 100}") as nodes:
            job = two_nodes.TwoNodeJob(nodes, cfg.args(out, work)[1:], start_logs, env, PORT)
            starts += 1
            try:
                if kind is None or first > kit.STEPS - 1:
                    exits = job.wait(900)
                    if None in exits:
                        problems.append(f"a start without a fault did not end: exits {exits}")
                else:
                    target = rng.randint(first, kit.STEPS - 1)
                    if not job.wait_for_step(out, target):
                        exits = job.wait(900)
                        row(kind, "missed", exits, "the start ended first (not counted)")
                    else:
                        result = job.fault(kind, kit.STALL_TIMEOUT_S)
                        exits = result["exits"]
                        said = two_nodes.problems(kind, result, out, kit.STALL_TIMEOUT_S)
                        problems += [f"{kind} (after step {target}): {p}" for p in said]
                        row(kind, f"after step {target}", exits, f"ended {result['ended_after_s']} s later")
                        landed += 1
            finally:
                job.kill_all()
        if exits == [0, 0] and two_nodes.logged_step(out) == kit.STEPS:
            break
        if starts > 4 * faults + 10:
            problems.append(f"gave up after {starts} starts")
            break
    verdict = chaos_checks.check_train(out, ref, 0 if exits == [0, 0] else 1)
    return {"kind": "train", "config": cfg.name, "faults": landed, "starts": starts,
            "problems": problems + verdict.problems, "max_loss_diff": verdict.max_loss_diff,
            "max_weight_diff": verdict.max_weight_diff}


def unavailable_reason() -> str | None:
    return netns.unavailable()
