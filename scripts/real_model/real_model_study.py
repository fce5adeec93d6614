"""The real-model study of issue 53: one model, its zero-shot RoPE scalings and trained models,
retrieval on a depth x length grid and RULER tasks at 8k-128k, perplexity with fixed targets, and
every comparison a paired difference with a 95% bootstrap interval.

    python scripts/real_model/real_model_study.py --model models/smollm2-135m-instruct --out eval/study \\
        --ppl-data data/longtext/heldout.jsonl --report docs/results/real-model.md
    python scripts/real_model/real_model_study.py ... --variants yarn16,dynamic --phases tasks \\
        --tasks niah_single_1,niah_single_2 --lengths 128k,64k --dtype bf16 --deadline-s 420
    python scripts/real_model/real_model_study.py ... --trained trained=runs/64k --trained control=runs/8k
    python scripts/real_model/real_model_study.py ... --report-only

Phases, each resumable cell by cell:
- grid: the retrieval task the model solves at its native length (`--grid-task`, niah_single_1)
  at `--depths` x `--grid-lengths`, `--grid-samples` per (depth, length): one `longctx eval`
  into OUT/VARIANT/grid;
- tasks: `--tasks` at `--lengths`, `--samples` per (task, length): OUT/VARIANT/tasks;
- ppl: longctx/eval/ppl_targets.py in this process: the same `--ppl-target` tokens at
  `--ppl-positions` ends of every held-out document of >= the longest `--ppl-lengths`, scored
  with each window length; `prose` documents and the rest (code) apart. One JSON per (variant,
  group, length) under OUT/VARIANT/ppl/.

Every variant's evaluation uses `--seed`, so the samples (prompts, needles, depths) are the same
for every variant: comparisons are paired (longctx/eval/paired.py: one standard error and a
10,000-resample paired bootstrap everywhere). A (variant, phase, length) whose cells are all
finished is not started again: rerunning the same command computes nothing already done, and an
interrupted one continues. `--deadline-s` stops the study at a wall-time budget (SIGTERM: the
evaluation in flight finishes its batch and writes its finished cells), then writes the report.
The report (markdown, `.json` beside it, one `-grid-VARIANT.png` heatmap per variant and one
`-grid-diff-VARIANT.png` of its paired difference from the reference) is rewritten from every
finished cell after each evaluation.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings, however it is loaded
import study_report  # noqa: E402  (scripts/real_model/study_report.py)
from zero_shot_table import finished_cells, flow, kfmt  # noqa: E402

from longctx.base.errors import UserError  # noqa: E402
from longctx.storage import atomic  # noqa: E402

# name -> (label, rope_parameters override or None, raise max_position_embeddings)
ZERO_SHOT = {
    "shipped": ("as shipped (plain RoPE)", None, True),
    "yarn4": ("YaRN x4", {"rope_type": "yarn", "factor": 4.0}, True),
    "yarn8": ("YaRN x8", {"rope_type": "yarn", "factor": 8.0}, True),
    "yarn16": ("YaRN x16", {"rope_type": "yarn", "factor": 16.0}, True),
    "dynamic": ("dynamic NTK (factor 4)", {"rope_type": "dynamic", "factor": 4.0}, False),
}
GRID_TASK = "niah_single_1"
TASKS = "niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,vt"
DEPTHS = ",".join(f"{d / 10:g}" for d in range(11))


def parse_length(text: str) -> int:
    text = text.strip().lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def lengths_of(text: str) -> list[int]:
    return [parse_length(x) for x in text.split(",") if x.strip()]


def variants_of(args) -> dict:
    """{name: {"label", "model", "overrides" (model_overrides key=value list), "trained"}} in run order."""
    out = {}
    trained = dict(args.trained)
    for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if name in trained:
            out[name] = {"label": f"trained: {name}", "model": trained[name], "overrides": [], "trained": True}
            continue
        if name not in ZERO_SHOT:
            raise UserError(f"--variants: unknown {name!r}; valid: {', '.join(ZERO_SHOT)} or a --trained NAME")
        label, rope, raise_max = ZERO_SHOT[name]
        overrides = [f"model_overrides.max_position_embeddings={args.max_positions}"] if raise_max else []
        if rope is not None:
            overrides.append(f"model_overrides.rope_parameters={flow(rope)}")
        out[name] = {"label": label, "model": args.model, "overrides": overrides, "rope": rope,
                     "max_positions": args.max_positions if raise_max else None, "trained": False}
    return out


class Clock:
    """The study's wall-time budget (`--deadline-s`), None for none."""

    def __init__(self, budget):
        self.end = time.monotonic() + budget if budget else None

    def left(self):
        return None if self.end is None else self.end - time.monotonic()

    def expired(self) -> bool:
        return self.end is not None and self.left() <= 0


