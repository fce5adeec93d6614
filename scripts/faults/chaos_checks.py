"""The checks of a finished chaos-soak run against an uninterrupted one: a training run's exit,
metrics, losses, final weights and leftovers; an evaluation's files, byte for byte."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import chaos_kit as kit


@dataclass
class Verdict:
    problems: list = field(default_factory=list)
    max_loss_diff: float = 0.0
    max_weight_diff: float = 0.0


def leftovers(out: Path) -> list[str]:
    """Temporaries, locks and markers a finished run must not leave."""
    bad = [p for p in out.parent.rglob("*") if (p.name.startswith(".") and (".tmp" in p.name or
           p.name.endswith(".lock"))) or p.name.endswith(".lock") or p.name in ("PREEMPTED", "NONFINITE", "STALLED")]
    return sorted(str(p.relative_to(out.parent)) for p in bad)


def strict_metrics(out: Path) -> list[dict]:
    def reject(token):
        raise ValueError(f"non-strict JSON token {token}")
    return [json.loads(ln, parse_constant=reject) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out: Path) -> dict:
    import longctx  # torch: only for the checks
    model = longctx.load_pretrained(str(out / "checkpoints" / f"step_{kit.STEPS:07d}"))
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def check_train(out: Path, ref: dict, last_rc: Optional[int]) -> Verdict:
    v = Verdict()
    if last_rc != 0:
        v.problems.append(f"last start exited {last_rc}")
        return v
    try:
        records = strict_metrics(out)
    except (OSError, ValueError) as e:
        v.problems.append(f"metrics.jsonl: {e}")
        return v
    steps = [r["step"] for r in records]
    if steps != list(range(1, kit.STEPS + 1)):
        v.problems.append(f"metrics.jsonl steps {steps}, expected 1-{kit.STEPS} once each")
    losses = {r["step"]: r["loss"] for r in records}
    diffs = [abs(losses[s] - ref["losses"][s - 1]) for s in losses if 1 <= s <= kit.STEPS]
    v.max_loss_diff = max(diffs, default=float("inf"))
    if v.max_loss_diff > 1e-6:
        v.problems.append(f"loss differs from the uninterrupted run by {v.max_loss_diff:.2e}")
    got = final_weights(out)
    v.max_weight_diff = max(float((got[k] - ref["weights"][k]).abs().max()) for k in ref["weights"])
    if v.max_weight_diff > 1e-6:
        v.problems.append(f"final weights differ by {v.max_weight_diff:.2e}")
    left = leftovers(out)
    if left:
        v.problems.append(f"left behind: {', '.join(left[:5])}")
    return v


def digests(directory: Path) -> dict:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _cell(path: Path) -> Optional[str]:
    if not path.exists():
        return None
    cell = json.loads(path.read_text())
    cell.pop("seconds", None)
    return json.dumps(cell, sort_keys=True)


def check_eval(out: Path, ref_out: Path, last_rc: Optional[int]) -> Verdict:
    v = Verdict()
    if last_rc != 0:
        v.problems.append(f"last start exited {last_rc}")
        return v
    if not (out / "results.json").exists() or \
            (out / "results.json").read_bytes() != (ref_out / "results.json").read_bytes():
        v.problems.append("results.json differs from the uninterrupted evaluation's")
    got, want = digests(out), digests(ref_out)
    for name in [k for k in set(got) | set(want) if k.startswith("cells/")]:  # a cell records its own seconds
        got[name], want[name] = (_cell(out / name), _cell(ref_out / name))
    got.pop("timing.json", None)
    want.pop("timing.json", None)
    differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k) and not k.startswith("."))
    if differ:
        v.problems.append(f"files differ from the uninterrupted evaluation's: {', '.join(differ[:5])}")
    left = [k for k in got if k.split("/")[-1].startswith(".") or k.endswith(".lock") or k.endswith("PREEMPTED")]
    if left:
        v.problems.append(f"left behind: {', '.join(left[:5])}")
    return v