def eval_command(args, v: dict, out: Path, phase: str, length: int) -> list[str]:
    cmd = [sys.executable, "-m", "longctx", "eval", "--model", v["model"], "--out", str(out),
           "--dtype", args.dtype, "--seed", str(args.seed), "--lengths", str(length), "--no-progress",
           *v["overrides"]]
    if phase == "grid":
        cmd += ["--tasks", args.grid_task, "--depths", args.depths, "--samples", str(args.grid_samples)]
    else:
        cmd += ["--tasks", args.tasks, "--samples", str(args.samples)]
    return cmd + args.eval_args


def expected(args, phase: str) -> dict:
    """{task: samples per finished cell} of a phase."""
    if phase == "grid":
        return {args.grid_task: args.grid_samples * len(args.depths.split(","))}
    return {t.strip(): args.samples for t in args.tasks.split(",") if t.strip()}


def marker(args, name: str, phase: str) -> Path:
    """OUT/VARIANT/PHASE.finished.json: the commands that ran to the end (exit 0, not stopped), so a
    rerun skips them even where a task was skipped at a length (too short for its prompt)."""
    return args.out / name / f"{phase}.finished.json"


def command_key(cmd: list[str]) -> str:
    return hashlib.sha256(json.dumps(cmd[1:]).encode()).hexdigest()[:16]


def cell_done(args, name: str, phase: str, length: int, cmd: list[str]) -> bool:
    m = marker(args, name, phase)
    if m.is_file() and command_key(cmd) in json.loads(m.read_text()):
        return True
    want = expected(args, phase)
    have = {doc["task"]: len(doc.get("records", [])) for doc in finished_cells([args.out], name, phase)
            if int(doc["length"]) == length}
    return all(have.get(t) == n for t, n in want.items())


def run_eval(cmd: list[str], log: Path, clock: Clock, grace: float) -> int:
    """Run one longctx eval with its output in `log`; SIGTERM at the deadline, SIGKILL `grace` s later."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd[1:]) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=clock.left())
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return proc.returncode


# ---- perplexity with fixed targets (in this process)

def ppl_groups(path: str) -> dict:
    """{"code": [texts], "prose": [texts]} from a .jsonl of {"text", "kind"} (kind `prose` apart;
    rows without a kind count as code)."""
    groups: dict = {"code": [], "prose": []}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            groups["prose" if row.get("kind") == "prose" else "code"].append(row.get("text", ""))
    return groups


def ppl_identity(args, v: dict) -> dict:
    model = Path(v["model"])
    files = sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in model.rglob("*")
                   if p.is_file() and p.suffix in (".json", ".safetensors", ".bin", ".pt")) if model.is_dir() else []
    return {"model": str(model.resolve()), "files": files, "overrides": v["overrides"], "dtype": args.dtype,
            "data": hashlib.sha256(Path(args.ppl_data).read_bytes()).hexdigest(), "target": args.ppl_target,
            "positions": args.ppl_positions, "max_length": max(lengths_of(args.ppl_lengths))}


def ppl_path(args, name: str, group: str, length: int) -> Path:
    return args.out / name / "ppl" / f"{group}-upto{kfmt(max(lengths_of(args.ppl_lengths)))}" / f"{length}.json"


def run_ppl(args, name: str, v: dict, clock: Clock) -> None:
    ident = ppl_identity(args, v)
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    lengths = lengths_of(args.ppl_lengths)
    groups = ppl_groups(args.ppl_data)
    todo = [(g, n) for g in groups for n in lengths
            if not (ppl_path(args, name, g, n).is_file()
                    and json.loads(ppl_path(args, name, g, n).read_text()).get("key") == key)]
    if not todo:
        return
    import torch

    from longctx.eval.model_io import load_model, load_tokenizer_for, parse_dtype
    from longctx.eval.model_overrides import apply_overrides, base_model_config
    from longctx.eval.ppl_targets import perplexity, plan_targets, score_windows
    overrides = {}
    if v.get("max_positions"):
        overrides["max_position_embeddings"] = v["max_positions"]
    if v.get("rope"):
        overrides["rope_parameters"] = dict(v["rope"])
    config, _ = apply_overrides(base_model_config(Path(v["model"])), overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(Path(v["model"]), parse_dtype(args.dtype), config).to(device).eval()
    tok = load_tokenizer_for(Path(v["model"]), args.tokenizer)
    encoded = {g: [tok.encode(t, add_bos=False) for t in texts] for g, texts in groups.items()}
    for group, length in todo:
        if clock.expired():
            return
        docs = encoded[group]
        spans = plan_targets(docs, max(lengths), args.ppl_positions)
        rows = score_windows(model, tok, docs, spans, length, args.ppl_target) if spans else []
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        atomic.write_json(ppl_path(args, name, group, length),
                          {"key": key, "identity": ident, "group": group, "length": length, "dtype": dtype,
                           "device": device.type, "documents": len({r["doc"] for r in rows}), "windows": rows,
                           "ppl": perplexity(rows) if rows else None})
        print(f"[{name} ppl {group} {kfmt(length)}] " + (f"{perplexity(rows):.3f} over {len(rows)} windows"
                                                        if rows else "no document is long enough"), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the base model (a Hugging Face directory)")
    p.add_argument("--trained", action="append", default=[], metavar="NAME=DIR",
                   help="a trained model (run or HF directory) evaluated as it is, as variant NAME (repeatable)")
    p.add_argument("--out", type=Path, default=Path("eval/study"))
    p.add_argument("--report", type=Path, default=None, help="the markdown report (default OUT/report.md); "
                   "its .json and PNG heatmaps go beside it")
    p.add_argument("--variants", default=",".join(ZERO_SHOT), help=f"in run order: {', '.join(ZERO_SHOT)} "
                   "or a --trained NAME")
    p.add_argument("--reference", default="shipped", help="the variant every other is compared with")
    p.add_argument("--compare", action="append", default=[], metavar="B:A",
                   help="one more paired comparison, B minus A (repeatable; e.g. trained:control)")
    p.add_argument("--phases", default="grid,tasks,ppl", help="grid, tasks, ppl (in this order per length)")
    p.add_argument("--lengths", default="8k,16k,32k,64k,128k", help="task lengths, in run order")
    p.add_argument("--grid-lengths", default=None, help="grid lengths (default --lengths)")
    p.add_argument("--grid-task", default=GRID_TASK)
    p.add_argument("--depths", default=DEPTHS)
    p.add_argument("--grid-samples", type=int, default=10, help="samples per (depth, length)")
    p.add_argument("--tasks", default=TASKS)
    p.add_argument("--samples", type=int, default=50, help="samples per (task, length)")
    p.add_argument("--ppl-data", help="held-out documents (.jsonl with text and kind)")
    p.add_argument("--ppl-lengths", default="2k,4k", help="window lengths; targets from documents of >= the longest")
    p.add_argument("--ppl-target", type=int, default=1024, help="target tokens at the end of each window")
    p.add_argument("--ppl-positions", type=int, default=8, help="target spans per document")
    p.add_argument("--tokenizer", default=None, help="tokenizer for ppl (default: the model's)")
    p.add_argument("--max-positions", type=int, default=131072, help="max_position_embeddings of the raised variants")
    p.add_argument("--dtype", default="fp32", help="fp32 | bf16 (the GPU scripts pass bf16); one OUT holds one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--deadline-s", type=float, default=None, help="wall-time budget of the study")
    p.add_argument("--grace-s", type=float, default=30.0, help="after SIGTERM at the deadline, before SIGKILL")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("eval_args", nargs="*", help="after --: options passed to every longctx eval")
    args = p.parse_args(argv)
    try:
        args.trained = [t.split("=", 1) for t in args.trained]
        if any(len(t) != 2 for t in args.trained):
            raise UserError("--trained: give NAME=DIR")
        variants = variants_of(args)
        phases = [x.strip() for x in args.phases.split(",") if x.strip()]
        if any(x not in ("grid", "tasks", "ppl") for x in phases):
            raise UserError(f"--phases: {args.phases!r}; valid: grid, tasks, ppl")
        if not Path(args.model).is_dir():
            raise UserError(f"--model: {args.model} is not a directory (scripts/real_model/smollm2.py makes one)")
        if "ppl" in phases and not args.report_only and not (args.ppl_data and Path(args.ppl_data).is_file()):
            raise UserError("--ppl-data: a .jsonl file is needed for the ppl phase "
                            "(scripts/real_model/long_text.py makes one)")
        return run(args, variants, phases)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args, variants: dict, phases: list) -> int:
    clock = Clock(args.deadline_s)
    report = args.report or args.out / "report.md"
    rc = 0
    if not args.report_only:
        grid_lengths = lengths_of(args.grid_lengths or args.lengths)
        steps = [(n, name, phase) for n in lengths_of(args.lengths) for name in variants
                 for phase in ("grid", "tasks") if phase in phases and (phase != "grid" or n in grid_lengths)]
        steps += [(n, name, "grid") for n in grid_lengths if n not in lengths_of(args.lengths)
                  for name in variants if "grid" in phases]
        for length, name, phase in steps:
            cmd = eval_command(args, variants[name], args.out / name / phase, phase, length)
            if cell_done(args, name, phase, length, cmd):
                print(f"[{name} {phase} {kfmt(length)}] done before", flush=True)
                continue
            if clock.expired():
                print(f"[{name} {phase} {kfmt(length)}] not started: the deadline passed", flush=True)
                rc = rc or 3
                continue
            print(f"[{name} {phase} {kfmt(length)}] " + " ".join(cmd[1:]), flush=True)
            code = run_eval(cmd, args.out / "logs" / f"{name}-{phase}.log", clock, args.grace_s)
            print(f"[{name} {phase} {kfmt(length)}] longctx eval exited {code}", flush=True)
            if code == 0 and not clock.expired():
                m = marker(args, name, phase)
                done = json.loads(m.read_text()) if m.is_file() else {}
                atomic.write_json(m, {**done, command_key(cmd): " ".join(cmd[2:])})
            elif not clock.expired():
                rc = code
            study_report.write(args, variants, report)
        if "ppl" in phases:
            for name, v in variants.items():
                run_ppl(args, name, v, clock)
    print(study_report.write(args, variants, report), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
